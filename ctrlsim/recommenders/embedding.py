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


class EmbeddingRecommender(Recommender):
    name = "embedding"

    def __init__(self, dataset: Dataset, *, encoder: Encoder | str = "minilm", alpha: float = 0.2, **options):
        super().__init__(dataset, **options)
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
        self.encoder = resolve_encoder(encoder)
        self.item_vectors = self.encoder.encode(dataset.items["text"].tolist())

    @property
    def identity(self) -> dict:
        return {**super().identity, "encoder": self.encoder.identity, "alpha": self.alpha}

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
            queries.append(q / max(np.linalg.norm(q), 1e-12))
        return np.stack(queries)

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        return self.query_vectors(states) @ self.item_vectors.T


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

