"""The minimum detectable effect of a paired t test, against statsmodels' power solver."""
import math

import pytest

from ctrlsim.metrics.power import minimum_detectable_effect, paired_power


@pytest.mark.parametrize("n", [3, 5, 10, 40])
@pytest.mark.parametrize("power", [0.8, 0.9])
def test_the_mde_is_statsmodels_effect_size_times_the_spread(n, power):
    from statsmodels.stats.power import TTestPower

    d = TTestPower().solve_power(nobs=n, alpha=0.05, power=power, alternative="two-sided")
    assert minimum_detectable_effect(2.5, n, power=power) == pytest.approx(2.5 * d, rel=1e-4)


def test_large_samples_approach_the_normal_formula_and_power_is_monotone():
    assert minimum_detectable_effect(1.0, 10_000) == pytest.approx((1.959964 + 0.841621) / 100, rel=1e-3)
    assert paired_power(0.1, 1.0, 10) < paired_power(0.5, 1.0, 10) < paired_power(1.0, 1.0, 10)


def test_undefined_and_degenerate_spreads():
    assert math.isnan(minimum_detectable_effect(1.0, 1))
    assert math.isnan(minimum_detectable_effect(float("nan"), 5))
    assert minimum_detectable_effect(0.0, 5) == 0.0


def test_a_paired_comparison_carries_its_minimum_detectable_effect():
    import numpy as np

    from ctrlsim.metrics.stats import paired_comparison

    mine, theirs = [3.0, 5.0, 4.0, 6.0, 2.0], [1.0, 2.0, 2.5, 1.0, 2.0]
    spread = float(np.std(np.subtract(mine, theirs), ddof=1))
    assert paired_comparison(mine, theirs).mde == pytest.approx(minimum_detectable_effect(spread, 5))
    assert math.isnan(paired_comparison([1.0], [0.0]).mde)


@pytest.mark.parametrize("n", [3, 8, 40])
def test_the_one_tailed_mde_is_statsmodels_larger_alternative_times_the_spread(n):
    from statsmodels.stats.power import TTestPower

    d = TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="larger")
    assert minimum_detectable_effect(0.3, n, two_sided=False) == pytest.approx(0.3 * d, rel=1e-4)


def test_a_paired_t_test_carries_the_mde_of_its_own_spread_and_tail():
    import numpy as np

    from ctrlsim.metrics.stats import paired_t_test

    after, before = [0.3, 0.5, 0.2, 0.6, 0.4], [0.1, 0.2, 0.2, 0.3, 0.1]
    sd = float(np.std(np.subtract(after, before), ddof=1))
    one = paired_t_test(after, before)
    assert one.mde == pytest.approx(minimum_detectable_effect(sd, 5, two_sided=False))
    two = paired_t_test(after, before, alternative="two-sided")
    assert two.mde == pytest.approx(minimum_detectable_effect(sd, 5)) and two.mde > one.mde
    assert paired_t_test([0.5, 0.5], [0.1, 0.1]).mde == 0.0  # differences without spread
