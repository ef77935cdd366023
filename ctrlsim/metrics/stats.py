"""Significance tests used by the table runners.

scipy is imported inside the functions, and only `scipy.special`: `scipy.stats`
alone costs about half a second of import time, paid by every run even when
every record comes from the cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ctrlsim.metrics.power import minimum_detectable_effect


@dataclass(frozen=True)
class TTest:
    """A one-sample (paired) t-test; `t` and `p` are NaN when the test is undefined."""

    mean: float
    t: float
    p: float
    n: int
    alternative: str
    # The smallest true mean difference this test would find 80% of the time at p < 0.05, given the
    # spread of these differences (`metrics.power`); NaN with fewer than two differences.
    mde: float = float("nan")

    @property
    def defined(self) -> bool:
        """False for fewer than two differences or differences without any variance."""
        return not np.isnan(self.p)

    def significant(self, alpha: float = 0.05) -> bool:
        return self.defined and bool(self.p < alpha)


def paired_t_test(after: Sequence[float], before: Sequence[float] | None = None, *,
                  alternative: str = "greater") -> TTest:
    """One-tailed paired t-test of after - before (or of `after` against 0 when `before` is None).

    alternative: "greater" (the increase task: ΔAUC_t > 0) or "less" (decrease).
    With fewer than two pairs, or when every difference is exactly the same
    value (zero variance), the t statistic is undefined: `t` and `p` are NaN,
    `defined` is False and tables print "undefined". The check is exact, so
    differences that vary only in the last bits are still tested.

    Same statistic and p-value as `scipy.stats.ttest_1samp(diff, 0.0, alternative=...)`,
    computed the way it computes them (t from the ddof=1 variance, p from `stdtr`).
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be 'greater', 'less' or 'two-sided', got {alternative!r}")
    a = np.asarray(after, dtype=float)
    diff = a - np.asarray(before, dtype=float) if before is not None else a
    diff = diff[~np.isnan(diff)]
    mean = float(diff.mean()) if diff.size else float("nan")
    if diff.size < 2 or np.all(diff == diff[0]):
        return TTest(mean, float("nan"), float("nan"), int(diff.size), alternative,
                     0.0 if diff.size >= 2 else float("nan"))
    from scipy.special import stdtr  # Student t CDF; lazy, see the module docstring

    n = diff.size
    var = np.mean((diff - mean) ** 2) * (n / (n - 1))
    # Differences so close that their variance underflows to 0: t = +-inf (or NaN for mean 0), as in scipy.
    with np.errstate(divide="ignore", invalid="ignore"):
        t = float(mean / np.sqrt(var / n))
    if alternative == "greater":
        p = stdtr(n - 1, -t)
    elif alternative == "less":
        p = stdtr(n - 1, t)
    else:
        p = 2.0 * stdtr(n - 1, -abs(t))
    mde = minimum_detectable_effect(float(np.sqrt(var)), int(n), two_sided=alternative == "two-sided")
    return TTest(mean, t, float(p), int(n), alternative, mde)


def format_test(test: TTest, alpha: float = 0.05) -> str:
    """"+0.0476 (*)" when significant, "+0.0476" when not, "+0.0000 (undefined)" when undefined."""
    if test.n == 0:
        return "-"
    if not test.defined:
        return f"{test.mean:+.4f} (undefined)"
    return f"{test.mean:+.4f}{' (*)' if test.significant(alpha) else ''}"


# ----------------------------------------------------------------------------- confidence intervals

