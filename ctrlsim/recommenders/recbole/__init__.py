"""RecBole sequential models (SASRec, NARM, GRU4Rec, ...) as black-box recommenders.

One module per job:

    config         `SequentialConfig`: training settings, architecture overrides
    models         which RecBole models can be used, found by name
    sandbox        importing and running RecBole without its global side effects
    atomic_files   a `Dataset`'s interactions as RecBole input files
    training       training with RecBole's own evaluation protocol, with progress
    cache          the cache key, layout, checks, save and load
    scorer         batched scores for injected histories
    recommender    `SequentialRecommender`, the black box

On first use a model is trained with RecBole on the `Dataset`'s interactions
and evaluated with RecBole's protocol (leave-one-out by time, full ranking,
NDCG@10 / Hit@10), then cached. Scores come back in the dataset's catalogue
order; items that never occur in the training interactions score -inf, and
history items the model has never seen are skipped (they have no embedding).
Importing this package imports neither torch nor RecBole (see docs/recbole.md).
"""
from ctrlsim.recommenders.recbole.cache import CACHE_FORMAT, cache_key, interactions_digest
from ctrlsim.recommenders.recbole.config import SequentialConfig
from ctrlsim.recommenders.recbole.models import resolve_model
from ctrlsim.recommenders.recbole.recommender import SequentialRecommender
from ctrlsim.recommenders.recbole.training import METRICS

__all__ = ["CACHE_FORMAT", "METRICS", "SequentialConfig", "SequentialRecommender", "cache_key",
           "interactions_digest", "resolve_model"]
