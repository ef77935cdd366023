"""The empirical-Bernstein confidence sequence keeps its coverage under optional stopping."""
import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.sequential import bounded_mean_sequence


def test_the_sequence_narrows_stays_in_range_and_never_widens():
    x = np.random.default_rng(1).beta(2, 5, size=400)
    cs = bounded_mean_sequence(x)
    width = cs.high - cs.low
    assert np.all(np.diff(width) <= 1e-12) and width[-1] < 0.1
    assert np.all((0 <= cs.low) & (cs.low <= cs.high) & (cs.high <= 1))
    assert cs.low[-1] <= 2 / 7 <= cs.high[-1]  # the Beta(2, 5) mean


def test_coverage_under_stopping_when_narrow_enough_is_at_least_nominal():
    """Many runs on a 'dial box' of known mean, each stopped as soon as its interval is at most
    0.2 wide (or at 200 seeds): a fixed-n t interval read at that moment covers less than 95%;
    the sequence covers at least 95% within Monte Carlo error."""
    from scipy.stats import t as student

    rng = np.random.default_rng(0)
    mean, runs, misses_cs, misses_t = 0.3, 2000, 0, 0
    critical = {n: student.ppf(0.975, n - 1) for n in range(3, 201)}  # once, not per run
    for _ in range(runs):
        x = rng.beta(3 * mean / (1 - mean), 3, size=200)  # shares in [0, 1] with mean 0.3
        true = mean
        # The interval after t seeds depends on the first t only: most runs stop within 100 seeds,
        # so the whole 200 are computed only for the runs that did not.
        cs = bounded_mean_sequence(x[:100])
        if not np.any((cs.high - cs.low) <= 0.2):
            cs = bounded_mean_sequence(x)
        stop = int(np.argmax((cs.high - cs.low) <= 0.2)) if np.any((cs.high - cs.low) <= 0.2) else 199
        misses_cs += not cs.low[stop] <= true <= cs.high[stop]
        # the t interval, looked at after every seed from 3 on and stopped when narrow enough
        for n in range(3, 201):
            half = critical[n] * x[:n].std(ddof=1) / np.sqrt(n)
            if 2 * half <= 0.2 or n == 200:
                misses_t += abs(x[:n].mean() - true) > half
                break
    standard_error = np.sqrt(0.05 * 0.95 / runs)
    assert misses_cs / runs <= 0.05 + 2 * standard_error
    assert misses_t / runs > misses_cs / runs  # why a fixed-n interval is not used for stopping


def test_bad_input_is_named():
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        bounded_mean_sequence([0.5, 1.5])
    with pytest.raises(ConfigError, match="at least one"):
        bounded_mean_sequence([])
