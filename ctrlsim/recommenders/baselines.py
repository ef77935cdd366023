"""Baselines that need no model."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlsim.recommenders.base import Recommender, UserState


class PopularityRecommender(Recommender):
    """Most-popular baseline (distinct users per item); ignores the user."""

    name = "popularity"

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        pop = self.dataset.items["popularity"].to_numpy(dtype=np.float64)
        return np.tile(pop, (len(states), 1))
