"""`make_recommender(name, dataset, **options)`: every black box by name."""
from __future__ import annotations

from typing import Callable

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import Recommender


def _sequential(model: str) -> Callable[..., Recommender]:
    def build(dataset: Dataset, **options) -> Recommender:
        from ctrlsim.recommenders.recbole import SequentialRecommender

        return SequentialRecommender(dataset, model=model, **options)

    return build


def _lazy(module: str, cls: str) -> Callable[..., Recommender]:
    def build(dataset: Dataset, **options) -> Recommender:
        import importlib

        return getattr(importlib.import_module(f"ctrlsim.recommenders.{module}"), cls)(dataset, **options)

    return build


RECOMMENDERS: dict[str, Callable[..., Recommender]] = {
    "nl-profile": _lazy("nl_profile", "NLProfileRecommender"),
    "sasrec": _sequential("SASRec"),
    "narm": _sequential("NARM"),
    "twhin-bert": _lazy("embedding", "TwhinBertRecommender"),
    "bge": _lazy("embedding", "BGERecommender"),
    "embedding": _lazy("embedding", "EmbeddingRecommender"),
    "keyword-bm25": _lazy("keyword_bm25", "KeywordBM25Recommender"),
    "popularity": _lazy("baselines", "PopularityRecommender"),
}


def register_recommender(name: str, factory: Callable[..., Recommender], *, replace: bool = False) -> None:
    """Make `factory(dataset, **options)` available as `make_recommender(name, ...)` and to every env."""
    if not name or name.startswith("recbole:"):
        raise ConfigError(f"invalid recommender name {name!r}")
    if name in RECOMMENDERS and not replace:
        raise ConfigError(f"recommender {name!r} is already registered; pass replace=True to override it")
    RECOMMENDERS[name] = factory


def make_recommender(name: str, dataset: Dataset, **options) -> Recommender:
    """Build a black box by name.

    Other RecBole sequential models: "recbole:<ModelName>" (e.g. recbole:GRU4Rec).
    """
    if name.startswith("recbole:"):
        return _sequential(name.split(":", 1)[1])(dataset, **options)
    if name not in RECOMMENDERS:
        raise ConfigError(f"unknown recommender {name!r}; known: {sorted(RECOMMENDERS)} or 'recbole:<Model>'")
    return RECOMMENDERS[name](dataset, **options)
