"""Significance tests used by the table runners.

scipy is imported inside the functions, and only `scipy.special`: `scipy.stats`
alone costs about half a second of import time, paid by every run even when
every record comes from the cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class TTest:
    """A one-sample (paired) t-test; `t` and `p` are NaN when the test is undefined."""

    mean: float
    t: float
    p: float
    n: int
    alternative: str

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
        return TTest(mean, float("nan"), float("nan"), int(diff.size), alternative)
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
    return TTest(mean, t, float(p), int(n), alternative)


def format_test(test: TTest, alpha: float = 0.05) -> str:
    """"+0.0476 (*)" when significant, "+0.0476" when not, "+0.0000 (undefined)" when undefined."""
    if test.n == 0:
        return "-"
    if not test.defined:
        return f"{test.mean:+.4f} (undefined)"
    return f"{test.mean:+.4f}{' (*)' if test.significant(alpha) else ''}"
