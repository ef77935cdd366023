"""The three CtrlBench-Rec controllability tasks as reward + metric hooks.

A task sees what the environment saw (slates shown, items liked) and turns it
into a per-step reward and named figures; it never touches the recommender.
`ProbeEnv` uses one task per probe episode; `PopulationEnv` uses the same
task object for all probes and `population_metrics` for the aggregate.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.metrics import controllability as M

# Where a slate came from. Metrics count only what the recommender surfaced (CtrlBench-Rec
# Appendix B: a_t in L_t or a skip); search results are reported apart.
SOURCE_RECOMMENDER, SOURCE_SEARCH = "recommender", "search"


@dataclass
class ProbeRecord:
    """What one probe did in one episode; tasks compute everything from this."""

    seed_history: tuple[str, ...]
    likes: list[str] = field(default_factory=list)          # new likes, in order, whatever the source
    likes_per_round: list[list[str]] = field(default_factory=list)
    slates: list[list[int]] = field(default_factory=list)   # catalogue indices shown per round
    sources: list[str] = field(default_factory=list)        # per round: "recommender" or "search"
    queries: list[str] = field(default_factory=list)        # per round: the query issued ("" = none)
    tokens: int = 0
    # Explicit negative feedback (envs made with negative_feedback=True): items marked "not
    # interested" and disliked, tags blocked (each once, in order), and per round what was given.
    not_interested: list[str] = field(default_factory=list)
    disliked: list[str] = field(default_factory=list)
    blocked_tags: list[str] = field(default_factory=list)
    feedback_per_round: list[dict] = field(default_factory=list)

    def add_feedback(self, not_interested: Sequence[str], disliked: Sequence[str], block: str | None) -> None:
        """One round's negative feedback (an item or tag already given counts once)."""
        self.not_interested.extend(i for i in dict.fromkeys(not_interested) if i not in self.not_interested)
        self.disliked.extend(i for i in dict.fromkeys(disliked) if i not in self.disliked)
        if block is not None and block not in self.blocked_tags:
            self.blocked_tags.append(block)
        self.feedback_per_round.append({"not_interested": list(not_interested), "disliked": list(disliked),
                                        "block": block})

    @property
    def history(self) -> tuple[str, ...]:
        """Everything the probe liked (what the black box sees), search-found items included."""
        return self.seed_history + tuple(self.likes)

    def from_recommender(self, n: int) -> bool:
        """Whether round n's slate came from the recommender (a record built without sources, e.g.
        by hand, counts every round as the recommender's)."""
        return n >= len(self.sources) or self.sources[n] == SOURCE_RECOMMENDER

    @property
    def recommender_likes_per_round(self) -> list[list[str]]:
        """Per round, the likes on a recommender slate (C_j^t); a search round gives []."""
        return [likes if self.from_recommender(n) else [] for n, likes in enumerate(self.likes_per_round)]

    @property
    def recommender_likes(self) -> list[str]:
        """C_j: the likes the metrics count, those on slates the recommender built (in order)."""
        found_by_search = set(self.search_likes)  # an item is liked at most once per probe
        return [i for i in self.likes if i not in found_by_search]

    @property
    def search_likes(self) -> list[str]:
        """Likes on search-result slates: they shape the history but are not the recommender's doing."""
        return [i for n, r in enumerate(self.likes_per_round) if not self.from_recommender(n) for i in r]

    @property
    def recommender_slates(self) -> list[list[int]]:
        return [s for n, s in enumerate(self.slates) if self.from_recommender(n)]


class Task(ABC):
    """Base task: names the target and defines reward and metrics."""

    name = "task"

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    @property
    def config(self) -> dict:
        return {"task": self.name}

    @abstractmethod
    def step_reward(self, record: ProbeRecord, new_likes: Sequence[str], slate: Sequence[int]) -> float:
        """Reward for one round, after `new_likes` were appended to the record."""

    def probe_metrics(self, record: ProbeRecord) -> dict[str, float]:
        return {"likes": len(record.recommender_likes), "search_likes": len(record.search_likes)}

    def population_metrics(self, records: Sequence[ProbeRecord]) -> dict[str, float]:
        return {"avg_len": M.average_behaviour_length([r.recommender_likes for r in records]),
                "avg_tokens": M.average_tokens([r.tokens for r in records]),
                "search_likes": float(sum(len(r.search_likes) for r in records))}


