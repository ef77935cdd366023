"""Steer-then-release persistence and effort: every expected value is worked out by hand below."""
import math

import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.persistence import (
    HalfLife,
    effort_curve,
    effort_to_threshold,
    half_life,
    initial_slope,
    km_half_life,
    log_rank,
    relapse_share,
    retention_area,
    retention_band,
    retention_curve,
    steered_levels,
)

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile

# ----------------------------------------------------------------------------- one episode


def test_the_issue_example_retention_half_life_relapse_and_area():
    # s0 = (0.1 + 0.1) / 2 = 0.1; s* = mean of the last 3 steering rounds = (0.5 + 0.5 + 0.5) / 3 = 0.5
    baseline, steering, release = [0.1, 0.1], [0.2, 0.5, 0.5, 0.5], [0.4, 0.3, 0.2]
    assert steered_levels(baseline, steering) == pytest.approx((0.1, 0.5))
    curve = retention_curve(baseline, steering, release)
    # R = (0.4 - 0.1) / 0.4, (0.3 - 0.1) / 0.4, (0.2 - 0.1) / 0.4 = 0.75, 0.5, 0.25
    assert curve == pytest.approx([0.75, 0.5, 0.25])
    assert half_life(curve) == (2, True)  # first R <= 0.5 is at tau = 2
    # relapse = 1 - mean of the last 3 R = 1 - (0.75 + 0.5 + 0.25) / 3 = 1 - 0.5 = 0.5
    assert relapse_share(curve) == pytest.approx(0.5)
    # with last_k = 2: 1 - (0.5 + 0.25) / 2 = 0.625
    assert relapse_share(curve, last_k=2) == pytest.approx(0.625)
    # area = (0.75 + 0.5 + 0.25) / 3 = 0.5
    assert retention_area(curve) == pytest.approx(0.5)


def test_a_curve_that_never_halves_is_censored_at_the_release_length():
    # s0 = (0.0 + 0.2 + 0.1) / 3 = 0.1; steering is shorter than last_k = 3: s* = (0.3 + 0.5) / 2 = 0.4
    curve = retention_curve([0.0, 0.2, 0.1], [0.3, 0.5], [0.4, 0.4, 0.37])
    # R = 0.3 / 0.3, 0.3 / 0.3, 0.27 / 0.3 = 1, 1, 0.9
    assert curve == pytest.approx([1.0, 1.0, 0.9])
    assert half_life(curve) == (3, False)
    # area = (1 + 1 + 0.9) / 3 = 0.966..., relapse = 1 - 0.966... = 0.0333...
    assert retention_area(curve) == pytest.approx(2.9 / 3)
    assert relapse_share(curve) == pytest.approx(1 - 2.9 / 3)


def test_overshoot_and_falling_below_baseline_are_kept():
    # s0 = 0.1, s* = 0.5: R = (0.6 - 0.1) / 0.4 = 1.25, (0.0 - 0.1) / 0.4 = -0.25
    curve = retention_curve([0.1], [0.5], [0.6, 0.0])
    assert curve == pytest.approx([1.25, -0.25])
    assert half_life(curve) == (2, True)
    assert retention_area(curve) == pytest.approx(0.5)  # (1.25 - 0.25) / 2


def test_a_round_at_exactly_half_is_an_event_despite_binary_rounding():
    # (0.4 - 0.1) / (0.7 - 0.1) is 0.5 exactly in decimals, 0.5000000000000001 in floats
    curve = retention_curve([0.1], [0.7], [0.4])
    assert curve[0] > 0.5
    assert half_life(curve) == (1, True)


def test_no_retention_when_steering_did_not_move_the_box():
    # s* - s0 = 0.24 - 0.2 = 0.04 <= the default minimum 0.05: no curve
    assert retention_curve([0.2, 0.2], [0.24, 0.24, 0.24], [0.22]) is None
    # a smaller stated minimum accepts it: R = (0.22 - 0.2) / 0.04 = 0.5
    assert retention_curve([0.2, 0.2], [0.24, 0.24, 0.24], [0.22], min_gain=0.03) == pytest.approx([0.5])
    # the gain must exceed the minimum (0.5 - 0.25 = 0.25 is not > 0.25; exact in binary)
    assert retention_curve([0.25], [0.5], [0.3], min_gain=0.25) is None
    # steering that lowered the share is no gain either
    assert retention_curve([0.5], [0.1], [0.3]) is None


