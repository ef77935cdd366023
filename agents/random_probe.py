"""Random probes: the paper's Base-Large / Base-Small population (no LLM)."""
from __future__ import annotations

import numpy as np


class RandomProbe:
    """Likes each valid slate position independently with probability `like_prob`.

    All randomness comes from the generator it is given (e.g. the population
    env's `agent_rngs[name]`), so runs replay exactly from the reset seed.
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
    reference for what a perfect reader of the slate text can do; no LLM)."""

    def __init__(self, target_items: set[str]):
        self.target_items = set(target_items)

    def act(self, observation: dict, info: dict) -> dict:
        ids = info["slate_item_ids"]
        likes = np.zeros(observation["slate"].shape, dtype=np.int8)
        for pos, item in enumerate(ids):
            likes[pos] = item in self.target_items
        return {"likes": likes, "query": ""}
