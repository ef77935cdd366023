"""Intervals for bounded means (shares, rates, proportions) that never leave the metric's range.

A Student t interval over three seeds of a Coverage share can print [-2.6, 5.4]%: symmetric about
the mean whatever the range. The bootstrap interval is built from means of resampled data, each
inside the range, so it stays there. BCa (bias-corrected and accelerated, scipy's default) where
it is defined; the percentile interval where BCa is not (scipy warns that the data are degenerate,
or its acceleration is undefined). When every value is the same the interval is that value: no
spread was observed (say so beside the table; a rate of 0 in n episodes is not proven 0).
Resampling is seeded, so a table is the same on every rebuild.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from ctrlsim.metrics.stats import Estimate

N_RESAMPLES = 9999


def share_ci(values: Sequence[float | None] | np.ndarray, confidence: float = 0.95) -> Estimate:
    """The interval of a share, rate or proportion (Coverage, Exposure, like rates): the bounded-mean
    bootstrap below, so it never leaves [0, 1]."""
    return bootstrap_mean_ci(values, confidence=confidence)


def bootstrap_mean_ci(values: Sequence[float | None] | np.ndarray, *, confidence: float = 0.95,
                      n_resamples: int = N_RESAMPLES, seed: int = 0) -> Estimate:
    """The mean of the defined values with its bootstrap interval (BCa, else percentile)."""
    from scipy.stats import bootstrap

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    x = np.asarray([v for v in values if v is not None], dtype=float)
    x = x[~np.isnan(x)]
    nan = float("nan")
    if x.size == 0:
        return Estimate(nan, nan, nan, 0, confidence, "bootstrap-bca")
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, nan, nan, 1, confidence, "bootstrap-bca")
    if np.all(x == x[0]):
        return Estimate(mean, mean, mean, int(x.size), confidence, "none")
    low = high = nan
    method = "BCa"
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a degenerate BCa is detected by its NaN bounds below
            result = bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                               method=method, random_state=np.random.default_rng(seed), vectorized=True)
        low, high = (float(b) for b in result.confidence_interval)
        if np.isfinite(low) and np.isfinite(high):
            break
    # BCa's bounds are quantiles of bootstrap means, so inside [min, max]; clipping only guards
    # against rounding.
    return Estimate(mean, max(low, float(x.min())), min(high, float(x.max())), int(x.size), confidence,
                    f"bootstrap-{method.lower()}")


__all__ = ["N_RESAMPLES", "bootstrap_mean_ci", "share_ci"]
