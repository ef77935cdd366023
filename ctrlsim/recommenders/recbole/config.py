"""`SequentialConfig`: training settings and architecture overrides of a RecBole box."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.recbole.models import model_defaults

# Settings ctrlsim owns; `recbole_params` may not override them.
RESERVED = frozenset({
    "model", "dataset", "data_path", "checkpoint_dir", "load_col", "unload_col", "eval_args",
    "USER_ID_FIELD", "ITEM_ID_FIELD", "RATING_FIELD", "TIME_FIELD", "metrics", "topk",
    "valid_metric", "gpu_id", "use_gpu", "log_wandb", "save_dataset", "save_dataloaders",
    "dataset_save_path", "dataloaders_save_path", "show_progress", "benchmark_filename",
    "epochs", "stopping_step", "train_batch_size", "eval_batch_size", "learning_rate",
    "MAX_ITEM_LIST_LENGTH", "seed", "reproducibility", "repeatable", "eval_step",
})

ARCHITECTURE = ("hidden_size", "n_layers", "n_heads", "embedding_size")


def positive_int(name: str, value) -> None:
    """Raise `ConfigError` unless `value` is an int >= 1 (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class SequentialConfig:
    """Training settings and model overrides for a RecBole sequential model.

    Defaults are the settings measured to train well on CPU (docs/recbole.md):
    CE loss without negative sampling, history length 20, batch 256, early
    stopping after 3 epochs without a better validation NDCG@10, at most 30
    epochs. Architecture fields left at None keep RecBole's defaults, which are
    also CtrlBench-Rec's: SASRec hidden_size 64, n_layers 2, n_heads 2 (inner
    256, dropout 0.5); NARM embedding_size 64, hidden_size 128, n_layers 1,
    dropout [0.25, 0.5]; GRU4Rec embedding 64, hidden 128.

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

    def __post_init__(self):
        for name in ("epochs", "stopping_step", "train_batch_size", "eval_batch_size", "max_seq_length"):
            positive_int(name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {self.seed!r}")
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float)) \
                or not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        for name in ARCHITECTURE:
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        params = dict(self.recbole_params or {})
        for key in params:
            if not isinstance(key, str):
                raise ConfigError(f"recbole_params keys must be strings, got {key!r}")
            if key in RESERVED:
                raise ConfigError(f"recbole_params may not set {key!r}: ctrlsim sets it "
                                  "(use the SequentialConfig field where there is one)")
            if key in ARCHITECTURE:
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
        set_fields = [n for n in ARCHITECTURE if getattr(self, n) is not None]
        if not set_fields:
            return
        defaults = model_defaults(model)
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
        out.update({n: getattr(self, n) for n in ARCHITECTURE if getattr(self, n) is not None})
        out.update(self.recbole_params)
        return out