def _target_items(dataset: Dataset, target: str | Sequence[str]) -> tuple[list[str], list[str]]:
    """(target tags, target item ids) for a tag name or a list of tags."""
    tags = [target] if isinstance(target, str) else list(target)
    if not tags:
        raise ConfigError("the target needs at least one tag")
    items: dict[str, None] = {}
    for tag in tags:
        items.update(dict.fromkeys(dataset.items_with_tag(tag)))
    return tags, list(items)


class TargetDiscovery(Task):
    """Task 1. Reward: newly liked target items this round. Metrics: Coverage, Exploration
    Efficiency, average behaviour length and tokens (Table 5)."""

    name = "target-discovery"

    def __init__(self, dataset: Dataset, target: str | Sequence[str] = "Film-Noir"):
        super().__init__(dataset)
        self.tags, items = _target_items(dataset, target)
        self.target = set(items)

    @property
    def config(self) -> dict:
        return {"task": self.name, "target": self.tags, "target_size": len(self.target)}

    def step_reward(self, record, new_likes, slate) -> float:
        earlier = set(record.history[: len(record.history) - len(new_likes)])
        return float(sum(1 for i in dict.fromkeys(new_likes) if i in self.target and i not in earlier))

    def probe_metrics(self, record) -> dict[str, float]:
        likes = record.recommender_likes
        found = M.discovered_targets([likes], self.target)
        return {**super().probe_metrics(record), "targets_discovered": len(found),
                "coverage": M.coverage([likes], self.target)}

    def population_metrics(self, records) -> dict[str, float]:
        likes = [r.recommender_likes for r in records]
        return {"coverage": M.coverage(likes, self.target),
                # `efficiency` as the paper's code computes it; Table 5's literal formula beside it
                # (see `target_exploration_efficiency` for why the two differ).
                "efficiency": M.target_exploration_efficiency(likes, self.target),
                "efficiency_all_likes": M.exploration_efficiency(likes, self.target),
                **super().population_metrics(records)}


class ProfileShaping(Task):
    """Task 2. The probe's behaviour vector is the mean of its centred item vectors
    (appendix D.7); accuracy is its cosine to the target centroid, smoothness the cosine
    between checkpoints t and t+3 (Table 8). The JS divergence between the tag
    distribution of the slates seen and the target distribution is eq. 2.
    Reward: the change in accuracy this round.

    item_vectors: "tags" (multi-hot tags, no model) or an encoder spec ("minilm", ...).
    """

    name = "profile-shaping"

    def __init__(self, dataset: Dataset, target: str | Sequence[str] | Mapping[str, float] = ("Action",),
                 item_vectors: str = "tags"):
        super().__init__(dataset)
        weights = target if isinstance(target, Mapping) else None
        tags: str | Sequence[str] = list(target) if isinstance(target, Mapping) else target
        self.tags, items = _target_items(dataset, tags)
        self.target = set(items)
        self.vector_source = item_vectors
        self.vectors = self._item_vectors(item_vectors)
        self.global_mean = self.vectors.mean(axis=0)
        self.target_vector = (self.vectors[dataset.indices(items)] - self.global_mean).mean(axis=0)
        self.all_tags = dataset.tags
        self.target_dist = M.target_distribution(self.all_tags, weights or self.tags)
        self._item_tags = dataset.items["tags"].tolist()

    def _item_vectors(self, source: str) -> np.ndarray:
        if source == "tags":
            index = {t: n for n, t in enumerate(self.dataset.tags)}
            vecs = np.zeros((len(self.dataset.items), len(index)))
            for row, tags in enumerate(self.dataset.items["tags"]):
                vecs[row, [index[t] for t in tags]] = 1.0
            return vecs
        from ctrlsim.backends import load_encoder

        return load_encoder(source).encode(self.dataset.items["text"].tolist()).astype(np.float64)

    @property
    def config(self) -> dict:
        return {"task": self.name, "target": self.tags, "item_vectors": self.vector_source}

    def accuracy(self, history: Sequence[str]) -> float:
        if not history:
            return 0.0
        v = M.centred_profile_vector(self.vectors[self.dataset.indices(history)], self.global_mean)
        return M.cosine(v, self.target_vector)

    def step_reward(self, record, new_likes, slate) -> float:
        before = record.history[: len(record.history) - len(new_likes)]
        return self.accuracy(record.history) - self.accuracy(before)

    def trajectory(self, record: ProbeRecord) -> list[np.ndarray]:
        """Behaviour vector after each round (index 0 = seed history), from recommender-slate likes."""
        hist = list(record.seed_history)
        out = [M.centred_profile_vector(self.vectors[self.dataset.indices(hist)], self.global_mean)]
        for likes in record.recommender_likes_per_round:
            hist.extend(likes)
            out.append(M.centred_profile_vector(self.vectors[self.dataset.indices(hist)], self.global_mean))
        return out

    def probe_metrics(self, record) -> dict[str, float | None]:  # type: ignore[override]
        traj = self.trajectory(record)
        smooth = M.trajectory_smoothness(traj, lag=3)
        shown = [self._item_tags[i] for s in record.recommender_slates for i in s]
        return {"accuracy": M.cosine(traj[-1], self.target_vector),
                "accuracy_start": M.cosine(traj[0], self.target_vector),
                # None, not NaN, before t+3 exists: NaN != NaN breaks equality of infos.
                "smoothness": float(np.mean(smooth)) if smooth else None,
                "js_divergence": M.js_divergence(M.tag_distribution(shown, self.all_tags), self.target_dist),
                **super().probe_metrics(record)}

    def population_metrics(self, records) -> dict[str, float | None]:  # type: ignore[override]
        per = [self.probe_metrics(r) for r in records]
        out: dict[str, float | None] = {k: float(np.nanmean([p[k] for p in per]))  # type: ignore[arg-type]
                                        for k in ("accuracy", "accuracy_start", "js_divergence")}
        smooth = [p["smoothness"] for p in per if p["smoothness"] is not None]
        out["smoothness"] = float(np.mean(smooth)) if smooth else None
        return {**out, **super().population_metrics(records)}


