"""Downpour SGD on a real local cluster: staleness, accounting, a killed worker, no orphans."""

import numpy as np
import pytest

from study.parameter_server import DownpourConfig, run_downpour

pytestmark = pytest.mark.cluster


def test_one_worker_trains_with_zero_staleness_and_every_step_applied(alive):
    result = run_downpour(DownpourConfig(workers=1, steps=80, steps_per_function=4, eval_every=10), timeout_s=300)
    assert result["applied_updates"] == result["scheduled_steps"] == result["returned_steps"] == 80
    assert set(result["staleness"]) == {0}
    assert result["curve"][-1]["accuracy"] > 0.5  # ten classes: chance is 0.1
    assert not any(alive(pid) for pid in result["pids"])


def test_killing_a_worker_midway_still_finishes_and_accounts_for_every_step(alive):
    result = run_downpour(DownpourConfig(workers=2, steps=120, steps_per_function=4, kill_worker_after=5,
                                         eval_every=10), timeout_s=300)
    assert result["killed_worker_after_function"] == 5
    assert result["returned_steps"] == result["scheduled_steps"] == 120
    assert result["applied_updates"] >= result["scheduled_steps"]  # a retried function may apply twice
    assert np.all(np.asarray(result["staleness"]) >= 0)
    assert not any(alive(pid) for pid in result["pids"])


@pytest.mark.parametrize("bad, match", [
    ({"workers": 0}, "workers: expected an integer >= 1"),
    ({"ps": 0}, "ps: expected an integer >= 1"),
    ({"kill_worker_after": 3}, "kill_worker_after: needs workers >= 2"),
    ({"learning_rate": 0.0}, "learning_rate: expected a number in"),
])
def test_bad_configuration(bad, match):
    with pytest.raises(ValueError, match=match):
        DownpourConfig(**bad)
