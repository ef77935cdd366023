"""Does control last after steering stops, and how much effort does it take?

A steer-then-release episode has three phases: baseline (probes act without a goal), steering
(they pursue a target) and release (they go back to the baseline policy). Each round's input is
the target share of the slate: the share of slate items that are target items.

* s0 = the mean share over the baseline rounds; s* = the mean over the last `last_k` steering
  rounds (all of them when steering is shorter); s(tau) = the share tau rounds into release.
* Retention R(tau) = (s(tau) - s0) / (s* - s0): 1 = the steered level held, 0 = back to baseline.
  Defined only where steering moved the box, s* - s0 > `min_gain`; otherwise there is nothing to
  retain and the episode has no retention curve (None).
* Half-life: the first tau with R(tau) <= 1/2, right-censored at the number of release rounds
  when it never comes, so episodes that never forget are not dropped: a Kaplan-Meier median over
  episodes uses them (`km_half_life`), and `log_rank` compares two boxes.
* Relapse share = 1 - the mean R over the last `last_k` release rounds; retention area = the mean
  R over the release rounds (the normalised area under the retention curve).
* Effort: share against cumulative actions (likes; callers add searches or not), the actions
  spent to first reach a share (right-censored at the total when never reached) and the initial
  slope (share gained per action).

scipy is imported inside the functions that use it (`scipy.stats` costs about half a second of
import time; see `metrics.stats`).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ctrlsim.errors import ConfigError

LAST_K = 3  # rounds averaged for the steered level s* and for the relapse share
MIN_GAIN = 0.05  # the least s* - s0 that counts as steering having moved the box
HALF = 0.5
# R(tau) is computed, so a value that is exactly 1/2 in decimal arithmetic may land a few ulps
# above it in binary; this tolerance keeps such a round a half-life event.
_TOLERANCE = 1e-9


# ----------------------------------------------------------------------------- validation

def _shares(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    """`values` as a non-empty 1-D array of shares in [0, 1], or a ConfigError naming the problem."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ConfigError(f"{name} shares must be a flat sequence, got shape {x.shape}")
    if x.size == 0:
        raise ConfigError(f"{name} shares are empty: the phase needs at least one round")
    if np.any(np.isnan(x)):
        raise ConfigError(f"{name} shares contain NaN (round {int(np.flatnonzero(np.isnan(x))[0]) + 1})")
    if np.any(x < 0):
        raise ConfigError(f"{name} shares must not be negative, got {float(x[x < 0][0])!r}")
    if np.any(x > 1):
        raise ConfigError(f"{name} shares must be at most 1, got {float(x[x > 1][0])!r}")
    return x


