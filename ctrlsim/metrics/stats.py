"""Significance tests used by the table runners."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats


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
    differences that vary only in the last bits are still tested (by scipy).
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be 'greater', 'less' or 'two-sided', got {alternative!r}")
    a = np.asarray(after, dtype=float)
    diff = a - np.asarray(before, dtype=float) if before is not None else a
    diff = diff[~np.isnan(diff)]
    mean = float(diff.mean()) if diff.size else float("nan")
    if diff.size < 2 or np.all(diff == diff[0]):
        return TTest(mean, float("nan"), float("nan"), int(diff.size), alternative)
    res = stats.ttest_1samp(diff, 0.0, alternative=alternative)
    return TTest(mean, float(res.statistic), float(res.pvalue), int(diff.size), alternative)


def format_test(test: TTest, alpha: float = 0.05) -> str:
    """"+0.0476 (*)" when significant, "+0.0476" when not, "+0.0000 (undefined)" when undefined."""
    if test.n == 0:
        return "-"
    if not test.defined:
        return f"{test.mean:+.4f} (undefined)"
    return f"{test.mean:+.4f}{' (*)' if test.significant(alpha) else ''}"
