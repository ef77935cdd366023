"""RecBole sequential models (SASRec, NARM, GRU4Rec, ...) as black-box recommenders.

On first use a model is trained with RecBole on the `Dataset`'s interactions
(written as RecBole atomic files into a temporary folder), evaluated with
RecBole's own protocol (leave-one-out by time, full ranking, NDCG@10 / Hit@10)
and cached under `cache_dir("recbole", <key>)` as

    model.pt    the `state_dict` (plain tensors; loaded with weights_only=True)
    meta.json   the model's scalar RecBole config, the item-token list (external
                item ids in RecBole internal-id order, index 0 = padding = null),
                training time, validation and test metrics.

A cached model reloads without any RecBole dataset object: the sequential model
constructors only ask the dataset for `num(field)`, which a small stand-in built
from the metadata answers.

Inference feeds an injected history (oldest first) as RecBole does at test time:
`ITEM_SEQ` left-aligned and zero-padded on the right holding the last
`MAX_ITEM_LIST_LENGTH` items, `ITEM_SEQ_LEN`, then `full_sort_predict`. Scores
come back in the dataset's catalogue order (`dataset.items`); items that never
occur in the training interactions score -inf, and history items the model has
never seen are skipped (they have no embedding).

RecBole has process-wide side effects; training runs inside a sandbox that
undoes them: `sys.argv` is hidden from `Config`, the working directory is a
temporary folder (RecBole writes `log_tensorboard/` and `saved/` there), the
logger is never re-initialised, numpy aliases, RNG states, cuDNN flags,
`CUDA_VISIBLE_DEVICES`, torch's thread count and autograd anomaly detection
(turned on by importing RecBole's `sine.py`) are restored afterwards.

Importing this module imports neither torch nor RecBole.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
import pickle
import random
import re
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from ctrlsim.backends._torch import import_torch, torch_threads
from ctrlsim.backends.bundled import cache_dir, package_dir
from ctrlsim.data import Dataset
from ctrlsim.errors import (
    ConfigError,
    DataError,
    EmptyHistoryError,
    MissingDependencyError,
    ModelError,
)
from ctrlsim.recommenders.base import Recommender, UserState

#: Bumped whenever the cache layout or training protocol changes (part of the cache key).
CACHE_FORMAT = 1

#: Metrics RecBole computes on the validation split (early stopping) and the test split.
METRICS = ("NDCG@10", "Hit@10")

# Name of the RecBole dataset written to the temporary folder. Not "ml-100k": RecBole
# forces data_path to its bundled copy (and loads ml-100k.yaml) for that name.
_RECBOLE_DATASET = "ctrlsim_data"

# Sequential models that need what ctrlsim does not give RecBole.
_UNSUPPORTED = {
    "DIN": "it is a click-through-rate model that needs item features and labels",
    "DIEN": "it is a click-through-rate model that needs item features and labels",
    "GRU4RecF": "it needs item feature fields",
    "SASRecF": "it needs item feature fields",
    "FDSA": "it needs item feature fields",
    "S3Rec": "it needs item attributes and a separate pre-training stage",
    "KSR": "it needs knowledge-graph embeddings",
    "GRU4RecKG": "it needs knowledge-graph embeddings",
}

# Settings ctrlsim owns; `recbole_params` may not override them.
_RESERVED = frozenset({
    "model", "dataset", "data_path", "checkpoint_dir", "load_col", "unload_col", "eval_args",
    "USER_ID_FIELD", "ITEM_ID_FIELD", "RATING_FIELD", "TIME_FIELD", "metrics", "topk",
    "valid_metric", "gpu_id", "use_gpu", "log_wandb", "save_dataset", "save_dataloaders",
    "dataset_save_path", "dataloaders_save_path", "show_progress", "benchmark_filename",
    "epochs", "stopping_step", "train_batch_size", "eval_batch_size", "learning_rate",
    "MAX_ITEM_LIST_LENGTH", "seed", "reproducibility", "repeatable", "eval_step",
})

# Entries of RecBole's final config that describe this run's machine, not the model.
_NOT_STORED = frozenset({"device", "data_path", "checkpoint_dir", "gpu_id", "local_rank", "single_spec"})

_log = logging.getLogger(__name__)


# ====================================================================== config
@dataclass(frozen=True)
class SequentialConfig:
    """Training settings and model overrides for a RecBole sequential model.

    Defaults are the settings measured to train well on CPU (see the project's
    RecBole notes): CE loss without negative sampling, history length 20, batch
    256, early stopping after 3 epochs without a better validation NDCG@10, at
    most 30 epochs. Architecture fields left at None keep RecBole's defaults,
    which are also CtrlBench-Rec's: SASRec hidden_size 64, n_layers 2, n_heads 2
    (inner 256, dropout 0.5); NARM embedding_size 64, hidden_size 128,
    n_layers 1, dropout [0.25, 0.5]; GRU4Rec embedding 64, hidden 128.

    Fields:
        epochs: training epochs at most (early stopping may end sooner).
        stopping_step: epochs without validation improvement before stopping.
        train_batch_size, eval_batch_size, learning_rate: as in RecBole.
        max_seq_length: RecBole's MAX_ITEM_LIST_LENGTH (histories keep their last items).
        seed: RecBole's seed (data shuffling and weight initialisation).
        hidden_size, n_layers, n_heads, embedding_size: architecture overrides;
            None keeps the model's RecBole default. Setting one the model does
            not have raises `ConfigError`.
        recbole_params: any other RecBole setting by name (e.g. {"hidden_dropout_prob": 0.2,
            "loss_type": "BPR", "train_neg_sample_args": {...}}); JSON values only.
    """

    epochs: int = 30
    stopping_step: int = 3
    train_batch_size: int = 256
    eval_batch_size: int = 4096
    learning_rate: float = 1e-3
    max_seq_length: int = 20
    seed: int = 2020
    hidden_size: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    embedding_size: int | None = None
    recbole_params: Mapping[str, Any] = field(default_factory=dict)

    _ARCHITECTURE = ("hidden_size", "n_layers", "n_heads", "embedding_size")

    def __post_init__(self):
        for name in ("epochs", "stopping_step", "train_batch_size", "eval_batch_size", "max_seq_length"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {self.seed!r}")
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float)) \
                or not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        for name in self._ARCHITECTURE:
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        params = dict(self.recbole_params or {})
        for key in params:
            if not isinstance(key, str):
                raise ConfigError(f"recbole_params keys must be strings, got {key!r}")
            if key in _RESERVED:
                raise ConfigError(f"recbole_params may not set {key!r}: ctrlsim sets it "
                                  "(use the SequentialConfig field where there is one)")
            if key in self._ARCHITECTURE:
                raise ConfigError(f"set {key!r} with SequentialConfig.{key}, not recbole_params")
        try:
            params = json.loads(json.dumps(params, sort_keys=True))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"recbole_params must hold JSON values only: {exc}") from exc
        object.__setattr__(self, "recbole_params", params)
        object.__setattr__(self, "learning_rate", float(self.learning_rate))

    # ------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        return {f.name: (dict(getattr(self, f.name)) if f.name == "recbole_params" else getattr(self, f.name))
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SequentialConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown SequentialConfig field(s): {unknown}; known: {sorted(names)}")
        return cls(**dict(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SequentialConfig":
        return cls.from_dict(json.loads(text))

    # ------------------------------------------------------------- RecBole
    def check_model(self, model: str) -> None:
        """Raise `ConfigError` if an architecture override names a parameter `model` lacks."""
        set_fields = [n for n in self._ARCHITECTURE if getattr(self, n) is not None]
        if not set_fields:
            return
        defaults = _model_defaults(model)
        missing = [n for n in set_fields if n not in defaults]
        if missing:
            raise ConfigError(f"{model} has no parameter(s) {missing}; its RecBole parameters are "
                              f"{sorted(defaults)} (set others through recbole_params)")

    def recbole_overrides(self) -> dict:
        """The RecBole config entries this config sets."""
        out = {
            "epochs": self.epochs,
            "stopping_step": self.stopping_step,
            "train_batch_size": self.train_batch_size,
            "eval_batch_size": self.eval_batch_size,
            "learning_rate": self.learning_rate,
            "MAX_ITEM_LIST_LENGTH": self.max_seq_length,
            "seed": int(self.seed),
        }
        out.update({n: getattr(self, n) for n in self._ARCHITECTURE if getattr(self, n) is not None})
        out.update(self.recbole_params)
        return out


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")


def _model_defaults(model: str) -> dict:
    """The model's RecBole defaults (its properties/model/<Model>.yaml), read without importing RecBole."""
    root = package_dir("recbole")
    if root is None:
        raise MissingDependencyError("recbole", "recbole", "RecBole sequential recommenders")
    path = root / "properties" / "model" / f"{model}.yaml"
    if not path.is_file():
        return {}
    import yaml  # a RecBole dependency

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