class PopularityBias(Task):
    """Task 3. Metric: eq. 3, the mean popularity of the items the probes interacted with
    (`mean_popularity`: liked on recommender slates, Table 3's i_t; NaN before any like),
    beside the mean popularity of the recommended slates (`slate_popularity`) and the
    catalogue mean; long-tail discovery counts liked items below the popularity quantile
    `tail_quantile`. Reward: minus the slate's mean popularity / max popularity (a shaping
    signal an RL probe can act on every round)."""

    name = "popularity-bias"

    def __init__(self, dataset: Dataset, tail_quantile: float = 0.8,
                 target: str | Sequence[str] | None = None):
        super().__init__(dataset)
        if not 0 < tail_quantile < 1:
            raise ConfigError(f"tail_quantile must be in (0, 1), got {tail_quantile}")
        self.popularity = dataset.items["popularity"].to_numpy(dtype=np.float64)
        self.tail_quantile = tail_quantile
        cutoff = np.quantile(self.popularity, tail_quantile)
        self.long_tail = set(dataset.item_ids[self.popularity <= cutoff])
        self.tags, items = _target_items(dataset, target) if target else ([], [])
        self.target = set(items)

    @property
    def config(self) -> dict:
        return {"task": self.name, "tail_quantile": self.tail_quantile, "target": self.tags}

    def step_reward(self, record, new_likes, slate) -> float:
        if len(slate) == 0:
            return 0.0
        return -float(self.popularity[np.asarray(slate)].mean() / max(self.popularity.max(), 1.0))

    def probe_metrics(self, record) -> dict[str, float | None]:  # type: ignore[override]
        shown = [i for s in record.recommender_slates for i in s]
        liked = list(self.dataset.indices(record.recommender_likes))
        # None, not NaN, before the first like: NaN != NaN breaks equality of infos.
        return {"mean_popularity": M.interaction_popularity(self.popularity, liked) if liked else None,
                "slate_popularity": M.mean_popularity(self.popularity, shown),
                "long_tail_likes": sum(1 for i in record.recommender_likes if i in self.long_tail),
                **super().probe_metrics(record)}

    def population_metrics(self, records) -> dict[str, float | None]:  # type: ignore[override]
        shown = [i for r in records for s in r.recommender_slates for i in s]
        liked = [i for r in records for i in self.dataset.indices(r.recommender_likes)]
        out = {"mean_popularity": M.interaction_popularity(self.popularity, liked) if liked else None,
               "slate_popularity": M.mean_popularity(self.popularity, shown),
               "catalogue_mean_popularity": float(self.popularity.mean()),
               "long_tail_discovered": len({i for r in records for i in r.recommender_likes
                                            if i in self.long_tail})}
        if self.target:
            out["coverage"] = M.coverage([r.recommender_likes for r in records], self.target)
        return {**out, **super().population_metrics(records)}


TASKS = {cls.name: cls for cls in (TargetDiscovery, ProfileShaping, PopularityBias)}


def make_task(name: str, dataset: Dataset, **options) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name](dataset, **options)
