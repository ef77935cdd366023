"""CtrlBench-Rec's controllability metrics (Tables 5 and 8, eq. 3) as pure functions.

Inputs are plain Python/numpy values (per-probe lists of liked item ids,
vectors, popularity arrays), so the same functions serve the envs' `info`,
the population runner and offline analysis.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np


def discovered_targets(likes_per_probe: Iterable[Iterable[str]], target: set[str]) -> set[str]:
    """Distinct target items liked by any probe ("discovered" means liked, never merely shown)."""
    found: set[str] = set()
    for likes in likes_per_probe:
        found.update(i for i in likes if i in target)
    return found


def coverage(likes_per_probe: Sequence[Sequence[str]], target: set[str]) -> float:
    """Coverage = |T ∩ (∪_j H_j)| / |T| (Table 5)."""
    if not target:
        return float("nan")
    return len(discovered_targets(likes_per_probe, target)) / len(target)


def exploration_efficiency(likes_per_probe: Sequence[Sequence[str]], target: set[str]) -> float:
    """Σ_j |C_j| / |T ∩ (∪_j H_j)| (Table 5; lower is better; inf when nothing was discovered).

    C_j are the items probe j interacted with (clicked/liked) in the episode.
    """
    found = len(discovered_targets(likes_per_probe, target))
    total = sum(len(likes) for likes in likes_per_probe)
    return total / found if found else float("inf")


def target_exploration_efficiency(likes_per_probe: Sequence[Sequence[str]], target: set[str]) -> float:
    """Σ_j |C_j ∩ T| / |T ∩ (∪_j H_j)|: target likes (repeats across probes counted) per distinct target
    discovered (lower is better; 1 = no probe liked a target another probe had already found).

    The CtrlBench-Rec code computes Exploration Efficiency this way. Table 5's literal formula
    (`exploration_efficiency`, all likes in the numerator) cannot give the paper's own Table 7:
    Amazon Base-Large there has Len 34.5 over 100 probes (3,450 likes) and Eff 4.32, so ~800 distinct
    targets discovered, yet 8.78% coverage of even the whole 4,234-item catalogue is only 372 items.
    """
    found = len(discovered_targets(likes_per_probe, target))
    total = sum(1 for likes in likes_per_probe for i in likes if i in target)
    return total / found if found else float("inf")


def average_behaviour_length(likes_per_probe: Sequence[Sequence[str]]) -> float:
    """Len = (1/K) Σ_j |C_j|."""
    return float(np.mean([len(x) for x in likes_per_probe])) if likes_per_probe else float("nan")


def average_tokens(tokens_per_probe: Sequence[int]) -> float:
    return float(np.mean(tokens_per_probe)) if len(tokens_per_probe) else float("nan")


def centred_profile_vector(behaviour: np.ndarray, global_mean: np.ndarray) -> np.ndarray:
    """V_user = (1/|H|) Σ_{e∈H} (e − ē_global) (appendix D.7)."""
    behaviour = np.atleast_2d(behaviour)
    if behaviour.size == 0:
        return np.zeros_like(global_mean)
    return (behaviour - global_mean).mean(axis=0)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 0.0
    return float(a @ b / (na * nb))


def trajectory_smoothness(vectors: Sequence[np.ndarray], lag: int = 3) -> list[float]:
    """cos(V_t, V_{t+lag}) for consecutive checkpoints (Table 8)."""
    return [cosine(vectors[t], vectors[t + lag]) for t in range(0, len(vectors) - lag)]


def tag_distribution(item_tags: Iterable[Sequence[str]], tags: Sequence[str]) -> np.ndarray:
    """Normalised counts of `tags` over items (an item with g tags adds 1/g to each)."""
    index = {t: n for n, t in enumerate(tags)}
    counts = np.zeros(len(tags))
    for item in item_tags:
        own = [index[t] for t in item if t in index]
        for k in own:
            counts[k] += 1.0 / len(own)
    total = counts.sum()
    return counts / total if total else counts


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (base 2, in [0, 1]); 1.0 when p has no mass."""
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if p.sum() == 0 or q.sum() == 0:
        return 1.0
    from scipy.spatial.distance import jensenshannon  # lazy: scipy.spatial costs ~0.2 s to import

    return float(jensenshannon(p, q, base=2) ** 2)


