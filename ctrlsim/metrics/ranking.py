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
    """Finite extrapolated rank-biased overlap (PromptShift eq.):

    RBO_p(S, T) = (1-p)/p * sum_{d=1..K} X_d/d * p^d + X_K/K * p^K,
    X_d = |S[:d] ∩ T[:d]|, K = the evaluation depth (the longer list's length).
    1.0 for identical lists, 0.0 for disjoint ones.
    """
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    k = max(len(list_a), len(list_b))
    if k == 0:
        return 1.0
    seen_a, seen_b, overlap, total = set(), set(), 0, 0.0
    for d in range(1, k + 1):  # X_d = |S[:d] ∩ T[:d]|, updated incrementally (lists hold distinct ids)
        a = list_a[d - 1] if d <= len(list_a) else None
        b = list_b[d - 1] if d <= len(list_b) else None
        if a is not None:
            seen_a.add(a)
        if b is not None:
            seen_b.add(b)
        overlap += (a is not None and a in seen_b) + (b is not None and b != a and b in seen_a)
        total += overlap / d * p ** d
    return float((1 - p) / p * total + overlap / k * p ** k)


def drift(list_a: Sequence[str], list_b: Sequence[str], p: float = 0.9) -> float:
    """PromptShift Drift = 1 - RBO_p."""
    return 1.0 - rbo(list_a, list_b, p)