def test_only_the_last_k_steering_rounds_set_the_steered_level():
    # last_k = 1: s* = 0.9 (the last round), s0 = 0.1: R = (0.5 - 0.1) / 0.8 = 0.5
    assert retention_curve([0.1], [0.0, 0.0, 0.9], [0.5], last_k=1) == pytest.approx([0.5])
    # last_k = 3: s* = 0.3, R = (0.5 - 0.1) / 0.2 = 2
    assert retention_curve([0.1], [0.0, 0.0, 0.9], [0.5]) == pytest.approx([2.0])


# ----------------------------------------------------------------------------- many episodes


def test_retention_band_is_the_mean_with_a_student_t_interval():
    curves = [[1.0, 0.5], None, [0.8, 0.3], [0.6, 0.4]]  # the episode without a curve is left out
    mean, low, high = retention_band(curves)
    # means: (1 + 0.8 + 0.6) / 3 = 0.8, (0.5 + 0.3 + 0.4) / 3 = 0.4
    # sd (ddof=1): sqrt((0.2^2 + 0 + 0.2^2) / 2) = 0.2, sqrt((0.1^2 + 0.1^2 + 0) / 2) = 0.1
    # t_{0.975, 2}: the t(2) CDF is 1/2 + t / (2 sqrt(2 + t^2)), so t / sqrt(2 + t^2) = 0.95,
    # t^2 = 0.95^2 * 2 / (1 - 0.95^2) = 18.51..., t = 4.3027
    t2 = math.sqrt(0.95 ** 2 * 2 / (1 - 0.95 ** 2))
    half = t2 * np.array([0.2, 0.1]) / math.sqrt(3)
    assert mean == pytest.approx([0.8, 0.4])
    assert low == pytest.approx(np.array([0.8, 0.4]) - half)
    assert high == pytest.approx(np.array([0.8, 0.4]) + half)
    assert half[0] == pytest.approx(0.4968, abs=1e-4)


def test_retention_band_of_one_curve_has_no_interval():
    mean, low, high = retention_band([[0.7, 0.2]])
    assert mean == pytest.approx([0.7, 0.2]) and np.all(np.isnan(low)) and np.all(np.isnan(high))


def _km_by_hand(table):
    """Product limit S(t) = prod (1 - d/n) and the log-log band S^exp(+-z sqrt(V) / |log S|),
    V = sum d / (n (n - d)) (Greenwood), written out independently of scipy."""
    s, v, rows = 1.0, 0.0, []
    for t, n, d in table:
        s *= 1 - d / n
        v += d / (n * (n - d))
        w = Z95 * math.sqrt(v) / abs(math.log(s))
        rows.append((t, s, s ** math.exp(w), s ** math.exp(-w)))
    return rows


def test_km_median_half_life_on_a_small_hand_example():
    # times 1, 2, 2, 3, 4; one of the 2s is censored (still at risk at 2, gone after).
    #   t=1: n=5, d=1: S = 4/5             = 0.8
    #   t=2: n=4, d=1: S = 0.8 * 3/4       = 0.6
    #   t=3: n=2, d=1: S = 0.6 * 1/2       = 0.3   <- first S <= 0.5: median 3
    #   t=4: n=1, d=1: S = 0               (band undefined: stays open above)
    rows = _km_by_hand([(1, 5, 1), (2, 4, 1), (3, 2, 1)])
    assert [round(r[1], 12) for r in rows] == [0.8, 0.6, 0.3]
    # lower band at t=1: 0.8^exp(1.96 * sqrt(0.05) / 0.2231) = 0.204 <= 0.5: low = 1
    assert rows[0][2] == pytest.approx(0.2038, abs=1e-4)
    # upper band 0.969, 0.882, 0.719 never <= 0.5, and is undefined at S = 0: high not reached
    assert [r[3] for r in rows] == pytest.approx([0.9692, 0.8818, 0.7193], abs=1e-4)
    got = km_half_life([1, 2, 2, 3, 4], [True, True, False, True, True])
    assert got == HalfLife(median=3.0, low=1.0, high=None, n=5, events=4)


