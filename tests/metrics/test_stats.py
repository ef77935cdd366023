"""The t-test and t interval (computed with scipy.special) against scipy.stats, which they replace.

scipy.stats is the reference here only: the metrics package must not import it (about half
a second of import time on every run), which the last test checks in a fresh interpreter.
"""
from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from scipy import stats

from ctrlsim.metrics import paired_t_test
from ctrlsim.metrics.controllability import js_divergence
from ctrlsim.metrics.stats import mean_ci

RTOL = 1e-12

_rng = np.random.default_rng(20261130)
SAMPLES = {
    "two values": np.array([0.1, 0.4]),
    "three": np.array([0.2, -0.1, 0.35]),
    "small positive": np.array([0.60, 0.58, 0.57, 0.62, 0.59]) - np.array([0.50, 0.52, 0.48, 0.51, 0.49]),
    "negative mean": _rng.normal(-0.3, 1.0, size=12),
    "near zero mean": _rng.normal(0.0, 1.0, size=40) - 0.01,
    "large t": 5.0 + _rng.normal(0.0, 0.1, size=30),  # p far below 1e-20
    "large n": _rng.normal(0.05, 1.0, size=2000),
    "last bits only": np.array([1e-9, 1e-9 + 1e-18, 1e-9 + 2e-18]),
    "heavy tail": _rng.standard_t(2, size=25),
}


def _scipy_ttest(diff: np.ndarray, alternative: str):
    with warnings.catch_warnings():  # scipy warns about precision loss on the "last bits" sample
        warnings.simplefilter("ignore", RuntimeWarning)
        return stats.ttest_1samp(diff, 0.0, alternative=alternative)


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_t_test_matches_scipy_stats(name, alternative):
    diff = SAMPLES[name]
    ours = paired_t_test(diff, alternative=alternative)
    ref = _scipy_ttest(diff, alternative)
    assert ours.defined and ours.n == diff.size and ours.alternative == alternative
    assert ours.mean == pytest.approx(float(np.mean(diff)), rel=RTOL)
    assert ours.t == pytest.approx(float(ref.statistic), rel=RTOL)
    assert ours.p == pytest.approx(float(ref.pvalue), rel=RTOL, abs=0.0)


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_paired_form_and_nans_match_scipy_on_the_differences(alternative):
    after = np.array([0.7, np.nan, 0.55, 0.61, 0.9, 0.4])
    before = np.array([0.5, 0.3, np.nan, 0.60, 0.7, 0.45])
    ours = paired_t_test(after, before, alternative=alternative)
    diff = (after - before)[~np.isnan(after - before)]  # pairs with a NaN on either side are dropped
    ref = _scipy_ttest(diff, alternative)
    assert ours.n == 4
    assert ours.t == pytest.approx(float(ref.statistic), rel=RTOL)
    assert ours.p == pytest.approx(float(ref.pvalue), rel=RTOL, abs=0.0)


def test_p_values_of_the_tails_add_up():
    diff = SAMPLES["negative mean"]
    up, down = paired_t_test(diff, alternative="greater"), paired_t_test(diff, alternative="less")
    both = paired_t_test(diff, alternative="two-sided")
    assert up.p + down.p == pytest.approx(1.0, rel=1e-14)
    assert both.p == pytest.approx(2 * min(up.p, down.p), rel=1e-14)


@pytest.mark.parametrize("values", [[], [0.3], [np.nan, 0.3], [0.2, 0.2, 0.2], [np.nan, np.nan]])
def test_undefined_cases_stay_nan(values):
    test = paired_t_test(values, alternative="two-sided")
    kept = [v for v in values if not math.isnan(v)]
    assert test.n == len(kept) and math.isnan(test.t) and math.isnan(test.p) and not test.defined
    assert (math.isnan(test.mean) if not kept else test.mean == pytest.approx(kept[0]))


def test_unknown_alternative_is_rejected():
    with pytest.raises(ValueError, match="alternative"):
        paired_t_test([0.1, 0.2], alternative="two_sided")


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.99, 0.999])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_confidence_half_width_matches_scipy_t_ppf(name, confidence):
    x = SAMPLES[name]
    est = mean_ci(x, confidence)
    mean, half = est.value, est.half_width
    expected = stats.t.ppf(0.5 + confidence / 2, x.size - 1) * np.std(x, ddof=1) / math.sqrt(x.size)
    assert mean == pytest.approx(float(np.mean(x)), rel=RTOL)
    assert half == pytest.approx(float(expected), rel=RTOL)


def test_confidence_interval_edge_cases():
    empty = mean_ci([])
    assert empty.n == 0 and math.isnan(empty.value) and math.isnan(empty.low)
    one = mean_ci([np.nan, 2.5])  # one value left after dropping NaN: no interval
    assert (one.value, one.n) == (2.5, 1) and math.isnan(one.low) and math.isnan(one.high)
    flat = mean_ci([0.5, 0.5, 0.5])  # no spread, no width
    assert (flat.value, flat.low, flat.high) == (0.5, 0.5, 0.5)
    for bad in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="confidence"):
            mean_ci([1.0, 2.0], bad)


def test_js_divergence_matches_the_definition():
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.5, 0.5])
    m = (p + q) / 2

    def kl(a, b):
        return sum(x * math.log2(x / y) for x, y in zip(a, b) if x > 0)

    assert js_divergence(p, q) == pytest.approx((kl(p, m) + kl(q, m)) / 2, rel=1e-12)  # = 0.5 here
    assert js_divergence(np.zeros(3), q) == 1.0


def test_importing_metrics_does_not_import_scipy_stats():
    code = "import ctrlsim.metrics, sys; print('scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip() == "False"


def test_one_estimate_formatter_by_hand():
    from ctrlsim.metrics.stats import Estimate, format_estimate

    est = Estimate(0.125, 0.1, 0.2, 8)
    assert format_estimate(est, 100) == "12.50 ± 5.00"  # half-width (0.2 - 0.1) / 2, scaled
    assert format_estimate(est, digits=3, bounds=True) == "0.125 [0.100, 0.200]"  # asymmetric: bounds
    assert format_estimate(Estimate(0.5, -0.1, 0.8, 9), bounds=True, signed=True) == "+0.50 [-0.10, +0.80]"
    one = Estimate(0.3, float("nan"), float("nan"), 1)
    assert format_estimate(one) == "0.30 ± n/a" and format_estimate(one, bounds=True) == "0.30 [n/a]"
    none = Estimate(float("nan"), float("nan"), float("nan"), 0)
    assert format_estimate(none) == "-" and format_estimate(none, missing="undefined") == "undefined"


def test_estimate_json_round_trip_and_the_audit_filter_share_the_formatter():
    from ctrlsim.experiments.audit.render import format_ci
    from ctrlsim.metrics.stats import Estimate

    est = Estimate(0.125, 0.1, 0.2, 8)
    assert Estimate.from_dict(est.to_dict()) == est
    assert format_ci(est.to_dict(100)) == "12.50 [10.00, 20.00]"
    assert format_ci({"value": 0.3, "low": None, "high": None, "n": 1}) == "0.30 [n/a]"
    assert format_ci({"value": None, "low": None, "high": None, "n": 0}) == "n/a" and format_ci(None) == "n/a"
