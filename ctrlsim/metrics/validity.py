"""The probe's own validity (issue 42): does it act on its goal, does it play its user?

Pure functions over decisions, each decision a (cluster, item kind, liked) triple:

- adherence  P(like | target item shown) - P(like | non-target item shown). 1 for a probe that likes
             exactly the targets, 0 for one that likes everything (or nothing, or at random).
- fidelity   the AUC of liking items its source user rated >= 4 over items rated <= 2 (ties, that is
             equal decisions, count one half: the Mann-Whitney U / (n_pos n_neg)). 0.5 is chance.
- relevance  the share of likes whose tags meet the persona's interests or its seed items' tags.

Intervals are percentile cluster-bootstrap intervals: a cluster is everything one probe decided in
one episode (its decisions are correlated; probes and episodes are not shared), resampled whole,
so the interval stays inside the statistic's range ([-1, 1] for adherence, [0, 1] for the AUC).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ctrlsim.metrics.stats import Estimate

BOOTSTRAP_RESAMPLES = 2000

CLUSTER = "cluster-bootstrap"  # the interval method of every estimate here


def like_rate(liked: Sequence[bool]) -> float:
    x = np.asarray(liked, dtype=float)
    return float(x.mean()) if x.size else float("nan")


def adherence(is_target: Sequence[bool], liked: Sequence[bool]) -> float:
    """P(like | target) - P(like | non-target); NaN when either kind was never shown."""
    t, x = np.asarray(is_target, dtype=bool), np.asarray(liked, dtype=bool)
    if not t.any() or t.all():
        return float("nan")
    return float(x[t].mean() - x[~t].mean())


def decision_auc(positive: Sequence[bool], score: Sequence[float]) -> float:
    """AUC of `score` (a 0/1 decision or a probability) separating positives from negatives, ties one
    half; NaN without both classes."""
    pos, s = np.asarray(positive, dtype=bool), np.asarray(score, dtype=float)
    if not pos.any() or pos.all():
        return float("nan")
    a, b = s[pos], s[~pos]
    greater = (a[:, None] > b[None, :]).sum()
    ties = (a[:, None] == b[None, :]).sum()
    return float((greater + 0.5 * ties) / (a.size * b.size))


def cluster_bootstrap(
    statistic: Callable[[np.ndarray], float],
    clusters: Sequence[object],
    *,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """`statistic(rows)` on all rows, with a percentile interval from resampling whole clusters.

    `clusters[i]` names row i's cluster; `statistic` gets an index array of rows (repeats allowed).
    Resamples where the statistic is undefined (NaN) are left out; `n` is the number of clusters.
    One cluster (or none) gives no interval (NaN bounds)."""
    labels = [str(c) for c in clusters]
    rows = np.arange(len(labels))
    value = statistic(rows) if len(labels) else float("nan")
    groups = [np.flatnonzero(np.asarray(labels, dtype=object) == c) for c in dict.fromkeys(labels)]
    if np.isnan(value) or len(groups) < 2:
        return Estimate(float(value), float("nan"), float("nan"), len(groups), confidence, CLUSTER)
    rng = np.random.default_rng(seed)
    draws = np.array(
        [
            statistic(np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))]))
            for _ in range(resamples)
        ]
    )
    draws = draws[~np.isnan(draws)]
    if draws.size == 0:
        return Estimate(float(value), float("nan"), float("nan"), len(groups), confidence, CLUSTER)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Estimate(float(value), float(low), float(high), len(groups), confidence, CLUSTER)


@dataclass(frozen=True)
class AdherenceCard:
    """Adherence with its interval, both like rates and how many items of each kind were decided."""

    adherence: Estimate
    like_target: float
    like_other: float
    n_target: int
    n_other: int

    @property
    def defined(self) -> bool:
        return not np.isnan(self.adherence.value)

    @property
    def passes(self) -> bool:
        """The card's rule: the adherence interval lies above 0 (a probe whose interval contains 0
        cannot be told from one that ignores its goal)."""
        return self.defined and not np.isnan(self.adherence.low) and self.adherence.low > 0


def adherence_card(
    clusters: Sequence[object], is_target: Sequence[bool], liked: Sequence[bool], *, seed: int = 0
) -> AdherenceCard:
    t, x = np.asarray(is_target, dtype=bool), np.asarray(liked, dtype=bool)
    estimate = cluster_bootstrap(lambda rows: adherence(t[rows], x[rows]), clusters, seed=seed)
    return AdherenceCard(estimate, like_rate(x[t]), like_rate(x[~t]), int(t.sum()), int((~t).sum()))


def fidelity_auc(
    clusters: Sequence[object], positive: Sequence[bool], score: Sequence[float], *, seed: int = 0
) -> Estimate:
    """The fidelity AUC (rated >= 4 over rated <= 2) with its cluster-bootstrap interval."""
    pos, s = np.asarray(positive, dtype=bool), np.asarray(score, dtype=float)
    return cluster_bootstrap(lambda rows: decision_auc(pos[rows], s[rows]), clusters, seed=seed)


def share_ci(clusters: Sequence[object], hits: Sequence[bool], *, seed: int = 0) -> Estimate:
    """A share (e.g. relevant likes among all likes) with its cluster-bootstrap interval."""
    h = np.asarray(hits, dtype=bool)
    return cluster_bootstrap(lambda rows: like_rate(h[rows]), clusters, seed=seed)
