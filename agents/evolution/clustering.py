"""Cluster phase: scikit-learn K-means over the probe vectors, seeded (Algorithm 1 line 15).

Two rules for k: `"halve"` takes k = ceil(N/2), the paper's 100 -> 50 -> 25 schedule;
`"silhouette"` tries every k in [ceil(N/2), floor(3N/4)] and keeps the best silhouette
score, as the public code does. Every generation records k, the silhouette score (None
where it is undefined: one cluster, or as many clusters as points) and the membership.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ctrlsim.errors import ConfigError

K_RULES = ("halve", "silhouette")


@dataclass(frozen=True)
class Clustering:
    """One generation's partition. `members[c]` are row indices of cluster c, clusters in order of
    their first member (so labels do not depend on K-means' arbitrary numbering)."""

    k: int
    k_rule: str
    labels: tuple[int, ...]
    members: tuple[tuple[int, ...], ...]
    silhouette: float | None
    candidates: dict = field(default_factory=dict)  # k -> silhouette, for the silhouette rule

    def to_dict(self) -> dict:
        d = asdict(self)
        d["labels"], d["members"] = list(self.labels), [list(m) for m in self.members]
        d["candidates"] = {str(k): v for k, v in self.candidates.items()}
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "Clustering":
        return cls(
            k=int(data["k"]),
            k_rule=data["k_rule"],
            labels=tuple(data["labels"]),
            members=tuple(tuple(m) for m in data["members"]),
            silhouette=data["silhouette"],
            candidates={int(k): v for k, v in data.get("candidates", {}).items()},
        )


def halving_k(n: int) -> int:
    return max(1, math.ceil(n / 2))


def silhouette_range(n: int) -> range:
    """Candidate k for the silhouette rule: [ceil(N/2), floor(3N/4)], kept inside [2, N-1]."""
    low = max(2, math.ceil(n / 2))
    high = min(n - 1, max(low, (3 * n) // 4))
    return range(low, high + 1)


def _kmeans_labels(vectors: np.ndarray, k: int, seed: int, n_init: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    if k == 1:
        return np.zeros(len(vectors), dtype=np.int64)
    return KMeans(n_clusters=k, random_state=seed, n_init=n_init).fit_predict(vectors)


def _silhouette(vectors: np.ndarray, labels: np.ndarray) -> float | None:
    from sklearn.metrics import silhouette_score

    n_labels = len(set(labels.tolist()))
    if not 2 <= n_labels <= len(vectors) - 1:
        return None
    return float(silhouette_score(vectors, labels))


def _canonical(labels: np.ndarray) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    order: dict[int, int] = {}
    for lab in labels.tolist():
        order.setdefault(lab, len(order))
    relabelled = tuple(order[lab] for lab in labels.tolist())
    members = tuple(tuple(i for i, lab in enumerate(relabelled) if lab == c) for c in range(len(order)))
    return relabelled, members


def cluster_population(
    vectors: np.ndarray, *, seed: int, k_rule: str = "halve", n_init: int = 5
) -> Clustering:
    """Partition the rows of `vectors` (N probes) with K-means seeded by `seed`."""
    if k_rule not in K_RULES:
        raise ConfigError(f"k_rule must be one of {K_RULES}, got {k_rule!r}")
    vectors = np.asarray(vectors, dtype=np.float64)
    n = len(vectors)
    if n == 0:
        raise ConfigError("cannot cluster an empty population")
    candidates: dict[int, float | None] = {}
    if k_rule == "halve" or n < 3:
        k = halving_k(n)
        labels = _kmeans_labels(vectors, k, seed, n_init)
    else:
        best = None
        for k_try in silhouette_range(n):
            labels_try = _kmeans_labels(vectors, k_try, seed, n_init)
            score = _silhouette(vectors, labels_try)
            candidates[k_try] = score
            if best is None or (score is not None and (best[0] is None or score > best[0])):
                best = (score, k_try, labels_try)
        _, k, labels = best
    relabelled, members = _canonical(np.asarray(labels))
    return Clustering(
        k=k,
        k_rule=k_rule,
        labels=relabelled,
        members=members,
        silhouette=_silhouette(vectors, np.asarray(relabelled)),
        candidates=candidates,
    )
