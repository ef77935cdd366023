"""Confidence sequences for a bounded mean: intervals that stay valid when a run stops on them.

A run that adds seeds until its interval is narrow enough ("optional stopping") would make a fixed-n
interval cover less than its nominal 95%: it stops on a lucky stretch. A confidence sequence holds
at every n at once, so any stopping rule keeps its coverage. This is the predictable plug-in
empirical-Bernstein sequence of Waudby-Smith & Ramdas ("Estimating means of bounded random
variables by betting", JRSS-B 2024, Theorem 2) for observations in [0, 1] (rescale others first):

  mu_hat_t = (1/2 + sum_{i<=t} x_i) / (t + 1)
  sigma2_t = (1/4 + sum_{i<=t} (x_i - mu_hat_i)^2) / (t + 1)
  lambda_t = min(sqrt(2 log(2/alpha) / (sigma2_{t-1} t log(1 + t))), c)          c = 1/2
  psi(l)   = (-log(1 - l) - l) / 4,   v_t = 4 (x_t - mu_hat_{t-1})^2
  C_t      = sum lambda_i x_i / sum lambda_i  +-  (log(2/alpha) + sum v_i psi(lambda_i)) / sum lambda_i

intersected over t and clipped to [0, 1]. Chosen over a group-sequential design because it needs
no plan of looks fixed before the run and no normality: a run may stop after any seed. It is wider
than a fixed-n interval at the same n; that is the price of stopping on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ctrlsim.errors import ConfigError

TRUNCATION = 0.5  # c: the largest bet, Waudby-Smith & Ramdas's suggested 1/2 or 3/4


@dataclass(frozen=True)
class SequenceBounds:
    """The running interval after each observation: `low[t]`, `high[t]` after t + 1 of them."""

    low: np.ndarray
    high: np.ndarray
    confidence: float

    @property
    def final(self) -> tuple[float, float]:
        return float(self.low[-1]), float(self.high[-1])


def bounded_mean_sequence(values: Sequence[float], *, confidence: float = 0.95) -> SequenceBounds:
    """The confidence sequence of the mean of `values` in [0, 1], in the order they arrived."""
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ConfigError("a confidence sequence needs at least one observation")
    if np.any(~np.isfinite(x)) or np.any(x < 0) or np.any(x > 1):
        raise ConfigError("a bounded-mean confidence sequence takes values in [0, 1]; rescale the "
                          "metric first")
    alpha = 1 - confidence
    log_term = math.log(2 / alpha)
    t = np.arange(1, x.size + 1)
    mu_hat = (0.5 + np.cumsum(x)) / (t + 1)
    sigma2 = (0.25 + np.cumsum((x - mu_hat) ** 2)) / (t + 1)
    previous_sigma2 = np.concatenate([[0.25], sigma2[:-1]])
    previous_mu = np.concatenate([[0.5], mu_hat[:-1]])
    lam = np.minimum(np.sqrt(2 * log_term / (previous_sigma2 * t * np.log1p(t))), TRUNCATION)
    psi = (-np.log1p(-lam) - lam) / 4
    v = 4 * (x - previous_mu) ** 2
    weight = np.cumsum(lam)
    centre = np.cumsum(lam * x) / weight
    margin = (log_term + np.cumsum(v * psi)) / weight
    low = np.maximum.accumulate(np.clip(centre - margin, 0, 1))
    high = np.minimum.accumulate(np.clip(centre + margin, 0, 1))
    return SequenceBounds(low, np.maximum(high, low), confidence)


__all__ = ["SequenceBounds", "bounded_mean_sequence"]
