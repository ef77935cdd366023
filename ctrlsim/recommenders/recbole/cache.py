"""The on-disk cache of trained RecBole models: key, layout, checks, save and load.

A cache folder `cache_dir("recbole", <key>)` holds

    model.pt    the `state_dict` (plain tensors; loaded with weights_only=True)
    meta.json   the model's scalar RecBole config, the item-token list (external
                item ids in RecBole internal-id order, index 0 = padding = null),
                training time, validation and test metrics.

`meta.json` is written last, so its presence marks a complete entry. A cached
model is rebuilt without any RecBole dataset object: a sequential model's
constructor only asks the dataset for `num(field)`, which a small stand-in
built from the metadata answers. Everything is checked before use: every
metadata field present with the right type, and every weight finite.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ctrlsim.data import Dataset
from ctrlsim.errors import ModelError
from ctrlsim.recommenders.recbole.config import SequentialConfig
from ctrlsim.recommenders.recbole.sandbox import import_torch

#: Bumped whenever the cache layout or training protocol changes (part of the cache key).
CACHE_FORMAT = 1

# Entries of RecBole's final config that describe this run's machine, not the model.
_NOT_STORED = frozenset({"device", "data_path", "checkpoint_dir", "gpu_id", "local_rank", "single_spec"})

# Every field `meta.json` must hold, with its JSON type(s).
META_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (int,), "model": (str,), "dataset": (str,), "n_interactions": (int,),
    "interactions_sha256": (str,), "config": (dict,), "model_config": (dict,), "item_tokens": (list,),
    "n_users": (int,), "epochs_run": (int,), "best_epoch": (int, type(None)), "valid_metrics": (dict,),
    "test_metrics": (dict,), "train_seconds": (int, float), "threads": (int,),
    "recbole_version": (str,), "torch_version": (str,), "created": (str,),
}
# What the scorer and the model constructors read from `model_config`.
MODEL_CONFIG_FIELDS = ("MAX_ITEM_LIST_LENGTH", "ITEM_ID_FIELD", "LIST_SUFFIX", "ITEM_LIST_LENGTH_FIELD",
                       "USER_ID_FIELD")
TEST_METRICS = ("ndcg@10", "hit@10")


def interactions_digest(dataset: Dataset) -> str:
    """sha256 over the interaction table (ids, ratings, timestamps), for the cache key."""
    inter = dataset.interactions[["user_id", "item_id", "rating", "timestamp"]]
    hashed = pd.util.hash_pandas_object(inter, index=False).to_numpy()
    return hashlib.sha256(hashed.tobytes()).hexdigest()


def cache_key(dataset: Dataset, model: str, config: SequentialConfig) -> str:
    """Cache folder name: model, dataset and a hash of dataset size/content, model and config."""
    payload = {
        "format": CACHE_FORMAT,
        "dataset": dataset.name,
        "n_interactions": int(len(dataset.interactions)),
        "interactions_sha256": interactions_digest(dataset),
        "model": model,
        "config": config.to_dict(),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", dataset.name).strip("._") or "dataset"
    return f"{model.lower()}-{slug[:40]}-{digest}"


# ---------------------------------------------------------------- metadata
def _broken(folder: Path, problem: str) -> ModelError:
    return ModelError(f"the cached RecBole model in {folder} is unusable: {problem}. "
                      "Delete that folder to retrain.")


def check_meta(meta: Any, folder: Path, *, model: str, config: SequentialConfig) -> dict:
    """`meta` if it is complete and belongs to `model` trained with `config`, else `ModelError`."""
    if not isinstance(meta, dict):
        raise _broken(folder, f"meta.json holds a {type(meta).__name__}, not an object")
    missing = [name for name in META_FIELDS if name not in meta]
    if missing:
        raise _broken(folder, f"meta.json lacks field(s) {missing}")
    for name, types in META_FIELDS.items():
        value = meta[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise _broken(folder, f"meta.json field {name!r} is {value!r}, expected "
                                  f"{' or '.join(t.__name__ for t in types)}")
    if meta["format"] != CACHE_FORMAT:
        raise _broken(folder, f"cache format {meta['format']!r}, expected {CACHE_FORMAT}")
    if meta["model"] != model:
        raise _broken(folder, f"it holds {meta['model']!r}, expected {model!r}")
    if meta["config"] != config.to_dict():
        raise _broken(folder, f"it was trained with config {meta['config']}, expected {config.to_dict()}")
    lacking = [name for name in MODEL_CONFIG_FIELDS if name not in meta["model_config"]]
    if lacking:
        raise _broken(folder, f"meta.json's model_config lacks {lacking}")
    tokens = meta["item_tokens"]
    if len(tokens) < 2 or tokens[0] is not None or not all(isinstance(t, str) for t in tokens[1:]):
        raise _broken(folder, "item_tokens must be null (the padding) followed by item id strings")
    for name in TEST_METRICS:
        value = meta["test_metrics"].get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _broken(folder, f"test_metrics[{name!r}] is {value!r}, expected a finite number")
    return meta


def read_meta(folder: Path, *, model: str, config: SequentialConfig) -> dict:
    """The checked `meta.json` of a cache folder (no torch needed)."""
    path = Path(folder) / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _broken(Path(folder), f"cannot read meta.json ({type(exc).__name__}: {exc})") from exc
    return check_meta(meta, Path(folder), model=model, config=config)


# ---------------------------------------------------------------- weights
def non_finite_weights(state_dict: Mapping[str, Any]) -> list[str]:
    """Names of floating-point tensors holding NaN or infinity."""
    torch = import_torch()
    return [name for name, tensor in state_dict.items()
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


class _ConfigStandIn(dict):
    """What a RecBole model constructor reads from `Config`: item access, None when missing."""

    def __init__(self, values: Mapping[str, Any], device):
        super().__init__(values)
        self["device"] = device

    def __getitem__(self, key):
        return self.get(key)

    @property
    def final_config_dict(self) -> dict:
        return dict(self)


class _VocabularyStandIn:
    """What a sequential model constructor reads from its RecBole dataset: `num(field)`."""

    def __init__(self, counts: Mapping[str, int]):
        self._counts = dict(counts)

    def num(self, field_name: str) -> int:
        if field_name not in self._counts:
            raise ModelError(f"the model asked its dataset for the size of field {field_name!r}; "
                             f"a cached model only knows {sorted(self._counts)}")
        return self._counts[field_name]


def scalar_config(config) -> dict:
    """JSON-serialisable entries of a RecBole Config (enough to rebuild the model)."""
    out = {}
    for key, value in config.final_config_dict.items():
        if key in _NOT_STORED:
            continue
        try:
            out[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue  # enums, devices, classes: not needed by model constructors
    return out


def build_model(model_cls: type, meta: Mapping[str, Any]):
    """Instantiate `model_cls` from cached metadata, without a RecBole dataset (weights not loaded)."""
    torch = import_torch()
    cfg = _ConfigStandIn(meta["model_config"], torch.device("cpu"))
    counts = {cfg["ITEM_ID_FIELD"]: len(meta["item_tokens"])}
    if meta.get("n_users"):
        counts[cfg["USER_ID_FIELD"]] = int(meta["n_users"])
    # The constructor initialises weights from torch's global RNG: keep that RNG untouched.
    with torch.random.fork_rng(devices=[]):
        return model_cls(cfg, _VocabularyStandIn(counts))


def load_model(folder: Path, model_cls: type, meta: Mapping[str, Any]):
    """The model of a cache folder whose `meta` was checked; `ModelError` naming the folder if
    the weights cannot be loaded or are not all finite."""
    torch = import_torch()
    folder = Path(folder)
    try:
        model = build_model(model_cls, meta)
        state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except ModelError as exc:
        raise ModelError(f"cannot load the cached {model_cls.__name__} from {folder}: {exc}") from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, EOFError,
            pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise ModelError(f"cannot load the cached {model_cls.__name__} from {folder}: "
                         f"{type(exc).__name__}: {exc}. Delete that folder to retrain.") from exc
    bad = non_finite_weights(state)
    if bad:
        raise _broken(folder, f"weights {bad[:5]} hold NaN or infinite values")
    model.eval()
    return model


def load_cached(folder: Path, model_cls: type, config: SequentialConfig):
    """(model, meta) from a cache folder, both checked."""
    meta = read_meta(folder, model=model_cls.__name__, config=config)
    return load_model(folder, model_cls, meta), meta


def save_cache(folder: Path, state_dict: dict, meta: dict) -> None:
    """Write weights then metadata, each atomically (meta.json marks a complete entry)."""
    torch = import_torch()
    folder.mkdir(parents=True, exist_ok=True)
    suffix = f".{os.getpid()}.partial"
    weights = folder / "model.pt"
    torch.save(state_dict, str(weights) + suffix)
    os.replace(str(weights) + suffix, weights)
    meta_file = folder / "meta.json"
    Path(str(meta_file) + suffix).write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(str(meta_file) + suffix, meta_file)