def _curve(curve: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(curve, dtype=float)
    if r.ndim != 1 or r.size == 0:
        raise ConfigError("a retention curve needs at least one release round")
    if not np.all(np.isfinite(r)):
        raise ConfigError("a retention curve must be finite (no NaN or inf)")
    return r


def _positive_int(value: int, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


def _survival_data(times: Sequence[float], observed: Sequence[bool], name: str = "episodes"
                   ) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(times, dtype=float)
    seen = np.asarray(observed, dtype=bool)
    if t.ndim != 1 or seen.ndim != 1 or t.size != seen.size:
        raise ConfigError(f"{name}: times and observed flags must be flat and of equal length, got "
                          f"{t.size} times and {seen.size} flags")
    if t.size == 0:
        raise ConfigError(f"{name}: no times given")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ConfigError(f"{name}: times must be finite and not negative")
    return t, seen


# ----------------------------------------------------------------------------- one episode

def steered_levels(baseline: Sequence[float], steering: Sequence[float], *,
                   last_k: int = LAST_K) -> tuple[float, float]:
    """(s0, s*): the mean baseline share and the mean share over the last `last_k` steering rounds."""
    last_k = _positive_int(last_k, "last_k")
    s0 = float(_shares(baseline, "baseline").mean())
    s_star = float(_shares(steering, "steering")[-last_k:].mean())
    return s0, s_star


def retention_curve(baseline: Sequence[float], steering: Sequence[float], release: Sequence[float], *,
                    last_k: int = LAST_K, min_gain: float = MIN_GAIN) -> np.ndarray | None:
    """R(tau) = (s(tau) - s0) / (s* - s0) for tau = 1..len(release); None when s* - s0 <= min_gain
    (steering did not move the box, so there is nothing to retain)."""
    if not min_gain >= 0:  # also catches NaN
        raise ConfigError(f"min_gain must be >= 0, got {min_gain!r}")
    s0, s_star = steered_levels(baseline, steering, last_k=last_k)
    after = _shares(release, "release")
    gain = s_star - s0
    if not gain > min_gain:
        return None
    return (after - s0) / gain


def half_life(curve: Sequence[float] | np.ndarray) -> tuple[int, bool]:
    """(tau, True) for the first release round with R(tau) <= 1/2; (len(curve), False) when R never
    falls that far: right-censored at the last release round observed."""
    r = _curve(curve)
    below = np.flatnonzero(r <= HALF + _TOLERANCE)
    if below.size:
        return int(below[0]) + 1, True
    return int(r.size), False


def relapse_share(curve: Sequence[float] | np.ndarray, *, last_k: int = LAST_K) -> float:
    """1 - the mean R over the last `last_k` release rounds (all of them when release is shorter):
    the share of the steered gain lost by the end (0 = kept, 1 = back to baseline)."""
    last_k = _positive_int(last_k, "last_k")
    return float(1.0 - _curve(curve)[-last_k:].mean())


def retention_area(curve: Sequence[float] | np.ndarray) -> float:
    """The mean R over the release rounds: the area under the retention curve over its length
    (1 = nothing forgotten, 0 = back to baseline at once)."""
    return float(_curve(curve).mean())


# ----------------------------------------------------------------------------- many episodes

def retention_band(curves: Sequence[Sequence[float] | np.ndarray | None], *, confidence: float = 0.95
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) per tau over episodes: the mean R(tau) with its Student t interval
    (mean ± t_{n-1} s / sqrt(n), s with ddof=1). Episodes without a curve (None) are left out;
    the rest must have equal lengths. With one curve the bounds are NaN."""
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    defined = [_curve(c) for c in curves if c is not None]
    if not defined:
        raise ConfigError("retention_band needs at least one episode with a retention curve")
    lengths = sorted({c.size for c in defined})
    if len(lengths) > 1:
        raise ConfigError(f"retention curves must have equal lengths, got lengths {lengths}")
    r = np.vstack(defined)
    mean = r.mean(axis=0)
    n = r.shape[0]
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return mean, nan, nan.copy()
    from scipy.stats import t as student  # lazy, see the module docstring

    half = float(student.ppf(0.5 + confidence / 2, n - 1)) * r.std(axis=0, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class HalfLife:
    """Kaplan-Meier median half-life over episodes with its interval; None = not reached (the
    survival curve, or its band, never falls to 1/2 within the rounds observed)."""

    median: float | None
    low: float | None
    high: float | None
    n: int
    events: int


def _first_at_or_below_half(times: np.ndarray, values: np.ndarray) -> float | None:
    hit = np.flatnonzero(values <= HALF)
    return float(times[hit[0]]) if hit.size else None


def km_half_life(times: Sequence[float], observed: Sequence[bool], *, confidence: float = 0.95) -> HalfLife:
    """The median of the Kaplan-Meier survival curve of half-lives, the first time with S(t) <= 1/2,
    with the interval read off the pointwise log-log (exponential Greenwood) band: low = the first
    time the band's lower curve is <= 1/2, high = the first time its upper curve is.

    The band is undefined where S(t) = 1 (before the first event) and where S(t) = 0 (everyone
    at risk has halved); there the lower curve is taken as S(t) itself and the upper curve as 1,
    so `low` never passes the median and `high` stays open (None) rather than guessed."""
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    t, seen = _survival_data(times, observed)
    events = int(seen.sum())
    if events == 0:
        return HalfLife(None, None, None, int(t.size), 0)
    from scipy.stats import CensoredData, ecdf  # lazy, see the module docstring

    sf = ecdf(CensoredData(uncensored=t[seen], right=t[~seen])).sf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the undefined points, handled below
        band = sf.confidence_interval(confidence, method="log-log")
    at, s = sf.quantiles, sf.probabilities
    lower = np.where(np.isnan(band.low.probabilities), s, band.low.probabilities)
    upper = np.where(np.isnan(band.high.probabilities), 1.0, band.high.probabilities)
    return HalfLife(_first_at_or_below_half(at, s), _first_at_or_below_half(at, lower),
                    _first_at_or_below_half(at, upper), int(t.size), events)


def log_rank(times_a: Sequence[float], observed_a: Sequence[bool],
             times_b: Sequence[float], observed_b: Sequence[bool]) -> tuple[float, float]:
    """Two-sided log-rank test that two groups of half-lives (two boxes) share one survival curve.

    Returns (statistic, p-value) from `scipy.stats.logrank`: the statistic is signed,
    (O_a - E_a) / sqrt(V), the square root of the usual chi-square; positive when group a halves
    sooner than expected. Both are NaN where the test is undefined (no events, or no variance)."""
    ta, sa = _survival_data(times_a, observed_a, "group a")
    tb, sb = _survival_data(times_b, observed_b, "group b")
    from scipy.stats import CensoredData, logrank  # lazy, see the module docstring

    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # 0 / 0 without events: NaN, as documented
        res = logrank(CensoredData(uncensored=ta[sa], right=ta[~sa]),
                      CensoredData(uncensored=tb[sb], right=tb[~sb]), alternative="two-sided")
    return float(res.statistic), float(res.pvalue)


# ----------------------------------------------------------------------------- effort

def effort_curve(shares: Sequence[float], actions: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative actions, share) per round: the share bought by the actions spent so far.

    `actions` are each round's action counts (likes; add searches where they count as effort)."""
    s = _shares(shares, "effort")
    a = np.asarray(actions, dtype=float)
    if a.ndim != 1 or a.size != s.size:
        raise ConfigError(f"effort needs one action count per round, got {a.size} counts for "
                          f"{s.size} shares")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ConfigError("action counts must be finite and not negative")
    return np.cumsum(a), s


def effort_to_threshold(shares: Sequence[float], actions: Sequence[float], threshold: float
                        ) -> tuple[float, bool]:
    """(cumulative actions at the first round whose share >= threshold, True), or (all actions,
    False) when the share never gets there: right-censored at the effort spent."""
    if not 0 <= threshold <= 1:
        raise ConfigError(f"threshold must be a share in [0, 1], got {threshold!r}")
    spent, s = effort_curve(shares, actions)
    hit = np.flatnonzero(s >= threshold)
    if hit.size:
        return float(spent[hit[0]]), True
    return float(spent[-1]), False


def initial_slope(shares: Sequence[float], actions: Sequence[float], *, k: int = LAST_K) -> float | None:
    """Least-squares slope of share against cumulative actions over the first `k` rounds: the share
    gained per action at the start. None with fewer than two distinct action totals (no run)."""
    k = _positive_int(k, "k", least=2)
    spent, s = effort_curve(shares, actions)
    x, y = spent[:k], s[:k]
    if np.unique(x).size < 2:
        return None
    dx = x - x.mean()
    return float(np.sum(dx * (y - y.mean())) / np.sum(dx * dx))


__all__ = [
    "HALF", "LAST_K", "MIN_GAIN", "HalfLife", "effort_curve", "effort_to_threshold", "half_life",
    "initial_slope", "km_half_life", "log_rank", "relapse_share", "retention_area", "retention_band",
    "retention_curve", "steered_levels",
]
