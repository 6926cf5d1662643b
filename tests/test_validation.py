"""Parameter checks: one message naming the parameter and what is allowed."""

import pytest

from study.drift.adam_drift import AdamDriftConfig
from study.optimizers import make_optimizer
from study.validation import check_choice, check_int_list, check_positive_int, check_range


def test_messages_name_parameter_and_allowed_values():
    with pytest.raises(ValueError, match=r"^optimizer: got 'adamm'; allowed: .*'adam'"):
        make_optimizer("adamm", 0.1)
    with pytest.raises(ValueError, match=r"^p: expected a number in \[0, 1\]; got 1.5$"):
        check_range("p", 1.5, 0, 1)
    with pytest.raises(ValueError, match=r"^seeds: expected a non-empty list of integers"):
        check_int_list("seeds", [0, "1"])
    with pytest.raises(ValueError, match=r"^steps: expected an integer >= 1; got 0$"):
        check_positive_int("steps", 0)
    assert check_choice("policy", "hold", ["hold"]) == "hold"
    assert check_int_list("seeds", [3, 4]) == [3, 4]


@pytest.mark.parametrize("bad, match", [
    ({"optimizers": ["adam", "adamm"]}, "optimizers: got 'adamm'"),
    ({"optimizers": "adam"}, "optimizers: expected a non-empty list"),
    ({"policies": ["hold", "freeze"]}, "policies: got 'freeze'"),
    ({"steps": -1}, "steps: expected an integer >= 1"),
    ({"seeds": 3}, "seeds: expected a non-empty list of integers"),
    ({"seeds": [True]}, "seeds: expected a non-empty list of integers"),
    ({"learning_rate": 0}, r"learning_rate: expected a number in \(0.0, 10.0\]"),
])
def test_study_config_rejects_bad_parameters(bad, match):
    with pytest.raises(ValueError, match=match):
        AdamDriftConfig(**{"optimizers": ["adam"], **bad})
