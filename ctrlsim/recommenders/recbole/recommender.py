"""`SequentialRecommender`: a RecBole sequential model behind the `Recommender` protocol."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlsim.backends.bundled import cache_dir
from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError, EmptyHistoryError, ModelError
from ctrlsim.lazy import lazy
from ctrlsim.recommenders.base import Recommender, UserState
from ctrlsim.recommenders.recbole.cache import cache_key, load_model, read_meta, save_cache
from ctrlsim.recommenders.recbole.config import SequentialConfig, positive_int
from ctrlsim.recommenders.recbole.models import UNSUPPORTED, model_name_without_import, resolve_model
from ctrlsim.recommenders.recbole.scorer import Scorer
from ctrlsim.recommenders.recbole.training import train


class SequentialRecommender(Recommender):
    """A RecBole sequential model (SASRec, NARM, GRU4Rec, ...) as a black box.

    Trains on first use (minutes on CPU for ml-100k; progress on stderr) and
    caches under `cache_dir("recbole", cache_key)`. When the cache holds the
    model, construction reads and checks only its metadata; torch, RecBole and
    the weights load on the first call that needs scores, so a run whose slates
    are all stored elsewhere never loads them. `score_all` runs one batched
    forward pass for all states.

    Args:
        dataset: the catalogue and the interactions to train on.
        model: a RecBole sequential model name, case-insensitive.
        config: training settings and architecture overrides (default `SequentialConfig()`).
        threads: torch intra-op threads for training and scoring (restored afterwards).
        exclude_history, mask_shown: see `Recommender`.
        progress: show training progress on stderr.

    Raises `ModelError` for unknown or unsupported model names and for cached
    models with missing metadata fields or non-finite weights (naming the
    folder), `MissingDependencyError` without torch/RecBole.
    """

    name = "sequential"

    def __init__(self, dataset: Dataset, model: str = "SASRec", *, config: SequentialConfig | None = None,
                 threads: int = 1, exclude_history: bool = True, mask_shown: bool = False,
                 progress: bool = True):
        super().__init__(dataset, exclude_history=exclude_history, mask_shown=mask_shown)
        if config is None:
            config = SequentialConfig()
        if not isinstance(config, SequentialConfig):
            raise ConfigError(f"config must be a SequentialConfig, got {type(config).__name__}")
        positive_int("threads", threads)
        self.config = config
        self.threads = int(threads)
        self._scorer: Scorer | None = None
        # A complete cache entry is found from RecBole's spelling of the name alone, so a
        # cached model needs neither torch nor RecBole until it scores.
        name = model_name_without_import(model)
        key = cache_key(dataset, name, config) if name and name not in UNSUPPORTED else None
        self.loaded_from_cache = key is not None and (cache_dir("recbole") / key / "meta.json").is_file()
        model_cls = None if self.loaded_from_cache else resolve_model(model)
        self.model_name: str = model_cls.__name__ if model_cls is not None else str(name)
        self.name = self.model_name.lower()
        config.check_model(self.model_name)
        if key is None or self.model_name != name:
            key = cache_key(dataset, self.model_name, config)
        self.cache_key = key
        self.cache_path = cache_dir("recbole", self.cache_key)
        if model_cls is None:
            self.meta = read_meta(self.cache_path, model=self.model_name, config=config)
        else:
            self.model, state_dict, self.meta = train(dataset, model_cls, config, threads=self.threads,
                                                      progress=progress)
            save_cache(self.cache_path, state_dict, self.meta)
            self._verify_reload(model_cls)
        self._build_index()

    # ---------------------------------------------------------------- info
    @property
    def identity(self) -> dict:
        return {
            **super().identity,
            "model": self.model_name,
            "cache_key": self.cache_key,
            "test_metrics": dict(self.meta["test_metrics"]),
        }

    @property
    def test_metrics(self) -> dict:
        """RecBole's test NDCG@10 / Hit@10 (leave-one-out by time, full ranking)."""
        return dict(self.meta["test_metrics"])

    @property
    def train_seconds(self) -> float:
        return float(self.meta["train_seconds"])

    @property
    def item_tokens(self) -> list[str | None]:
        """External item id of each RecBole internal id (index 0 is padding: None)."""
        return list(self.meta["item_tokens"])

    @property
    def internal_ids(self) -> np.ndarray:
        """RecBole internal id of each catalogue item (`dataset.items` order); 0 = unseen in training."""
        return self._internal.copy()

    @property
    def model_loaded(self) -> bool:
        """Whether the torch model is in memory (it loads on the first call that needs scores)."""
        return SequentialRecommender.model.is_loaded(self)

    @lazy
    def model(self):
        """The RecBole model (a torch module), loaded from the cache on first access."""
        model_cls = resolve_model(self.model_name)
        if model_cls.__name__ != self.model_name:
            raise ModelError(f"{self.cache_path}: cached as {self.model_name!r} but RecBole names the "
                             f"model {model_cls.__name__!r}")
        return load_model(self.cache_path, model_cls, self.meta)

    # ---------------------------------------------------------------- scoring
    def _build_index(self) -> None:
        tokens = self.meta["item_tokens"]
        if tokens[0] is not None:
            raise ModelError(f"{self.cache_path}: item token 0 should be the padding (null)")
        known = [str(t) for t in tokens[1:]]
        missing = [t for t in known if t not in self.dataset.item_index]
        if missing:
            raise ModelError(f"{self.cache_path}: the model knows item ids that are not in dataset "
                             f"{self.dataset.name!r}'s catalogue: {missing[:5]}")
        self._catalogue_of_internal = self.dataset.indices(known)  # internal id k+1 -> catalogue index
        internal = np.zeros(len(self.dataset.items), dtype=np.int64)
        internal[self._catalogue_of_internal] = np.arange(1, len(tokens), dtype=np.int64)
        self._internal = internal

    def _sequences(self, states: Sequence[UserState]) -> list[np.ndarray]:
        sequences = []
        for n, state in enumerate(states):
            who = f"state {n}" + (f" (user {state.user_id!r})" if state.user_id is not None else "")
            if not state.history:
                raise EmptyHistoryError(f"{who} has an empty history; {self.model_name} needs at least "
                                        "one item")
            internal = self._internal[self.dataset.indices(state.history)]
            internal = internal[internal > 0]
            if not len(internal):
                shown = ", ".join(repr(i) for i in state.history[:5])
                raise EmptyHistoryError(f"{who}: none of its history items ({shown}) occur in the "
                                        f"interactions {self.model_name} was trained on")
            sequences.append(internal)
        return sequences

    def _get_scorer(self) -> Scorer:
        if self._scorer is None:
            self._scorer = Scorer(self.model, self.meta["model_config"], len(self.meta["item_tokens"]),
                                  self.threads)
        return self._scorer

    def score_internal(self, states: Sequence[UserState]) -> np.ndarray:
        """Raw model scores over RecBole internal ids (column 0, the padding, is -inf)."""
        sequences = self._sequences(list(states))  # bad input fails before the model loads
        return self._get_scorer().scores(sequences)

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        states = list(states)
        out = np.full((len(states), len(self.dataset.items)), -np.inf, dtype=np.float64)
        if not states:
            return out
        raw = self.score_internal(states)
        out[:, self._catalogue_of_internal] = raw[:, 1:]
        return out

    # ---------------------------------------------------------------- cache check
    def _verify_reload(self, model_cls: type) -> None:
        """The cached copy must score exactly like the in-memory model."""
        meta = read_meta(self.cache_path, model=self.model_name, config=self.config)
        reloaded = load_model(self.cache_path, model_cls, meta)
        n_items = len(self.meta["item_tokens"])
        rng = np.random.default_rng(0)
        max_len = int(self.meta["model_config"]["MAX_ITEM_LIST_LENGTH"])
        sequences = [rng.integers(1, n_items, size=length) for length in (1, 5, max_len, max_len + 7)]
        mine = Scorer(self.model, self.meta["model_config"], n_items, self.threads).scores(sequences)
        theirs = Scorer(reloaded, self.meta["model_config"], n_items, self.threads).scores(sequences)
        if not np.array_equal(mine, theirs):
            gap = np.nanmax(np.abs(mine[:, 1:] - theirs[:, 1:]))
            raise ModelError(f"the cached {self.model_name} in {self.cache_path} scores differently from the "
                             f"trained model (max difference {gap:.3g})")