# ====================================================================== imports
def _import_torch():
    return import_torch("recbole", "RecBole sequential recommenders")


def _recbole() -> SimpleNamespace:
    """Import the parts of RecBole used here, undoing what the import turns on."""
    torch = _import_torch()
    first_import = "recbole.model.sequential_recommender" not in sys.modules
    anomaly_before = torch.is_anomaly_enabled()
    try:
        # Some of RecBole's imports reseed the global RNGs; importing must not change them.
        with _numpy_aliases(), _preserved_rngs():
            import recbole
            import recbole.model.sequential_recommender as seq_models
            from recbole.config import Config
            from recbole.data import create_dataset, data_preparation
            from recbole.data.interaction import Interaction
            from recbole.model.abstract_recommender import SequentialRecommender as SeqBase
            from recbole.utils import ModelType, get_model, get_trainer, init_seed
    except ImportError as exc:
        if getattr(exc, "name", None) and str(exc.name).split(".")[0] != "recbole":
            raise MissingDependencyError(str(exc.name).split(".")[0], "recbole",
                                         "RecBole sequential recommenders") from exc
        raise MissingDependencyError("recbole", "recbole", "RecBole sequential recommenders") from exc
    finally:
        # recbole/model/sequential_recommender/sine.py calls set_detect_anomaly(True) at import.
        if first_import:
            torch.autograd.set_detect_anomaly(anomaly_before)
    return SimpleNamespace(
        torch=torch, recbole=recbole, seq_models=seq_models, Config=Config, create_dataset=create_dataset,
        data_preparation=data_preparation, Interaction=Interaction, SeqBase=SeqBase, ModelType=ModelType,
        get_model=get_model, get_trainer=get_trainer, init_seed=init_seed,
    )