@dataclass(frozen=True)
class Estimate:
    """A mean (or ratio) with its two-sided confidence interval; `low`/`high` are NaN when n < 2
    or the interval is undefined (no variance to estimate from). `method` names how the interval
    was made (docs/statistics.md): "t", "delta" (a ratio), "bootstrap-bca", "bootstrap-percentile",
    "cluster-bootstrap", or "none" (every value equal: no spread observed)."""

    value: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    method: str = "t"

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_dict(self, scale: float = 1.0) -> dict:
        """As JSON: value, interval and n, each number times `scale`; undefined parts are null."""
        def num(x: float) -> float | None:
            return None if x is None or math.isnan(x) else float(x) * scale

        return {"value": num(self.value), "low": num(self.low), "high": num(self.high), "n": int(self.n)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Estimate:
        """`to_dict`'s JSON back as an estimate (null parts are NaN)."""
        def num(x: Any) -> float:
            return float("nan") if x is None else float(x)

        n = data.get("n", 0 if data.get("value") is None else 1)  # a hand-written dict may leave n out
        return cls(num(data.get("value")), num(data.get("low")), num(data.get("high")), int(n or 0))


def _t_quantile(df: int, confidence: float) -> float:
    from scipy.special import stdtrit  # inverse Student t CDF; lazy, see the module docstring

    return float(stdtrit(df, 0.5 + confidence / 2))


def mean_ci(values: Sequence[float | None], confidence: float = 0.95) -> Estimate:
    """Mean of the defined values with the Student t interval mean ± t_{n-1} s / sqrt(n)
    (s with ddof=1), as `scipy.stats.t.interval(confidence, n-1, mean, sem)` gives it. The one
    mean-and-interval function of the project: every table and figure reads an `Estimate`."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    x = np.asarray([v for v in values if v is not None], dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0, confidence)
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, float("nan"), float("nan"), 1, confidence)
    half = _t_quantile(x.size - 1, confidence) * float(x.std(ddof=1)) / np.sqrt(x.size)
    return Estimate(mean, mean - half, mean + half, int(x.size), confidence)


def ratio_ci(numerators: Sequence[float], denominators: Sequence[float],
             confidence: float = 0.95) -> Estimate:
    """The pooled ratio R = sum(y) / sum(x) over units (episodes) with the ratio estimator's interval:
    Var(R) ~ s_d^2 / (n xbar^2), d_i = y_i - R x_i (the delta method, Cochran 1977, 6.3), and
    R ± t_{n-1} sqrt(Var(R)). A unit with x = 0 (nothing found) still counts in n and in s_d.
    NaN value when sum(x) = 0."""
    y, x = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if y.shape != x.shape:
        raise ValueError(f"ratio_ci needs as many numerators as denominators, got {y.size} and {x.size}")
    n = int(x.size)
    if n == 0 or x.sum() == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), n, confidence, "delta")
    ratio = float(y.sum() / x.sum())
    if n < 2:
        return Estimate(ratio, float("nan"), float("nan"), n, confidence, "delta")
    d = y - ratio * x
    se = float(np.sqrt(d.var(ddof=1) / (n * x.mean() ** 2)))
    half = _t_quantile(n - 1, confidence) * se
    return Estimate(ratio, ratio - half, ratio + half, n, confidence, "delta")


@dataclass(frozen=True)
class PairedComparison:
    """method - reference over matched units: the mean difference with its t interval and the
    two-sided p-value of the Wilcoxon signed-rank test (NaN when undefined: fewer than one non-zero
    difference), and `mde`: the smallest true difference a paired t test on these pairs would find
    with 80% power (`ctrlsim.metrics.power`; NaN with fewer than two pairs)."""

    difference: Estimate
    p_wilcoxon: float
    n: int
    wins: int
    losses: int
    mde: float = float("nan")


def paired_comparison(method: Sequence[float], reference: Sequence[float],
                      confidence: float = 0.95) -> PairedComparison:
    """Paired comparison of two methods on the same units (box, target, seed)."""
    a, b = np.asarray(method, dtype=float), np.asarray(reference, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired_comparison needs matched units, got {a.size} and {b.size} values")
    diff = a - b
    diff = diff[~np.isnan(diff)]
    p = float("nan")
    if np.count_nonzero(diff):
        from scipy.stats import wilcoxon  # lazy: scipy.stats costs ~0.5 s to import

        # zero_method="wilcox" drops ties at zero, the classic test; exact p for small n.
        p = float(wilcoxon(diff, zero_method="wilcox", alternative="two-sided").pvalue)
    spread = float(diff.std(ddof=1)) if diff.size > 1 else float("nan")
    return PairedComparison(mean_ci(diff.tolist(), confidence), p, int(diff.size),
                            int((diff > 0).sum()), int((diff < 0).sum()),
                            minimum_detectable_effect(spread, int(diff.size), alpha=1 - confidence))


def format_estimate(estimate: Estimate, scale: float = 1.0, digits: int = 2, *, bounds: bool = False,
                    signed: bool = False, missing: str = "-") -> str:
    """The one text of an estimate in every table.

    "12.50 ± 3.10" (the interval's half-width; "12.50 ± n/a" with one unit), or with `bounds`
    "12.50 [9.40, 15.60]" ("12.50 [n/a]" without an interval): the bounds themselves, for intervals
    that need not be symmetric (bootstrap, Spearman). `signed` writes "+" before positive numbers;
    `missing` is the text where there is no value (no units, or an undefined one)."""
    if estimate.n == 0 or not np.isfinite(estimate.value):
        return missing

    def num(x: float) -> str:
        return f"{x * scale:{'+' if signed else ''}.{digits}f}"

    if np.isnan(estimate.low):
        return f"{num(estimate.value)} [n/a]" if bounds else f"{num(estimate.value)} ± n/a"
    if bounds:
        return f"{num(estimate.value)} [{num(estimate.low)}, {num(estimate.high)}]"
    return f"{num(estimate.value)} ± {estimate.half_width * scale:.{digits}f}"


# ----------------------------------------------------------------------------- calibration

def step_test(high: Sequence[float], low: Sequence[float]) -> TTest:
    """Two-sided paired test of high - low over matched units, for telling two dial settings apart.

    The paired t-test (`paired_t_test`); where it is undefined because every difference is the
    same value, the exact two-sided sign test takes over: p = 2 * 0.5^n for n equal non-zero
    differences (so three identical gains are p = 0.25, not significant), 1 for all zeros."""
    test = paired_t_test(high, low, alternative="two-sided")
    if test.defined or test.n == 0:
        return test
    p = 1.0 if test.mean == 0 else min(1.0, 2.0 * 0.5 ** test.n)
    return TTest(test.mean, float("nan"), p, test.n, "two-sided", test.mde)


@dataclass(frozen=True)
class Correlation:
    """Spearman's rho with a percentile bootstrap interval (NaN where undefined)."""

    rho: float
    low: float
    high: float
    n: int
    resamples: int


def spearman_ci(x: Sequence[float], y: Sequence[float], clusters: Sequence[object] | None = None, *,
                confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Correlation:
    """Spearman's rho between x and y, with a cluster bootstrap interval.

    `clusters` names the unit each observation belongs to (a seed's episode, a scenario): the
    bootstrap resamples whole clusters, so the observations of one unit at several x values stay
    together, as they are not independent. rho is NaN when x or y is constant."""
    from scipy.stats import spearmanr  # lazy: scipy.stats costs ~0.5 s to import

    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.shape != ys.shape:
        raise ValueError(f"spearman_ci needs as many x as y values, got {xs.size} and {ys.size}")
    ok = ~(np.isnan(xs) | np.isnan(ys))
    names = list(range(len(xs))) if clusters is None else [str(c) for c in clusters]
    labels = np.asarray(names, dtype=object)
    xs, ys, labels = xs[ok], ys[ok], labels[ok]

    def rho_of(a: np.ndarray, b: np.ndarray) -> float:
        if a.size < 3 or np.all(a == a[0]) or np.all(b == b[0]):
            return float("nan")
        return float(spearmanr(a, b).statistic)

    rho = rho_of(xs, ys)
    if np.isnan(rho):
        return Correlation(rho, float("nan"), float("nan"), int(xs.size), 0)
    groups = [np.flatnonzero(labels == c) for c in dict.fromkeys(labels.tolist())]
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        pick = np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))])
        draws.append(rho_of(xs[pick], ys[pick]))
    values = np.asarray(draws)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return Correlation(rho, float("nan"), float("nan"), int(xs.size), resamples)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Correlation(rho, float(low), float(high), int(xs.size), resamples)
