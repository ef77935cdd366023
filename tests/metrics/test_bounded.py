"""Bounded-mean intervals: scipy's own bootstrap, never outside the data's range, seeded."""
import math

import numpy as np
import pytest
from scipy.stats import bootstrap

from ctrlsim.metrics.bounded import bootstrap_mean_ci
from ctrlsim.metrics.stats import mean_ci


def test_the_interval_is_scipys_bca_bootstrap_of_the_mean():
    x = np.array([0.0, 0.02, 0.05, 0.01, 0.0, 0.11, 0.03])
    got = bootstrap_mean_ci(x, n_resamples=2000, seed=7)
    ref = bootstrap((x,), np.mean, n_resamples=2000, method="BCa", random_state=np.random.default_rng(7))
    assert got.value == pytest.approx(x.mean())
    assert (got.low, got.high) == pytest.approx(tuple(ref.confidence_interval))
    assert got.n == 7


def test_a_share_near_zero_never_gets_a_negative_bound_where_t_does():
    shares = [0.014, 0.0, 0.028]  # the audit's Coverage over three seeds
    t = mean_ci(shares)
    assert t.low < 0  # the symmetric t interval leaves the range
    got = bootstrap_mean_ci(shares)
    assert 0.0 <= got.low <= got.value <= got.high <= 0.028


def test_a_metric_that_is_zero_in_every_episode():
    got = bootstrap_mean_ci([0.0] * 6)
    assert (got.value, got.low, got.high, got.n) == (0.0, 0.0, 0.0, 6)


def test_missing_values_and_tiny_samples():
    assert bootstrap_mean_ci([None, float("nan")]).n == 0 and math.isnan(bootstrap_mean_ci([]).value)
    one = bootstrap_mean_ci([0.3, None])
    assert one.value == 0.3 and one.n == 1 and math.isnan(one.low)


def test_a_rebuild_gives_the_same_interval():
    x = np.random.default_rng(0).uniform(size=12)
    assert bootstrap_mean_ci(x) == bootstrap_mean_ci(x)
