"""Training a RecBole sequential model on a `Dataset`, with RecBole's own evaluation."""
from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ctrlsim.data import Dataset
from ctrlsim.errors import ModelError
from ctrlsim.recommenders.recbole.atomic_files import RECBOLE_DATASET, token_to_item_id, write_atomic_files
from ctrlsim.recommenders.recbole.cache import (
    CACHE_FORMAT,
    interactions_digest,
    non_finite_weights,
    scalar_config,
)
from ctrlsim.recommenders.recbole.config import SequentialConfig
from ctrlsim.recommenders.recbole.sandbox import import_recbole, recbole_sandbox

#: Metrics RecBole computes on the validation split (early stopping) and the test split.
METRICS = ("NDCG@10", "Hit@10")

_log = logging.getLogger(__name__)


def _recbole_params(folder: Path, config: SequentialConfig) -> dict:
    """RecBole settings: ctrlsim's fixed protocol, then the config's overrides."""
    params = {
        "data_path": str(folder),
        "checkpoint_dir": str(folder / "saved"),
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
    return params


def _progress(enabled: bool, total: int, desc: str, stack: contextlib.ExitStack):
    """A per-epoch bar on stderr; while it is open, log lines (ctrlsim's and RecBole's) print above it."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    if enabled:
        # Root: where RecBole logs and most handlers live; "ctrlsim": handlers set on our own loggers.
        stack.enter_context(logging_redirect_tqdm([logging.getLogger(), logging.getLogger("ctrlsim")],
                                                  tqdm_class=tqdm))
    return stack.enter_context(tqdm(total=total, desc=desc, unit="epoch", file=sys.stderr, leave=True,
                                    disable=not enabled))


def train(dataset: Dataset, model_cls: type, config: SequentialConfig, *, threads: int = 1,
          progress: bool = True) -> tuple[Any, dict, dict]:
    """Train `model_cls` with RecBole on `dataset`; returns (model, state_dict copy, meta).

    Evaluation is RecBole's: leave-one-out by time (last item test, second-last
    validation), full ranking; early stopping on validation NDCG@10; the best
    validation epoch's weights are kept and scored on the test split.
    """
    rb = import_recbole()
    torch = rb.torch
    name = model_cls.__name__
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        bar = _progress(progress, config.epochs, f"{name} on {dataset.name}", stack)
        _log.info("training %s on %s (%s interactions, at most %d epochs, %d thread(s))",
                  name, dataset.name, f"{len(dataset.interactions):,}", config.epochs, threads)
        bar.set_postfix_str("preparing RecBole data")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ctrlsim-recbole-")))
        stack.enter_context(recbole_sandbox(tmp, threads))
        write_atomic_files(dataset, tmp)
        try:
            rb_config = rb.Config(model=model_cls, dataset=RECBOLE_DATASET,
                                  config_dict=_recbole_params(tmp, config))
            rb.init_seed(rb_config["seed"], rb_config["reproducibility"])
            rb_data = rb.create_dataset(rb_config)
            train_data, valid_data, test_data = rb.data_preparation(rb_config, rb_data)
            rb.init_seed(rb_config["seed"] + rb_config["local_rank"], rb_config["reproducibility"])
            model = model_cls(rb_config, train_data._dataset).to(rb_config["device"])
            trainer = rb.get_trainer(rb_config["MODEL_TYPE"], rb_config["model"])(rb_config, model)
        except (ValueError, KeyError, TypeError, RuntimeError, AttributeError, IndexError) as exc:
            raise ModelError(f"RecBole could not set up {name} on {dataset.name}: "
                             f"{type(exc).__name__}: {exc}") from exc
        bar.set_postfix_str("training")

        best: dict[str, Any] = {"state": None, "epoch": None}
        last = [time.perf_counter()]

        def on_epoch(epoch_idx: int, valid_score: float) -> None:
            if trainer.cur_step == 0:  # early_stopping reset its counter: a new best
                best["state"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
                best["epoch"] = epoch_idx
            now = time.perf_counter()
            loss = float(trainer.train_loss_dict.get(epoch_idx, float("nan")))
            _log.info("%s epoch %d: train loss %.4f, valid NDCG@10 %.4f (best %.4f), %.1f s", name,
                      epoch_idx + 1, loss, valid_score, trainer.best_valid_score, now - last[0])
            bar.set_postfix_str(f"loss {loss:.2f}, valid NDCG@10 {valid_score:.4f}, "
                                f"best {trainer.best_valid_score:.4f}")
            bar.update(1)
            last[0] = now

        try:
            trainer.fit(train_data, valid_data, verbose=False, saved=False, show_progress=False,
                        callback_fn=on_epoch)
            epochs_run = len(trainer.train_loss_dict)
            if best["state"] is not None:
                model.load_state_dict(best["state"])
            bar.set_postfix_str("testing")
            test_result = trainer.evaluate(test_data, load_best_model=False, show_progress=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"RecBole training of {name} on {dataset.name} failed: {exc}") from exc
        finally:
            trainer.tensorboard.close()
        state_dict = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        diverged = non_finite_weights(state_dict)
        if diverged:
            raise ModelError(f"training {name} on {dataset.name} diverged: weights {diverged[:5]} hold "
                             "NaN or infinite values (try a lower learning_rate)")
        other = model.other_parameter()
        if other:
            raise ModelError(f"{name} keeps parameters outside its state_dict ({sorted(other)}); "
                             "ctrlsim cannot cache it")
        tokens = list(rb_data.field2id_token[rb_config["ITEM_ID_FIELD"]])
        meta = {
            "format": CACHE_FORMAT,
            "model": name,
            "dataset": dataset.name,
            "n_interactions": int(len(dataset.interactions)),
            "interactions_sha256": interactions_digest(dataset),
            "config": config.to_dict(),
            "model_config": scalar_config(rb_config),
            "item_tokens": [None] + [token_to_item_id(dataset, str(t)) for t in tokens[1:]],
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
        test = meta["test_metrics"]
        summary = (f"test NDCG@10 {test.get('ndcg@10', float('nan')):.4f}, "
                   f"Hit@10 {test.get('hit@10', float('nan')):.4f}")
        bar.set_postfix_str(summary)
        _log.info("trained %s in %.0f s (%d epochs, best %s): %s", name, meta["train_seconds"], epochs_run,
                  meta["best_epoch"], summary)
    model.cpu().eval()
    return model, state_dict, meta
