"""Significance tests used by the table runners."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class TTest:
    mean: float
    t: float
    p: float
    n: int
    alternative: str

    def significant(self, alpha: float = 0.05) -> bool:
        return bool(self.p < alpha)


def paired_t_test(after: Sequence[float], before: Sequence[float] | None = None, *,
                  alternative: str = "greater") -> TTest:
    """One-tailed paired t-test of after - before (or of `after` against 0 when `before` is None).

    alternative: "greater" (the increase task: ΔAUC_t > 0) or "less" (decrease).
    """
    a = np.asarray(after, dtype=float)
    diff = a - np.asarray(before, dtype=float) if before is not None else a
    diff = diff[~np.isnan(diff)]
    if diff.size < 2:
        return TTest(float(diff.mean()) if diff.size else float("nan"), float("nan"), float("nan"),
                     int(diff.size), alternative)
    if np.allclose(diff, diff[0]):  # zero variance: the test is undefined; report the direction exactly
        p = 0.0 if (diff[0] > 0 if alternative == "greater" else diff[0] < 0) else 1.0
        return TTest(float(diff.mean()), float("inf") if diff[0] else 0.0, p, int(diff.size), alternative)
    res = stats.ttest_1samp(diff, 0.0, alternative=alternative)
    return TTest(float(diff.mean()), float(res.statistic), float(res.pvalue), int(diff.size), alternative)