def resolve_model(name: str) -> type:
    """The RecBole sequential model class called `name` (case-insensitive).

    Raises `ModelError` for unknown names, non-sequential RecBole models and the
    sequential models ctrlsim cannot feed (feature- or knowledge-graph-based ones).
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelError(f"a RecBole sequential model name is required, got {name!r}")
    rb = _recbole()
    classes = {
        cls_name: obj for cls_name, obj in vars(rb.seq_models).items()
        if isinstance(obj, type) and issubclass(obj, rb.SeqBase) and obj is not rb.SeqBase
    }
    found = [obj for cls_name, obj in classes.items() if cls_name.lower() == name.strip().lower()]
    if not found:
        kind = None
        try:
            with _numpy_aliases(), _preserved_rngs():  # may import other RecBole model packages
                other = rb.get_model(name)
            kind = getattr(getattr(other, "type", None), "name", "non-sequential")
        except (ValueError, AttributeError, ImportError):
            pass
        supported = sorted(n for n in classes if n not in _UNSUPPORTED)
        if kind is not None:
            raise ModelError(f"RecBole model {name!r} is a {kind.lower()} model, not a sequential one; "
                             f"sequential models: {', '.join(supported)}")
        raise ModelError(f"unknown RecBole sequential model {name!r}; available: {', '.join(supported)}")
    cls = found[0]
    if cls.__name__ in _UNSUPPORTED:
        raise ModelError(f"RecBole model {cls.__name__} is not supported: {_UNSUPPORTED[cls.__name__]}")
    return cls


# ====================================================================== side effects
_NUMPY_ALIASES = {"float_": "float64", "complex_": "complex128", "unicode_": "str_", "bool8": "bool_"}
# What RecBole's Config.compatibility_settings assigns into the numpy module.
_NUMPY_TOUCHED = ("bool", "int", "float", "complex", "object", "str", "long", "unicode", *_NUMPY_ALIASES)


@contextlib.contextmanager
def _numpy_aliases() -> Iterator[None]:
    """Provide the numpy 1 aliases RecBole uses (numpy 2 removed them); restore numpy's namespace after."""
    before = {name: np.__dict__[name] for name in _NUMPY_TOUCHED if name in np.__dict__}
    for alias, target in _NUMPY_ALIASES.items():
        if alias not in np.__dict__:
            setattr(np, alias, getattr(np, target))
    try:
        yield
    finally:
        for name in _NUMPY_TOUCHED:
            if name in before:
                setattr(np, name, before[name])
            elif name in np.__dict__:
                delattr(np, name)