def target_distribution(tags: Sequence[str], weights: Mapping[str, float] | Sequence[str]) -> np.ndarray:
    """A target distribution over `tags`: uniform over a list of tags, or given weights."""
    if not isinstance(weights, Mapping):
        weights = {t: 1.0 for t in weights}
    v = np.array([float(weights.get(t, 0.0)) for t in tags])
    if v.sum() <= 0:
        raise ValueError(f"target distribution has no mass on the known tags: {dict(weights)}")
    return v / v.sum()


def mean_popularity(item_popularity: np.ndarray, shown_indices: Iterable[int]) -> float:
    """(1/KN) Σ_j Σ_t pop(i_t^{(j)}) over every recommended item index (eq. 3)."""
    idx = np.fromiter(shown_indices, dtype=np.int64)
    return float(item_popularity[idx].mean()) if idx.size else float("nan")


# ----------------------------------------------------------------------------- Task 2 (Figure 7, Table 2)

# Table 2's checkpoints: intervals t0-t3, t3-t6, ..., t15-t18, t18-t20.
SMOOTHNESS_EDGES = (0, 3, 6, 9, 12, 15, 18, 20)


def interval_smoothness(vectors: Sequence[np.ndarray],
                        edges: Sequence[int] = SMOOTHNESS_EDGES) -> list[float]:
    """cos(V_a, V_b) for each interval (a, b) of consecutive `edges` (Table 2's layout).

    `vectors[t]` is the behaviour vector after round t (index 0 = the seed history); intervals
    that end past the trajectory are left out, so a 10-round episode gives t0-t3 ... t6-t9.
    """
    return [cosine(vectors[a], vectors[b]) for a, b in zip(edges[:-1], edges[1:]) if b < len(vectors)]


def similarity_curve(vectors: Sequence[np.ndarray], reference: np.ndarray) -> list[float]:
    """cos(V_t, reference) for every round t: the target similarity (Acc., Table 8) or, with the
    centred centroid of the seed interests as reference, the old-interest similarity of Figure 7."""
    return [cosine(v, reference) for v in vectors]


# ----------------------------------------------------------------------------- Task 3 (Figures 8, 9)

def new_discoveries_per_round(likes_per_round_per_probe: Sequence[Sequence[Sequence[str]]], target: set[str],
                              rounds: int | None = None) -> list[int]:
    """Target items the population discovered for the first time in each round (Figure 8).

    `likes_per_round_per_probe[j][t]` are probe j's new likes in round t+1. An item liked by two
    probes in the same round counts once; the counts sum to the number of distinct targets found.
    """
    n = rounds if rounds is not None else max((len(p) for p in likes_per_round_per_probe), default=0)
    seen: set[str] = set()
    out = []
    for t in range(n):
        fresh = {i for probe in likes_per_round_per_probe if t < len(probe) for i in probe[t]
                 if i in target and i not in seen}
        seen |= fresh
        out.append(len(fresh))
    return out


def interaction_popularity(item_popularity: np.ndarray, interacted_indices: Iterable[int]) -> float:
    """Eq. 3 over the items the probes interacted with (liked): (1/|I|) Σ_{i∈I} pop(i).

    With one interaction per probe and round this is eq. 3's (1/KN) Σ_j Σ_t pop(i_t^(j)); probes
    that like several items in a round (or none) are averaged over what they actually liked.
    """
    return mean_popularity(item_popularity, interacted_indices)


def popularity_per_round(item_popularity: np.ndarray,
                         indices_per_round_per_probe: Sequence[Sequence[Sequence[int]]],
                         rounds: int | None = None) -> list[float]:
    """Mean popularity of the items interacted with in each round over all probes (NaN: none)."""
    n = rounds if rounds is not None else max((len(p) for p in indices_per_round_per_probe), default=0)
    return [mean_popularity(item_popularity, [i for probe in indices_per_round_per_probe if t < len(probe)
                                              for i in probe[t]]) for t in range(n)]
