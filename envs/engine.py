"""The interaction loop shared by `ProbeEnv` and `PopulationEnv`.

Each round every live probe acts on its current slate (likes some positions,
optionally issues a search query); likes are appended to its history in the
black box; then all probes that did not search get their next slate from ONE
batched `recommend` call, and searching probes get BM25 search results.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from gymnasium import spaces

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset
from ctrlsim.errors import BudgetExceededError, ConfigError
from ctrlsim.recommenders import Recommender, UserState
from ctrlsim.recommenders.search import CatalogueSearch

from .tasks import ProbeRecord, Task

QUERY_CHARSET = string.ascii_letters + string.digits + " -'&:,.!?"
SOURCE_RECOMMENDER, SOURCE_SEARCH = 0, 1


@dataclass(frozen=True)
class ProbeSpec:
    """Who a probe is: seed history (liked items, oldest first), optional profile and attributes."""

    history: tuple[str, ...]
    profile: str | None = None
    attributes: Mapping[str, object] = field(default_factory=dict)
    name: str | None = None


@dataclass
class Probe:
    """Runtime state of one probe in an episode."""

    key: str
    spec: ProbeSpec
    record: ProbeRecord
    slate: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    source: int = SOURCE_RECOMMENDER
    shown: dict = field(default_factory=dict)  # catalogue index -> None, insertion-ordered
    rounds: int = 0

    def state(self, dataset: Dataset) -> UserState:
        ids = dataset.item_ids
        return UserState(history=self.record.history, profile=self.spec.profile,
                         attributes=dict(self.spec.attributes), shown=tuple(ids[list(self.shown)]),
                         user_id=self.key)


def observation_space(n_items: int, slate_size: int, budget: int) -> spaces.Dict:
    """slate: catalogue indices (-1 pads a short slate); source: 0 recommender, 1 search; round."""
    return spaces.Dict({
        "slate": spaces.Box(low=-1, high=n_items - 1, shape=(slate_size,), dtype=np.int64),
        "source": spaces.Discrete(2),
        "round": spaces.Discrete(budget + 1),
    })


def action_space(slate_size: int, max_query: int = 64) -> spaces.Dict:
    """likes: 1 marks a liked slate position (all zeros = skip); query: non-empty = search next."""
    return spaces.Dict({
        "likes": spaces.MultiBinary(slate_size),
        "query": spaces.Text(max_length=max_query, min_length=0, charset=QUERY_CHARSET),
    })


class InvalidAction(ConfigError):
    """An action that does not fit the action space."""


class InteractionEngine:
    def __init__(self, recommender: Recommender, task: Task, *, slate_size: int, budget: int,
                 token_meter: TokenMeter | None = None):
        if slate_size < 1 or budget < 1:
            raise ConfigError("slate_size and budget must be >= 1")
        self.recommender, self.task = recommender, task
        self.dataset = recommender.dataset
        self.slate_size, self.budget = slate_size, budget
        self.token_meter = token_meter
        self._search: CatalogueSearch | None = None
        self._texts = self.dataset.items["text"].to_numpy()

    @property
    def search(self) -> CatalogueSearch:
        if self._search is None:
            self._search = CatalogueSearch(self.dataset)
        return self._search

    # ----------------------------------------------------------------- probes
    def start(self, keyed_specs: Sequence[tuple[str, ProbeSpec]]) -> list[Probe]:
        probes = []
        for key, spec in keyed_specs:
            self.dataset.check_items(spec.history)
            probes.append(Probe(key, spec, ProbeRecord(tuple(spec.history))))
        self._next_slates(probes, [""] * len(probes))
        return probes

    def validate(self, action) -> tuple[np.ndarray, str]:
        if not isinstance(action, Mapping) or "likes" not in action:
            raise InvalidAction(f"action must be a dict with 'likes' (and optional 'query'), got {action!r}")
        likes = np.asarray(action["likes"]).astype(np.int64).reshape(-1)
        if likes.shape != (self.slate_size,) or not np.isin(likes, (0, 1)).all():
            raise InvalidAction(f"'likes' must be {self.slate_size} zeros/ones, got {action['likes']!r}")
        query = action.get("query", "") or ""
        if not isinstance(query, str):
            raise InvalidAction(f"'query' must be a string, got {type(query).__name__}")
        return likes, query.strip()

    def act(self, probe: Probe, likes: np.ndarray, query: str) -> tuple[list[str], float]:
        """Apply one probe's likes on its current slate; returns (new likes, reward)."""
        if probe.rounds >= self.budget:
            raise BudgetExceededError(f"probe {probe.key} already used its budget of {self.budget} rounds")
        positions = np.flatnonzero(likes[: len(probe.slate)])
        have = set(probe.record.history)
        new = []
        for idx in probe.slate[positions]:
            item = str(self.dataset.item_ids[idx])
            if item not in have:
                new.append(item)
                have.add(item)
        probe.record.likes.extend(new)
        probe.record.likes_per_round.append(new)
        probe.record.slates.append([int(i) for i in probe.slate])
        probe.rounds += 1
        return new, self.task.step_reward(probe.record, new, probe.slate)

    def advance(self, probes: Sequence[Probe], queries: Sequence[str]) -> None:
        """Next slates for probes that still have budget."""
        live = [(p, q) for p, q in zip(probes, queries) if p.rounds < self.budget]
        if live:
            self._next_slates([p for p, _ in live], [q for _, q in live])

    def _next_slates(self, probes: Sequence[Probe], queries: Sequence[str]) -> None:
        recommend = [p for p, q in zip(probes, queries) if not q]
        if recommend:
            slates = self.recommender.recommend([p.state(self.dataset) for p in recommend], self.slate_size)
            for probe, slate in zip(recommend, slates):
                self._show(probe, self.dataset.indices(slate.item_ids), SOURCE_RECOMMENDER)
        for probe, query in zip(probes, queries):
            if query:
                exclude = self.dataset.indices(probe.record.history)
                self._show(probe, self.search.search(query, self.slate_size, exclude=exclude), SOURCE_SEARCH)

    @staticmethod
    def _show(probe: Probe, slate: np.ndarray, source: int) -> None:
        probe.slate, probe.source = np.asarray(slate, dtype=np.int64), source
        probe.shown.update(dict.fromkeys(int(i) for i in slate))

    # ----------------------------------------------------------- observation
    def observation(self, probe: Probe) -> dict:
        slate = np.full(self.slate_size, -1, dtype=np.int64)
        slate[: len(probe.slate)] = probe.slate
        return {"slate": slate, "source": probe.source, "round": min(probe.rounds, self.budget)}

    def info(self, probe: Probe, new_likes: Sequence[str] = ()) -> dict:
        texts = self._texts
        info = {
            "round": probe.rounds,
            "slate_item_ids": [str(self.dataset.item_ids[i]) for i in probe.slate],
            "slate_items": [str(texts[i]) for i in probe.slate],
            "slate_source": "search" if probe.source == SOURCE_SEARCH else "recommender",
            "new_likes": list(new_likes),
            "metrics": self.task.probe_metrics(probe.record),
        }
        if self.token_meter is not None:
            usage = self.token_meter.usage(probe.key)
            probe.record.tokens = usage.total_tokens
            info["tokens"] = usage.to_dict()
        return info

    def render_text(self, probe: Probe) -> str:
        where = "search results" if probe.source == SOURCE_SEARCH else "recommendations"
        lines = [f"[{probe.key}] round {probe.rounds}/{self.budget}, {len(probe.record.likes)} likes; {where}:"]
        texts = self.dataset.items["text"]
        lines += [f"  {n}. {texts.iat[i]}" for n, i in enumerate(probe.slate)]
        return "\n".join(lines)
