"""Scoring injected histories with a RecBole sequential model, batched."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ctrlsim.backends._torch import torch_threads
from ctrlsim.errors import ModelError
from ctrlsim.recommenders.recbole.sandbox import import_recbole, import_torch


class Scorer:
    """Batched `full_sort_predict` over RecBole internal item ids for padded histories.

    A history is fed as RecBole feeds one at test time: `ITEM_SEQ` left-aligned and
    zero-padded on the right holding the last `MAX_ITEM_LIST_LENGTH` items, plus
    `ITEM_SEQ_LEN`.
    """

    def __init__(self, model, model_config: Mapping[str, Any], n_items: int, threads: int):
        self.interaction_cls = import_recbole().Interaction
        self.model = model
        self.n_items = n_items
        self.threads = threads
        self.max_len = int(model_config["MAX_ITEM_LIST_LENGTH"])
        item_field = model_config["ITEM_ID_FIELD"]
        self.seq_field = item_field + model_config["LIST_SUFFIX"]
        self.len_field = model_config["ITEM_LIST_LENGTH_FIELD"]
        self.user_field = model_config["USER_ID_FIELD"]

    def scores(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        """(n, n_items) float32 scores; `sequences` hold internal ids (>0), oldest first."""
        torch = import_torch()
        n = len(sequences)
        batch = np.zeros((n, self.max_len), dtype=np.int64)
        lengths = np.zeros(n, dtype=np.int64)
        for row, seq in enumerate(sequences):
            seq = np.asarray(seq, dtype=np.int64)[-self.max_len:]
            batch[row, : len(seq)] = seq
            lengths[row] = len(seq)
        inter = self.interaction_cls({
            self.seq_field: torch.from_numpy(batch),
            self.len_field: torch.from_numpy(lengths),
            # Models with user embeddings see an injected history as the padding user 0.
            self.user_field: torch.zeros(n, dtype=torch.int64),
        })
        self.model.eval()
        with torch_threads(self.threads), torch.no_grad(), torch.autograd.set_detect_anomaly(False):
            try:
                out = self.model.full_sort_predict(inter)
            except NotImplementedError as exc:
                raise ModelError(f"{type(self.model).__name__} has no full_sort_predict") from exc
        out = out.reshape(n, -1)
        if out.shape[1] != self.n_items:
            raise ModelError(f"{type(self.model).__name__} scored {out.shape[1]} items, "
                             f"expected {self.n_items} (its vocabulary)")
        out = out.float().cpu().numpy().copy()
        out[:, 0] = -np.inf  # the padding id
        return out
