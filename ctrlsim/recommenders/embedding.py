"""Embedding recommenders as CtrlBench-Rec built them (TwHIN-BERT, BGE, any encoder).

query = alpha * embedding(profile) + (1 - alpha) * mean embedding(history items)
(alpha = 0.2; the profile alone when there is no history, the history alone when
there is no profile), then cosine against item-text embeddings. Item vectors
are computed once per encoder (and cached on disk), so a batch of users costs
one matrix product. The encoder that ran is part of `identity`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlsim.backends import Encoder, resolve_encoder
from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError, EmptyHistoryError
from ctrlsim.recommenders.base import Recommender, UserState

DEFAULT_NEGATIVE_WEIGHT = 0.5  # how far a dismissal pushes the query away (a share of a unit vector)


class EmbeddingRecommender(Recommender):
    name = "embedding"

    negative_feedback = ("the query moves away from the mean embedding of the not-interested and disliked "
                         "items (weight `negative_weight`, 0.5 by default); items with a blocked tag are "
                         "never recommended")

    def __init__(self, dataset: Dataset, *, encoder: Encoder | str = "minilm", alpha: float = 0.2,
                 negative_weight: float = DEFAULT_NEGATIVE_WEIGHT, **options):
        super().__init__(dataset, **options)
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
        if isinstance(negative_weight, bool) or not 0.0 <= float(negative_weight) <= 1.0:
            raise ConfigError(f"negative_weight must be in [0, 1], got {negative_weight!r}")
        self.alpha = alpha
        self.negative_weight = float(negative_weight)
        self.encoder = resolve_encoder(encoder)
        self.item_vectors = self.encoder.encode(dataset.items["text"].tolist())

    @property
    def identity(self) -> dict:
        ident = {**super().identity, "encoder": self.encoder.identity, "alpha": self.alpha}
        if self.negative_weight != DEFAULT_NEGATIVE_WEIGHT:  # absent at the default: identities unchanged
            ident["negative_weight"] = self.negative_weight
        return ident

    def query_vectors(self, states: Sequence[UserState]) -> np.ndarray:
        profiles = [s.profile for s in states if s.profile]
        prof_vecs = iter(self.encoder.encode(profiles, kind="query")) if profiles else iter(())
        queries = []
        for state in states:
            prof = next(prof_vecs) if state.profile else None
            hist = self.item_vectors[self.dataset.indices(state.history)].mean(0) if state.history else None
            if prof is not None and hist is not None:
                q = self.alpha * prof + (1.0 - self.alpha) * hist
            elif prof is not None:
                q = prof
            elif hist is not None:
                q = hist
            else:
                raise EmptyHistoryError(f"{self.name} needs a profile or a non-empty history "
                                        f"(user {state.user_id!r})")
            q = q / max(np.linalg.norm(q), 1e-12)
            if state.negatives and self.negative_weight:  # away from what the user dismissed
                away = self.item_vectors[self.dataset.indices(state.negatives)].mean(0)
                q = q - self.negative_weight * away / max(np.linalg.norm(away), 1e-12)
                q = q / max(np.linalg.norm(q), 1e-12)
            queries.append(q)
        return np.stack(queries)

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        scores = self.query_vectors(states) @ self.item_vectors.T
        for row, state in enumerate(states):
            if state.blocked_tags:
                blocked = set(state.blocked_tags)
                scores[row, [bool(blocked & set(t)) for t in self.dataset.items["tags"]]] = -np.inf
        return scores


class TwhinBertRecommender(EmbeddingRecommender):
    """CtrlBench-Rec's TwHIN-BERT black box (pooled output of Twitter/twhin-bert-base)."""

    name = "twhin-bert"

    def __init__(self, dataset: Dataset, *, encoder: Encoder | str = "twhin-bert", **options):
        super().__init__(dataset, encoder=encoder, **options)


class BGERecommender(EmbeddingRecommender):
    """CtrlBench-Rec's BGE black box (BAAI/bge-base-en-v1.5 with its query instruction)."""

    name = "bge"

    def __init__(self, dataset: Dataset, *, encoder: Encoder | str = "bge", **options):
        super().__init__(dataset, encoder=encoder, **options)