def test_km_interval_closes_with_more_episodes():
    # 22 episodes: halved at 1 (x3), 2 (x3), 3 (x4), 4 (x3), 5 (x2), 6, 7, 8; censored at 8 (x4)
    times = [1] * 3 + [2] * 3 + [3] * 4 + [4] * 3 + [5] * 2 + [6, 7, 8] + [8] * 4
    observed = [True] * 18 + [False] * 4
    table = [(1, 22, 3), (2, 19, 3), (3, 16, 4), (4, 12, 3), (5, 9, 2), (6, 7, 1), (7, 6, 1), (8, 5, 1)]
    rows = _km_by_hand(table)
    # S: 0.864, 0.727, 0.545, 0.409 <- median 4
    assert [r[1] for r in rows[:4]] == pytest.approx([19 / 22, 16 / 22, 12 / 22, 9 / 22])
    # lower band: 0.634, 0.491 <- first <= 0.5 at t = 2
    assert [r[2] for r in rows[:2]] == pytest.approx([0.6344, 0.4910], abs=1e-4)
    # upper band: ..., 0.601 (t=4), 0.511 (t=5), 0.464 (t=6) <- first <= 0.5 at t = 6
    assert [r[3] for r in rows[3:6]] == pytest.approx([0.6007, 0.5111, 0.4637], abs=1e-4)
    assert km_half_life(times, observed) == HalfLife(4.0, 2.0, 6.0, 22, 18)


def test_km_when_half_of_the_episodes_never_halve():
    # 1 event at t=1 (S = 3/4), three censored at 3: S never reaches 0.5, so no median and no
    # upper limit; the lower band at t=1 is 0.75^exp(1.96 sqrt(1/12) / |log 0.75|) = 0.128: low = 1
    assert _km_by_hand([(1, 4, 1)])[0][2] == pytest.approx(0.128, abs=1e-3)
    assert km_half_life([3, 3, 3, 1], [False, False, False, True]) == HalfLife(None, 1.0, None, 4, 1)
    # no events at all: nothing is reached
    assert km_half_life([5, 5], [False, False]) == HalfLife(None, None, None, 2, 0)


def test_km_when_every_episode_halves_at_once():
    # n = d = 3 at t = 1: S drops from 1 to 0, the band is undefined; the lower limit is the median
    assert km_half_life([1, 1, 1], [True, True, True]) == HalfLife(1.0, 1.0, None, 3, 3)


def test_log_rank_against_the_observed_minus_expected_arithmetic():
    # a: 1, 3, 4 (censored), 5      b: 2, 3, 6, 7 (censored)
    # event time | n_a n_b n d | O_a | E_a = n_a d / n | V = n_a n_b d (n - d) / (n^2 (n - 1))
    #     1      |  4   4  8 1 |  1  |     4/8         | 4*4*1*7 / (64*7)  = 1/4
    #     2      |  3   4  7 1 |  0  |     3/7         | 3*4*1*6 / (49*6)  = 12/49
    #     3      |  3   3  6 2 |  1  |     6/6         | 3*3*2*4 / (36*5)  = 2/5
    #     5      |  1   2  3 1 |  1  |     1/3         | 1*2*1*2 / (9*2)   = 2/9
    #     6      |  0   2  2 1 |  0  |     0           | 0
    # O_a - E_a = 3 - (1/2 + 3/7 + 1 + 1/3) = 3 - 95/42 = 31/42
    z = (31 / 42) / math.sqrt(1 / 4 + 12 / 49 + 2 / 5 + 2 / 9)  # = 0.6983
    p = math.erfc(abs(z) / math.sqrt(2))  # two-sided normal tail = chi-square(1) tail of z^2
    stat, pvalue = log_rank([1, 3, 4, 5], [True, True, False, True], [2, 3, 6, 7], [True, True, True, False])
    assert stat == pytest.approx(z, abs=1e-9) and pvalue == pytest.approx(p, abs=1e-9)
    assert z == pytest.approx(0.6983, abs=1e-4)
    # swapping the groups flips the sign, not the p-value
    back = log_rank([2, 3, 6, 7], [True, True, True, False], [1, 3, 4, 5], [True, True, False, True])
    assert back == pytest.approx((-z, p), abs=1e-9)


def test_log_rank_is_undefined_without_events():
    stat, p = log_rank([3, 3], [False, False], [3, 3], [False, False])
    assert math.isnan(stat) and math.isnan(p)


# ----------------------------------------------------------------------------- effort

SHARES = [0.0, 0.1, 0.3, 0.35, 0.5]
ACTIONS = [2, 3, 5, 0, 10]  # cumulative: 2, 5, 10, 10, 20


def test_effort_curve_is_cumulative_actions_against_share():
    spent, share = effort_curve(SHARES, ACTIONS)
    assert spent.tolist() == [2, 5, 10, 10, 20] and share.tolist() == SHARES


