"""BM25 search over item texts (bm25s): the keyword-BM25 box and the envs' search action share it."""
from __future__ import annotations

import numpy as np

from ctrlsim.data import Dataset


class CatalogueSearch:
    """BM25 (Lucene variant, English stop words) over `dataset.items["text"]`.

    Items with equal scores are ordered by popularity (a tiny tie-breaker), so
    a query that matches nothing returns popular items rather than catalogue order.
    """

    def __init__(self, dataset: Dataset, *, k1: float = 1.5, b: float = 0.75):
        import bm25s

        self._bm25s = bm25s
        self.k1, self.b = k1, b
        corpus = bm25s.tokenize(dataset.items["text"].tolist(), stopwords="en", show_progress=False)
        self.retriever = bm25s.BM25(k1=k1, b=b)
        self.retriever.index(corpus, show_progress=False)
        pop = dataset.items["popularity"].to_numpy(dtype=np.float64)
        self._tiebreak = 1e-6 * pop / max(pop.max(), 1.0)

    def __getstate__(self) -> dict:
        """Pickle / deepcopy: the index and settings, not the `bm25s` module (re-imported on load)."""
        state = self.__dict__.copy()
        state.pop("_bm25s", None)
        return state

    def __setstate__(self, state: dict) -> None:
        import bm25s

        self.__dict__.update(state)
        self._bm25s = bm25s

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every catalogue item for `query` (plus the popularity tie-breaker)."""
        tokens = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        raw = self.retriever.get_scores(tokens) if tokens else np.zeros(len(self._tiebreak))
        return np.asarray(raw, dtype=np.float64) + self._tiebreak

    def search(self, query: str, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
        """Catalogue indices of the top-`k` matches (only items with a positive BM25 score)."""
        scores = self.scores(query)
        matched = scores > self._tiebreak
        if exclude is not None and len(exclude):
            matched[exclude] = False
        idx = np.flatnonzero(matched)
        return idx[np.argsort(-scores[idx], kind="stable")][:k]
