"""`reference-controls`: a reference box whose declared controls have known answers (issue 48).

It ranks by tag affinity to the user's liked items (for each of an item's tags, how many liked
items carry it, summed; ties by popularity) and declares two controls and a non-profiled mode:

* `diversity` (0..1, default 0), claimed to make slates more diverse, and honest: the first
  `RERANKED` positions are chosen greedily by (1 - d) * affinity (scaled to [0, 1]) + d * the
  share of the item's tags not yet on the slate, so a higher d brings more distinct genres;
* `freshness` (0..1, default 0), claimed to bring more novel items, and dead: it changes nothing;
* non-profiled mode `{"profiling": "off"}` (Digital Services Act Art. 38): with the option
  `non_profiled=honest` (the default) the ranking is popularity alone, the same for everyone;
  with `non_profiled=fake` (the box `reference-controls-fake`) it keeps following the liked items,
  so the audit's check must fail.

An audit of it must pass `diversity` and the honest non-profiled mode and fail `freshness` and the
fake one (`ctrlsim controls`, docs/controls.md). It ignores explicit negative feedback.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import Recommender, UserState
from ctrlsim.recommenders.controls import Control, Controls

RERANKED = 50  # positions the diversity control re-ranks greedily (slates are shorter)
NON_PROFILED_MODES = ("honest", "fake")
PROFILING = "profiling"
CONTROLS = (
    Control("diversity", "more diverse slates: more distinct genres", "diversity", low=0.0, high=1.0),
    Control("freshness", "more movies unlike the ones you liked", "novelty", low=0.0, high=1.0),
)


class ReferenceControlsRecommender(Recommender):
    """See the module docstring."""

    name = "reference-controls"

    def __init__(self, dataset: Dataset, *, non_profiled: str = "honest", **options):
        super().__init__(dataset, **options)
        if non_profiled not in NON_PROFILED_MODES:
            raise ConfigError(f"non_profiled must be one of {NON_PROFILED_MODES}, got {non_profiled!r}")
        self.non_profiled = non_profiled
        tags = sorted({t for item_tags in dataset.items["tags"] for t in item_tags})
        column = {t: c for c, t in enumerate(tags)}
        self.tag_vectors = np.zeros((len(dataset.items), len(tags)))
        for row, item_tags in enumerate(dataset.items["tags"]):
            self.tag_vectors[row, [column[t] for t in item_tags]] = 1.0
        self.popularity = dataset.items["popularity"].to_numpy(dtype=np.float64)

    @property
    def identity(self) -> dict:
        return {**super().identity, "non_profiled": self.non_profiled}

    @property
    def controls(self) -> Controls:
        return Controls(CONTROLS, {PROFILING: "off"})

    def settings_of(self, state: UserState) -> dict:
        """The state's settings over the declared defaults, each checked (an unknown one is an error)."""
        declared = self.controls.by_name()
        out = {name: c.default for name, c in declared.items()} | {PROFILING: "on"}
        for key, value in state.settings.items():
            if key == PROFILING:
                if value not in ("on", "off"):
                    raise ConfigError(f"setting {PROFILING!r} takes 'on' or 'off', got {value!r}")
            elif key in declared:
                declared[key].check(value)
            else:
                raise ConfigError(f"{self.name} declares no control {key!r}; controls: {sorted(declared)}")
            out[key] = value
        return out

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        # popularity scaled below 1: a tie-breaker under affinity, the ranking where there is none
        tie = self.popularity / (self.popularity.max() + 1.0)
        out = np.empty((len(states), len(self.popularity)))
        for row, state in enumerate(states):
            settings = self.settings_of(state)
            if settings[PROFILING] == "off" and self.non_profiled == "honest":
                out[row] = tie
                continue
            liked = self.tag_vectors[self.dataset.indices(state.history)].sum(axis=0) if state.history \
                else np.zeros(self.tag_vectors.shape[1])
            scores = self.tag_vectors @ liked + tie
            out[row] = self._diversified(state, scores, float(settings["diversity"]))
        return out

    def _diversified(self, state: UserState, scores: np.ndarray, weight: float) -> np.ndarray:
        """Scores whose top `RERANKED` order is the greedy diverse re-ranking (weight 0: unchanged)."""
        if weight <= 0:
            return scores
        banned = set(state.history) | (set(state.shown) if self.mask_shown else set())
        allowed = np.ones(len(scores), dtype=bool)
        if banned:
            allowed[self.dataset.indices(sorted(banned))] = False
        pool = np.flatnonzero(allowed)
        pool = pool[np.argsort(-scores[pool], kind="stable")][:4 * RERANKED]
        scaled = (scores[pool] - scores[pool].min()) / max(np.ptp(scores[pool]), 1e-12)
        covered = np.zeros(self.tag_vectors.shape[1], dtype=bool)
        order: list[int] = []
        free = np.ones(len(pool), dtype=bool)
        n_tags = np.maximum(self.tag_vectors[pool].sum(axis=1), 1.0)
        for _ in range(min(RERANKED, len(pool))):
            fresh = (self.tag_vectors[pool][:, ~covered].sum(axis=1)) / n_tags
            value = np.where(free, (1.0 - weight) * scaled + weight * fresh, -np.inf)
            best = int(np.argmax(value))
            free[best] = False
            order.append(best)
            covered |= self.tag_vectors[pool[best]] > 0
        out = scores / (scores.max() + 1.0)  # everything else stays below the re-ranked head
        out[pool[order]] = 2.0 + np.arange(len(order))[::-1]
        return out


class FakeNonProfiledRecommender(ReferenceControlsRecommender):
    """`reference-controls-fake`: the reference box whose non-profiled mode still follows the
    user's likes (a known failure of the Art. 38 check)."""

    name = "reference-controls-fake"

    def __init__(self, dataset: Dataset, **options):
        super().__init__(dataset, **{"non_profiled": "fake", **options})
