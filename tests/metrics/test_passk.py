"""pass^k: the unbiased C(c, k) / C(n, k) estimator (tau-bench), averaged over tasks."""
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.passk import pass_hat_k, pass_k_curve


def test_the_estimator_by_hand():
    assert pass_hat_k(3, 5, 1) == pytest.approx(3 / 5)
    assert pass_hat_k(3, 5, 2) == pytest.approx(3 / 10)  # C(3,2)=3 of C(5,2)=10 pairs all succeed
    assert pass_hat_k(3, 5, 3) == pytest.approx(1 / 10)
    assert pass_hat_k(3, 5, 4) == 0.0 and pass_hat_k(5, 5, 5) == 1.0


def test_the_curve_over_tasks_and_its_cliff():
    curve = pass_k_curve({"always": [1, 1, 1], "once": [1, 0, 0], "never": [0, 0, 0]})
    assert curve.values == pytest.approx({1: 4 / 9, 2: 1 / 3, 3: 1 / 3})
    assert curve.cliff == pytest.approx(4 / 9 - 1 / 3)
    assert curve.tasks == 3 and curve.trials == 3
    for k in (1, 2, 3):
        assert 0.0 <= curve.low[k] <= curve.values[k] <= curve.high[k] <= 1.0


def test_a_reliable_method_has_no_cliff_and_a_lucky_one_does():
    reliable = pass_k_curve({t: [True] * 4 for t in "abcd"})
    assert reliable.values == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0} and reliable.cliff == 0.0
    lucky = pass_k_curve({t: [True, False, False, False] for t in "abcd"})
    assert lucky.values[1] == 0.25 and lucky.values[4] == 0.0 and lucky.cliff == 0.25


def test_k_runs_to_the_fewest_tries_and_bad_input_is_named():
    assert pass_k_curve({"a": [1, 1, 0], "b": [1, 1]}).trials == 2
    with pytest.raises(ConfigError, match="at least one task"):
        pass_k_curve({})
    with pytest.raises(ConfigError, match="1 <= k <= n"):
        pass_hat_k(1, 2, 3)
