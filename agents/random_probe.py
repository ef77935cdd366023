"""Random probes: the paper's Base-Large / Base-Small population (no LLM)."""
from __future__ import annotations

from typing import Iterable

import numpy as np
from ctrlsim.envs.phases import is_steering, steers_away

from ctrlsim.data import Dataset


class RandomProbe:
    """Likes each valid slate position independently with probability `like_prob`.

    All randomness comes from the generator it is given (e.g. the population
    env's `agent_rngs[name]`), so runs replay exactly from the reset seed. It has no goal, so
    it flips the same coins in every phase of a steer-then-release episode.
    """

    def __init__(self, rng: np.random.Generator, like_prob: float = 0.3):
        if not 0.0 <= like_prob <= 1.0:
            raise ValueError(f"like_prob must be in [0, 1], got {like_prob}")
        self.rng, self.like_prob = rng, like_prob

    def act(self, observation: dict, info: dict | None = None) -> dict:
        valid = observation["slate"] >= 0
        likes = (self.rng.random(valid.shape) < self.like_prob) & valid
        return {"likes": likes.astype(np.int8), "query": ""}


class TargetSeekingProbe:
    """A scripted probe that likes every slate item carrying a target tag (an upper-bound
    reference for what a perfect reader of the slate text can do; no LLM).

    In the baseline and release rounds of a steer-then-release episode (an info whose "phase"
    is not "steer") it plays its persona instead: it likes the slate items in `baseline_items`
    (for the oracle, those sharing a tag with its seed history, `persona_items`). Without
    phases it always seeks the targets. Where the plan steers away from the target (an info whose
    "direction" is "away"), its steering rounds like the persona's items that are not targets.
    """

    def __init__(self, target_items: set[str], baseline_items: Iterable[str] = ()):
        self.target_items = set(target_items)
        self.baseline_items = set(baseline_items)

    def act(self, observation: dict, info: dict) -> dict:
        ids = info["slate_item_ids"]
        if steers_away(info):  # see less of the target: the persona's items that are not targets
            wanted = self.baseline_items - self.target_items
        else:
            wanted = self.target_items if is_steering(info) else self.baseline_items
        likes = np.zeros(observation["slate"].shape, dtype=np.int8)
        for pos, item in enumerate(ids):
            likes[pos] = item in wanted
        return {"likes": likes, "query": ""}


def persona_items(dataset: Dataset, seed_items: Iterable[str]) -> set[str]:
    """The items sharing at least one tag with `seed_items` (what a persona likes with no goal)."""
    tags = {t for i in seed_items for t in dataset.items["tags"].iat[dataset.item_index[i]]}
    return {str(i) for tag in sorted(tags) for i in dataset.items_with_tag(tag)}
