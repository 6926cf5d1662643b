"""Study 04's pieces that run in one process: configuration, exact update, TensorBoard log, stale gradients."""

import pytest

from study import gradient_study
from study.data import load_mnist


@pytest.mark.parametrize("bad, match", [
    ({"worker_counts": [1, 0]}, "worker_counts: every value must be >= 1"),
    ({"taus": [0, -1]}, "taus: every value must be >= 0"),
    ({"staleness_optimizers": ["sgd", "lamb"]}, "staleness_optimizers: got 'lamb'"),
    ({"staleness_optimizers": ["adagrad"], "staleness_learning_rates": {"sgd": [0.1]}},
     "staleness_learning_rates: no rates for 'adagrad'"),
    ({"ps_steps": 0}, "ps_steps: expected an integer >= 1"),
])
def test_bad_parameters(bad, match):
    with pytest.raises(ValueError, match=match):
        gradient_study.GradientStudyConfig(**bad)


def test_quadratic_writes_tensorboard_scalars_and_is_exact(tmp_path):
    trace = gradient_study.quadratic_with_tensorboard(tmp_path, steps=5)
    assert trace["error"].max() == 0.0
    assert trace["dy_dx"].iloc[0] == pytest.approx(-5.0)  # x0 - b = -2 - 3
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_stale_gradients_hurt_and_tau_zero_is_plain_training():
    data = load_mnist(seed=0)
    fresh = gradient_study.stale_run(data, "sgd", 0.5, tau=0, steps=60, seed=0)
    late = gradient_study.stale_run(data, "sgd", 0.5, tau=16, steps=60, seed=0)
    assert fresh > 0.5 and late < fresh