def test_effort_to_threshold_with_censoring():
    assert effort_to_threshold(SHARES, ACTIONS, 0.3) == (10.0, True)  # reached in round 3
    assert effort_to_threshold(SHARES, ACTIONS, 0.35) == (10.0, True)  # round 4 took no new actions
    assert effort_to_threshold(SHARES, ACTIONS, 0.0) == (2.0, True)  # round 1 already there
    assert effort_to_threshold(SHARES, ACTIONS, 0.6) == (20.0, False)  # never: censored at all 20


def test_initial_slope_is_the_least_squares_slope():
    # x = 2, 5, 10, y = 0, 0.1, 0.3: Sxy = (0 + 0.5 + 3) - 3 (17/3)(0.4/3) = 37/30,
    # Sxx = (4 + 25 + 100) - 17^2 / 3 = 98/3, slope = (37/30) / (98/3) = 37/980
    assert initial_slope(SHARES, ACTIONS) == pytest.approx(37 / 980, abs=1e-12)
    assert initial_slope(SHARES, ACTIONS) == pytest.approx(np.polyfit([2, 5, 10], [0, 0.1, 0.3], 1)[0])
    # k = 2: (0.1 - 0) / (5 - 2) = 1/30
    assert initial_slope(SHARES, ACTIONS, k=2) == pytest.approx(1 / 30, abs=1e-12)
    # k = 5, against numpy's fit over every round
    assert initial_slope(SHARES, ACTIONS, k=5) == pytest.approx(np.polyfit([2, 5, 10, 10, 20], SHARES, 1)[0])


def test_initial_slope_needs_two_distinct_action_totals():
    assert initial_slope([0.1, 0.2, 0.3], [4, 0, 0]) is None  # cumulative 4, 4, 4
    assert initial_slope([0.1, 0.2, 0.3, 0.4], [0, 0, 0, 5]) is None  # first 3: 0, 0, 0
    # k = 4: x = 0, 0, 0, 5 (mean 1.25), y = 0.1 .. 0.4 (mean 0.25):
    # Sxy = -1.25 (-0.15 - 0.05 + 0.05) + 3.75 * 0.15 = 0.75, Sxx = 3 * 1.25^2 + 3.75^2 = 18.75, 0.04
    assert initial_slope([0.1, 0.2, 0.3, 0.4], [0, 0, 0, 5], k=4) == pytest.approx(0.04, abs=1e-12)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, message", [
    (lambda: retention_curve([], [0.5], [0.3]), "baseline shares are empty"),
    (lambda: retention_curve([0.1], [], [0.3]), "steering shares are empty"),
    (lambda: retention_curve([0.1], [0.5], []), "release shares are empty"),
    (lambda: retention_curve([0.1, -0.1], [0.5], [0.3]), "baseline shares must not be negative"),
    (lambda: retention_curve([0.1], [0.5, float("nan")], [0.3]), "steering shares contain NaN (round 2)"),
    (lambda: retention_curve([0.1], [0.5], [1.2]), "release shares must be at most 1"),
    (lambda: retention_curve([0.1], [0.5], [0.3], min_gain=-0.01), "min_gain must be >= 0"),
    (lambda: retention_curve([0.1], [0.5], [0.3], last_k=0), "last_k must be an integer >= 1"),
    (lambda: half_life([]), "needs at least one release round"),
    (lambda: retention_area([0.5, float("nan")]), "must be finite"),
    (lambda: retention_band([[0.5, 0.4], [0.3]]), "equal lengths"),
    (lambda: retention_band([None]), "at least one episode"),
    (lambda: km_half_life([1, 2], [True]), "equal length, got 2 times and 1 flags"),
    (lambda: km_half_life([], []), "no times given"),
    (lambda: km_half_life([1, -2], [True, True]), "not negative"),
    (lambda: log_rank([1], [True], [2, 3], [True]), "group b: times and observed flags"),
    (lambda: effort_curve([0.1, 0.2], [1]), "1 counts for 2 shares"),
    (lambda: effort_curve([0.1, 1.5], [1, 1]), "effort shares must be at most 1"),
    (lambda: effort_curve([0.1, 0.2], [1, -1]), "action counts must be finite and not negative"),
    (lambda: effort_to_threshold([0.1], [1], 1.5), "threshold must be a share in [0, 1]"),
    (lambda: initial_slope([0.1], [1], k=1), "k must be an integer >= 2"),
])
def test_bad_input_raises_a_config_error_naming_the_problem(call, message):
    with pytest.raises(ConfigError) as caught:
        call()
    assert message in str(caught.value)
