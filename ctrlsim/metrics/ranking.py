"""Ranking metrics shared by SteerEval, PromptShift and the runners (pure functions).

`ranking` is always a sequence of item ids, best first; `relevant` a set of ids.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def auc_t(ranking: Sequence[str], relevant: set[str]) -> float:
    """Tag AUC: the share of (relevant, irrelevant) pairs where the relevant item ranks higher.

    1.0 when all relevant items precede all irrelevant ones, 0.0 for the reverse,
    0.5 expected for a random ranking; NaN when either group is empty. Equals
    SteerEval's `roc_auc_score(labels, n - position)`.
    """
    labels = np.array([item in relevant for item in ranking], dtype=bool)
    n_rel, n_irr = int(labels.sum()), int((~labels).sum())
    if n_rel == 0 or n_irr == 0:
        return float("nan")
    # For each relevant item, count irrelevant items ranked below it.
    irrelevant_below = np.cumsum((~labels)[::-1])[::-1]
    return float(irrelevant_below[labels].sum() / (n_rel * n_irr))


def rank_set(ranking: Sequence[str], item: str, relevant: set[str]) -> int:
    """1-based rank of `item` among the items of its own relevance subset (Rank_set)."""
    if item not in ranking:
        raise ValueError(f"item {item!r} is not in the ranking")
    own = item in relevant
    subset = [i for i in ranking if (i in relevant) == own]
    return subset.index(item) + 1


def _gains(ranking: Sequence[str], relevant: set[str] | dict[str, float], k: int) -> np.ndarray:
    if isinstance(relevant, dict):
        return np.array([float(relevant.get(i, 0.0)) for i in ranking[:k]])
    return np.array([1.0 if i in relevant else 0.0 for i in ranking[:k]])


def ndcg_at_k(ranking: Sequence[str], relevant: set[str] | dict[str, float], k: int) -> float:
    """NDCG@k with gain 2^g - 1 (g = 1 for a set member, or the graded value) and log2 discount."""
    if k < 1:
        raise ValueError("k must be >= 1")
    gains = _gains(ranking, relevant, k)
    discounts = 1.0 / np.log2(np.arange(2, len(gains) + 2))
    dcg = float(((2.0 ** gains - 1.0) * discounts).sum())
    ideal_values = sorted(relevant.values() if isinstance(relevant, dict) else [1.0] * len(relevant),
                          reverse=True)[:k]
    ideal = np.array(ideal_values, dtype=float)
    idcg = float(((2.0 ** ideal - 1.0) / np.log2(np.arange(2, len(ideal) + 2))).sum())
    return dcg / idcg if idcg > 0 else 0.0


def hit_rate_at_k(ranking: Sequence[str], relevant: set[str], k: int) -> float:
    """1.0 if any relevant item is in the top k."""
    return float(any(i in relevant for i in ranking[:k]))


def mrr_at_k(ranking: Sequence[str], relevant: set[str], k: int) -> float:
    """Reciprocal rank of the first relevant item within the top k (0 if none)."""
    for pos, item in enumerate(ranking[:k], 1):
        if item in relevant:
            return 1.0 / pos
    return 0.0


def coverage_at_k(ranking: Sequence[str], relevant: set[str], k: int) -> float:
    """Share of the top k that is relevant (UCL's Coverage@k for tag steering)."""
    top = list(ranking[:k])
    return sum(1 for i in top if i in relevant) / len(top) if top else 0.0


def rbo(list_a: Sequence[str], list_b: Sequence[str], p: float = 0.9) -> float:
    """Extrapolated rank-biased overlap RBO_ext (Webber, Moffat & Zobel 2010, eq. 32; PromptShift's RBO_p).

    With S the shorter list (length s), L the longer (length l), and X_d the
    overlap of the two lists' top d (for d > s, of all of S with L's top d):

        RBO = (1-p)/p * [ sum_{d=1..l} X_d/d p^d + sum_{d=s+1..l} X_s (d-s)/(s d) p^d ]
              + [ (X_l - X_s)/l + X_s/s ] p^l

    For lists of equal length K the second sum and X_l - X_s vanish, leaving
    PromptShift's formula (1-p)/p * sum_{d=1..K} X_d/d p^d + X_K/K p^K. For
    unequal lengths the shorter list's unseen continuation is assumed to agree
    at the rate it agreed so far (X_s / s), rather than counting the missing
    positions as mismatches: a list that is a prefix of the other scores 1.0.
    Identical lists give 1.0, disjoint ones 0.0; two empty lists 1.0 and an
    empty list against a non-empty one 0.0 (nothing agrees). Each list must
    hold distinct items.
    """
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    a, b = list(list_a), list(list_b)
    for name, items in (("list_a", a), ("list_b", b)):
        if len(set(items)) != len(items):
            raise ValueError(f"{name} repeats an item; RBO compares rankings of distinct items")
    if a == b:  # exactly 1.0: the sums below reach it only up to rounding
        return 1.0
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    s, n = len(short), len(long_)
    if s == 0:
        return 0.0
    seen_short, seen_long, overlap = set(), set(), 0
    overlaps = np.zeros(n + 1)
    for d in range(1, n + 1):  # X_d, updated incrementally
        item_l = long_[d - 1]
        if d <= s:
            item_s = short[d - 1]
            overlap += 1 if item_s == item_l else (item_s in seen_long) + (item_l in seen_short)
            seen_short.add(item_s)
        else:
            overlap += item_l in seen_short
        seen_long.add(item_l)
        overlaps[d] = overlap
    depths = np.arange(1, n + 1, dtype=float)
    weights = p ** depths
    x_s, x_l = overlaps[s], overlaps[n]
    agreement = float((overlaps[1:] / depths * weights).sum())
    tail = depths > s
    extrapolated = float((x_s * (depths[tail] - s) / (s * depths[tail]) * weights[tail]).sum())
    return float((1 - p) / p * (agreement + extrapolated) + ((x_l - x_s) / n + x_s / s) * p ** n)


def drift(list_a: Sequence[str], list_b: Sequence[str], p: float = 0.9) -> float:
    """PromptShift Drift = 1 - RBO_p."""
    return 1.0 - rbo(list_a, list_b, p)