@contextlib.contextmanager
def _preserved_rngs() -> Iterator[None]:
    """Restore Python's, numpy's and torch's (CPU) global RNG states on exit."""
    torch = _import_torch()
    py_rng, np_rng = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(py_rng)
        np.random.set_state(np_rng)


@contextlib.contextmanager
def _recbole_sandbox(workdir: Path, threads: int) -> Iterator[None]:
    """Everything RecBole changes globally while training, undone on exit."""
    torch = _import_torch()
    cwd = os.getcwd()
    argv = sys.argv
    cuda_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    cudnn = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    root = logging.getLogger()
    root_state = (root.level, list(root.handlers))
    with contextlib.ExitStack() as stack:
        stack.enter_context(_preserved_rngs())
        stack.enter_context(torch.autograd.set_detect_anomaly(False))
        stack.enter_context(torch_threads(threads))
        stack.enter_context(_numpy_aliases())
        # RecBole 1.2.1 on current pandas/torch warns about its own deprecated calls; not actionable here.
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"recbole(\.|$)")
        try:
            os.chdir(workdir)
            sys.argv = ["ctrlsim"]  # Config would read --key=value flags from the command line
            yield
        finally:
            os.chdir(cwd)
            sys.argv = argv
            if cuda_env is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = cuda_env
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn
            root.setLevel(root_state[0])
            root.handlers[:] = root_state[1]


# ====================================================================== data
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


def write_atomic_files(dataset: Dataset, folder: Path, name: str = _RECBOLE_DATASET) -> Path:
    """Write the interactions as RecBole atomic files `<folder>/<name>/<name>.inter`.

    Items are written as tokens "i<catalogue index>" and users as "u<n>", so any
    id string survives RecBole's CSV reader (which would turn "NA" into NaN or
    strip quotes); `token_to_item_id` maps item tokens back.
    """
    inter = dataset.interactions
    if inter.empty:
        raise DataError(f"dataset {dataset.name!r} has no interactions to train a sequential model on")
    item_idx = dataset.indices(inter["item_id"])
    user_codes, _ = pd.factorize(inter["user_id"])
    table = pd.DataFrame({
        "user_id": np.char.add("u", user_codes.astype(str)),
        "item_id": np.char.add("i", item_idx.astype(str)),
        "rating": inter["rating"].astype(float).to_numpy(),
        "timestamp": inter["timestamp"].astype("int64").to_numpy(),
    })
    target = Path(folder) / name
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.inter"
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write("user_id:token\titem_id:token\trating:float\ttimestamp:float\n")
        table.to_csv(fh, sep="\t", header=False, index=False, lineterminator="\n")
    return path


def token_to_item_id(dataset: Dataset, token: str) -> str:
    """External item id of an atomic-file item token written by `write_atomic_files`."""
    if not (isinstance(token, str) and token.startswith("i") and token[1:].isdigit()):
        raise ModelError(f"unexpected RecBole item token {token!r}")
    return str(dataset.item_ids[int(token[1:])])


# ====================================================================== model I/O
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


