"""Confidence sequences for a bounded mean: intervals that stay valid when a run stops on them.

A run that adds seeds until its interval is narrow enough ("optional stopping") would make a fixed-n
interval cover less than its nominal 95%: it stops on a lucky stretch. A confidence sequence holds
at every n at once, so any stopping rule keeps its coverage. This is the hedged-capital betting
sequence of Waudby-Smith & Ramdas ("Estimating means of bounded random variables by betting",
JRSS-B 2024, Theorem 3) for observations in [0, 1] (rescale others first). For each candidate mean
m, two gamblers bet that the mean is above and below m:

  K_t^+(m) = prod_{i<=t} (1 + l_i^+(m) (x_i - m)),   K_t^-(m) = prod_{i<=t} (1 - l_i^-(m) (x_i - m))
  l_i^+(m) = min(l_i, c / m),   l_i^-(m) = min(l_i, c / (1 - m)),   c = 3/4
  l_i      = sqrt(2 log(2/alpha) / (sigma2_{i-1} i log(1 + i)))   (predictable plug-in)
  mu_hat_t = (1/2 + sum_{i<=t} x_i) / (t + 1),   sigma2_t = (1/4 + sum_{i<=t} (x_i - mu_hat_i)^2) / (t + 1)

K_t(m) = K_t^+(m) / 2 + K_t^-(m) / 2 is a nonnegative martingale with mean 1 at the true mean, so
by Ville's inequality it reaches 1/alpha with probability at most alpha: the set of m whose capital
has stayed below 1/alpha is a (1 - alpha) confidence sequence. Computed on a grid of m (step
1/1000, widened by one step each side), its hull is reported and intersected over t.

Chosen over a group-sequential design because it needs no plan of looks fixed before the run and
no normality: a run may stop after any seed. Chosen over the simpler empirical-Bernstein sequence
of the same paper because that one's width cannot fall below about 7.4 / n (its bets are capped
at 1/2), which on a low-variance share (a Coverage of a few percent) costs hundreds of seeds; the
hedged bets may grow to c / m near a small mean. It is still wider than a fixed-n interval at the
same n: that is the price of stopping on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ctrlsim.errors import ConfigError

# c: how far a bet may go towards the most it could (1 / m, 1 / (1 - m)); Waudby-Smith & Ramdas
# suggest 1/2 or 3/4. 3/4: on a share near 0 the upper bound falls about 1.5 times as fast.
TRUNCATION = 0.75


@dataclass(frozen=True)
class SequenceBounds:
    """The running interval after each observation: `low[t]`, `high[t]` after t + 1 of them."""

    low: np.ndarray
    high: np.ndarray
    confidence: float

    @property
    def final(self) -> tuple[float, float]:
        return float(self.low[-1]), float(self.high[-1])


GRID_STEP = 1 / 1000  # resolution of the candidate means (a tenth of a percentage point)


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
    t = np.arange(1, x.size + 1)
    mu_hat = (0.5 + np.cumsum(x)) / (t + 1)
    sigma2 = (0.25 + np.cumsum((x - mu_hat) ** 2)) / (t + 1)
    previous_sigma2 = np.concatenate([[0.25], sigma2[:-1]])
    bet = np.sqrt(2 * math.log(2 / alpha) / (previous_sigma2 * t * np.log1p(t)))  # l_i, one per step
    m = np.linspace(0.0, 1.0, int(round(1 / GRID_STEP)) + 1)
    with np.errstate(divide="ignore"):
        up = np.minimum(bet[:, None], TRUNCATION / m[None, :])          # l_i^+(m), (t, grid)
        down = np.minimum(bet[:, None], TRUNCATION / (1 - m[None, :]))  # l_i^-(m)
    gap = x[:, None] - m[None, :]
    log_up = np.cumsum(np.log1p(up * gap), axis=0)
    log_down = np.cumsum(np.log1p(-down * gap), axis=0)
    log_capital = np.logaddexp(log_up, log_down) - math.log(2)
    # A mean once rejected stays rejected: the running intersection of the sets.
    kept = ~np.logical_or.accumulate(log_capital >= math.log(1 / alpha), axis=0)
    anywhere = kept.any(axis=1)
    first = np.argmax(kept, axis=1)                               # the lowest mean kept, per t
    last = m.size - 1 - np.argmax(kept[:, ::-1], axis=1)          # the highest
    running = np.cumsum(x) / t  # where nothing is kept (never at the true mean): a point at the mean
    low = np.where(anywhere, np.maximum(0.0, m[first] - GRID_STEP), running)
    high = np.where(anywhere, np.minimum(1.0, m[last] + GRID_STEP), running)
    low = np.maximum.accumulate(low)
    high = np.minimum.accumulate(high)
    return SequenceBounds(low, np.maximum(high, low), confidence)


__all__ = ["SequenceBounds", "bounded_mean_sequence"]