def _scalar_config(config) -> dict:
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
    torch = _import_torch()
    cfg = _ConfigStandIn(meta["model_config"], torch.device("cpu"))
    counts = {cfg["ITEM_ID_FIELD"]: len(meta["item_tokens"])}
    if meta.get("n_users"):
        counts[cfg["USER_ID_FIELD"]] = int(meta["n_users"])
    # The constructor initialises weights from torch's global RNG: keep that RNG untouched.
    with torch.random.fork_rng(devices=[]):
        return model_cls(cfg, _VocabularyStandIn(counts))


def load_cached(folder: Path, model_cls: type):
    """(model, meta) from a cache folder; `ModelError` with the folder named if anything fails."""
    torch = _import_torch()
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") != CACHE_FORMAT:
            raise ValueError(f"cache format {meta.get('format')!r}, expected {CACHE_FORMAT}")
        if meta.get("model") != model_cls.__name__:
            raise ValueError(f"cache holds {meta.get('model')!r}, expected {model_cls.__name__!r}")
        model = build_model(model_cls, meta)
        state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except ModelError as exc:
        raise ModelError(f"cannot load the cached {model_cls.__name__} from {folder}: {exc}") from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, EOFError,
            pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise ModelError(f"cannot load the cached {model_cls.__name__} from {folder}: "
                         f"{type(exc).__name__}: {exc}. Delete that folder to retrain.") from exc
    model.eval()
    return model, meta


def _save_cache(folder: Path, state_dict: dict, meta: dict) -> None:
    """Write weights then metadata, each atomically (meta.json marks a complete entry)."""
    torch = _import_torch()
    folder.mkdir(parents=True, exist_ok=True)
    suffix = f".{os.getpid()}.partial"
    weights = folder / "model.pt"
    torch.save(state_dict, str(weights) + suffix)
    os.replace(str(weights) + suffix, weights)
    meta_file = folder / "meta.json"
    Path(str(meta_file) + suffix).write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(str(meta_file) + suffix, meta_file)


# ====================================================================== scoring
class _Scorer:
    """Batched `full_sort_predict` over RecBole internal item ids for padded histories."""

    def __init__(self, model, model_config: Mapping[str, Any], n_items: int, threads: int):
        self.interaction_cls = _recbole().Interaction
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
        torch = _import_torch()
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


# ====================================================================== training
class _Progress:
    """One line per epoch on stderr (tqdm), and a few status lines around training."""

    def __init__(self, enabled: bool, total: int, desc: str):
        self.enabled = enabled
        self.total = total
        self.desc = desc
        self.bar = None

    def start(self) -> None:
        """Open the per-epoch bar (after the status lines, so they print above it)."""
        if self.enabled and self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=self.desc, unit="epoch", file=sys.stderr, leave=True)

    def say(self, message: str) -> None:
        _log.info(message)
        if self.enabled:
            from tqdm.auto import tqdm

            tqdm.write(f"ctrlsim: {message}", file=sys.stderr)

    def epoch(self, epoch: int, loss: float, score: float, best: float, seconds: float) -> None:
        line = (f"epoch {epoch + 1}: train loss {loss:.4f}, valid NDCG@10 {score:.4f} "
                f"(best {best:.4f}), {seconds:.1f} s")
        _log.info(line)
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.2f}, valid NDCG@10 {score:.4f}, best {best:.4f}")
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(dataset: Dataset, model_cls: type, config: SequentialConfig, *, threads: int = 1,
          progress: bool = True) -> tuple[Any, dict, dict]:
    """Train `model_cls` with RecBole on `dataset`; returns (model, state_dict copy, meta).

    Evaluation is RecBole's: leave-one-out by time (last item test, second-last
    validation), full ranking; early stopping on validation NDCG@10; the best
    validation epoch's weights are kept and scored on the test split.
    """
    rb = _recbole()
    torch = rb.torch
    name = model_cls.__name__
    started = time.perf_counter()
    bar = _Progress(progress, config.epochs, f"{name} on {dataset.name}")
    try:
        with tempfile.TemporaryDirectory(prefix="ctrlsim-recbole-") as tmp, \
                _recbole_sandbox(Path(tmp), threads):
            bar.say(f"training {name} on {dataset.name} ({len(dataset.interactions):,} interactions, "
                    f"at most {config.epochs} epochs, {threads} thread(s)); preparing RecBole data")
            write_atomic_files(dataset, Path(tmp))
            params = {
                "data_path": tmp,
                "checkpoint_dir": str(Path(tmp) / "saved"),
                "load_col": {"inter": ["user_id", "item_id", "rating", "timestamp"]},
                "USER_ID_FIELD": "user_id", "ITEM_ID_FIELD": "item_id",
                "RATING_FIELD": "rating", "TIME_FIELD": "timestamp",
                "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user",
                              "mode": {"valid": "full", "test": "full"}},
                "repeatable": True,
                "metrics": [m.split("@")[0] for m in METRICS],
                "topk": [10],
                "valid_metric": "NDCG@10",
                "eval_step": 1,
                "train_neg_sample_args": None,
                "gpu_id": "", "use_gpu": False,
                "show_progress": False, "log_wandb": False,
                "save_dataset": False, "save_dataloaders": False,
                "reproducibility": True, "worker": 0, "state": "INFO",
            }
            params.update(config.recbole_overrides())
            try:
                rb_config = rb.Config(model=model_cls, dataset=_RECBOLE_DATASET, config_dict=params)
                rb.init_seed(rb_config["seed"], rb_config["reproducibility"])
                rb_data = rb.create_dataset(rb_config)
                train_data, valid_data, test_data = rb.data_preparation(rb_config, rb_data)
                rb.init_seed(rb_config["seed"] + rb_config["local_rank"], rb_config["reproducibility"])
                model = model_cls(rb_config, train_data._dataset).to(rb_config["device"])
                trainer = rb.get_trainer(rb_config["MODEL_TYPE"], rb_config["model"])(rb_config, model)
            except (ValueError, KeyError, TypeError, RuntimeError, AttributeError, IndexError) as exc:
                raise ModelError(f"RecBole could not set up {name} on {dataset.name}: "
                                 f"{type(exc).__name__}: {exc}") from exc

            best: dict[str, Any] = {"state": None, "epoch": None}
            last = [time.perf_counter()]

            def on_epoch(epoch_idx: int, valid_score: float) -> None:
                if trainer.cur_step == 0:  # early_stopping reset the counter: a new best
                    best["state"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
                    best["epoch"] = epoch_idx
                now = time.perf_counter()
                loss = trainer.train_loss_dict.get(epoch_idx, float("nan"))
                bar.epoch(epoch_idx, float(loss), float(valid_score), float(trainer.best_valid_score), now - last[0])
                last[0] = now

            bar.start()
            try:
                trainer.fit(train_data, valid_data, verbose=False, saved=False, show_progress=False,
                            callback_fn=on_epoch)
                epochs_run = len(trainer.train_loss_dict)
                if best["state"] is not None:
                    model.load_state_dict(best["state"])
                test_result = trainer.evaluate(test_data, load_best_model=False, show_progress=False)
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"RecBole training of {name} on {dataset.name} failed: {exc}") from exc
            finally:
                trainer.tensorboard.close()
            state_dict = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            other = model.other_parameter()
            if other:
                raise ModelError(f"{name} keeps parameters outside its state_dict ({sorted(other)}); "
                                 "ctrlsim cannot cache it")
            item_field = rb_config["ITEM_ID_FIELD"]
            tokens = list(rb_data.field2id_token[item_field])
            item_tokens = [None] + [token_to_item_id(dataset, str(t)) for t in tokens[1:]]
            meta = {
                "format": CACHE_FORMAT,
                "model": name,
                "dataset": dataset.name,
                "n_interactions": int(len(dataset.interactions)),
                "interactions_sha256": interactions_digest(dataset),
                "config": config.to_dict(),
                "model_config": _scalar_config(rb_config),
                "item_tokens": item_tokens,
                "n_users": int(rb_data.num(rb_config["USER_ID_FIELD"])),
                "epochs_run": epochs_run,
                "best_epoch": None if best["epoch"] is None else int(best["epoch"]) + 1,
                "valid_metrics": {k: float(v) for k, v in (trainer.best_valid_result or {}).items()},
                "test_metrics": {k: float(v) for k, v in test_result.items()},
                "train_seconds": round(time.perf_counter() - started, 2),
                "threads": threads,
                "recbole_version": getattr(rb.recbole, "__version__", "unknown"),
                "torch_version": torch.__version__,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            }
    finally:
        bar.close()
    model.cpu().eval()
    test = meta["test_metrics"]
    bar.say(f"trained {name} in {meta['train_seconds']:.0f} s ({epochs_run} epochs, best {meta['best_epoch']}): "
            f"test NDCG@10 {test.get('ndcg@10', float('nan')):.4f}, Hit@10 {test.get('hit@10', float('nan')):.4f}")
    return model, state_dict, meta


# ====================================================================== recommender
class SequentialRecommender(Recommender):
    """A RecBole sequential model (SASRec, NARM, GRU4Rec, ...) as a black box.

    Trains on first use (minutes on CPU for ml-100k; progress on stderr) and
    caches under `cache_dir("recbole", cache_key)`; later constructions load the
    cached weights. `score_all` runs one batched forward pass for all states.

    Args:
        dataset: the catalogue and the interactions to train on.
        model: a RecBole sequential model name, case-insensitive.
        config: training settings and architecture overrides (default `SequentialConfig()`).
        threads: torch intra-op threads for training and scoring (restored afterwards).
        exclude_history, mask_shown: see `Recommender`.
        progress: show training progress on stderr.

    Raises `ModelError` for unknown or unsupported model names and unloadable
    caches, `MissingDependencyError` without torch/RecBole.
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
        _positive_int("threads", threads)
        self.config = config
        self.threads = int(threads)
        model_cls = resolve_model(model)
        self.model_name = model_cls.__name__
        self.name = self.model_name.lower()
        config.check_model(self.model_name)
        self.cache_key = cache_key(dataset, self.model_name, config)
        self.cache_path = cache_dir("recbole", self.cache_key)
        if (self.cache_path / "meta.json").is_file():
            self.model, self.meta = load_cached(self.cache_path, model_cls)
            self.loaded_from_cache = True
        else:
            self.model, state_dict, self.meta = train(dataset, model_cls, config, threads=self.threads,
                                                      progress=progress)
            _save_cache(self.cache_path, state_dict, self.meta)
            self._verify_reload(model_cls)
            self.loaded_from_cache = False
        self._scorer = _Scorer(self.model, self.meta["model_config"], len(self.meta["item_tokens"]), self.threads)
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
                raise EmptyHistoryError(f"{who} has an empty history; {self.model_name} needs at least one item")
            internal = self._internal[self.dataset.indices(state.history)]
            internal = internal[internal > 0]
            if not len(internal):
                shown = ", ".join(repr(i) for i in state.history[:5])
                raise EmptyHistoryError(f"{who}: none of its history items ({shown}) occur in the interactions "
                                        f"{self.model_name} was trained on")
            sequences.append(internal)
        return sequences

    def score_internal(self, states: Sequence[UserState]) -> np.ndarray:
        """Raw model scores over RecBole internal ids (column 0, the padding, is -inf)."""
        return self._scorer.scores(self._sequences(list(states)))

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
        reloaded, _ = load_cached(self.cache_path, model_cls)
        n_items = len(self.meta["item_tokens"])
        rng = np.random.default_rng(0)
        sequences = [rng.integers(1, n_items, size=length) for length in (1, 5, self._max_len(), self._max_len() + 7)]
        mine = _Scorer(self.model, self.meta["model_config"], n_items, self.threads).scores(sequences)
        theirs = _Scorer(reloaded, self.meta["model_config"], n_items, self.threads).scores(sequences)
        if not np.array_equal(mine, theirs):
            raise ModelError(f"the cached {self.model_name} in {self.cache_path} scores differently from the "
                             f"trained model (max difference {np.nanmax(np.abs(mine[:, 1:] - theirs[:, 1:])):.3g})")

    def _max_len(self) -> int:
        return int(self.meta["model_config"]["MAX_ITEM_LIST_LENGTH"])
