"""Compare SASRec/NARM scores across environments (numpy 1 vs 2, Python 3.11 vs 3.13) on the same weights.

Run `save` in one environment and `compare` in another that shares `$CTRLSIM_CACHE` (the same
cached ml-100k models, trained with the test suite's `TEST_CONFIG`, so a cache the tests filled is
reused). `save` trains the models if the cache lacks them; `compare` refuses to train (new weights
would prove nothing) and exits 1 unless every score is within `--atol` of the saved one and every
top-20 slate is the same.

    .venv/bin/python .ci/compare_recbole_scores.py save /tmp/scores-np1.npz
    /work/py313-venv/bin/python .ci/compare_recbole_scores.py compare /tmp/scores-np1.npz
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

MODELS = ("SASRec", "NARM")
#: tests/recommenders/test_sequential.py's TEST_CONFIG: the models the test suite caches.
CONFIG: dict[str, Any] = {"epochs": 2, "train_batch_size": 256, "learning_rate": 0.003, "max_seq_length": 10}
TOP = 20


def environment() -> dict[str, str]:
    import torch

    return {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__}


def compute_scores(*, allow_training: bool) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Scores of every ml-100k user's last 15 items and of a few fixed histories, per model; cache keys."""
    from ctrlsim.data import load_dataset
    from ctrlsim.recommenders import UserState
    from ctrlsim.recommenders.recbole import SequentialConfig, SequentialRecommender

    ds = load_dataset("ml-100k")
    config = SequentialConfig(**CONFIG)
    states = [UserState(history=tuple(ds.history_ids(u)[-15:])) for u in ds.user_ids]
    states += [UserState(history=("50",)), UserState(history=("50", "181", "1")),
               UserState(history=tuple(ds.item_ids[:40]))]
    scores, keys = {}, {}
    for model in MODELS:
        box = SequentialRecommender(ds, model, config=config, threads=1, progress=False) if allow_training \
            else _cached_only(ds, model, config)
        scores[model] = box.score_all(states)
        keys[model] = box.cache_key
    return scores, keys


def _cached_only(ds, model, config):
    from ctrlsim.backends.bundled import cache_dir
    from ctrlsim.recommenders.recbole import SequentialRecommender, cache_key

    key = cache_key(ds, model, config)
    if not (cache_dir("recbole") / key / "meta.json").is_file():
        raise SystemExit(f"no cached {model} at {cache_dir('recbole') / key}: run `save` first in an "
                         "environment that shares $CTRLSIM_CACHE (compare never trains)")
    box = SequentialRecommender(ds, model, config=config, threads=1, progress=False)
    assert box.loaded_from_cache
    return box


def compare_scores(saved: np.ndarray, now: np.ndarray, atol: float, top: int = TOP) -> dict:
    """Max finite difference, whether -inf cells agree, identical top-`top` slates, and the verdict."""
    if saved.shape != now.shape:
        return {"ok": False, "problem": f"shape {now.shape} differs from the saved {saved.shape}"}
    same_inf = bool(np.array_equal(np.isneginf(saved), np.isneginf(now)))
    finite = np.isfinite(saved) & np.isfinite(now)
    gap = float(np.max(np.abs(saved[finite] - now[finite]))) if finite.any() else 0.0
    slates_saved = np.argsort(-saved, axis=1, kind="stable")[:, :top]
    slates_now = np.argsort(-now, axis=1, kind="stable")[:, :top]
    same_slates = int((slates_saved == slates_now).all(axis=1).sum())
    ok = same_inf and bool(np.isfinite(saved).sum() == finite.sum()) and gap <= atol \
        and same_slates == len(saved)
    return {"ok": ok, "max_abs_diff": gap, "bit_identical": bool(np.array_equal(saved, now)),
            "same_neg_inf": same_inf, "same_top_slates": f"{same_slates}/{len(saved)}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("save", "compare"))
    parser.add_argument("file", type=Path)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    if args.mode == "save":
        scores, keys = compute_scores(allow_training=True)
        np.savez_compressed(args.file, **scores, meta=json.dumps({"env": environment(), "keys": keys}))
        print(f"saved {', '.join(f'{m} {s.shape}' for m, s in scores.items())} to {args.file} "
              f"({environment()})")
        return 0
    with np.load(args.file) as saved_file:
        saved = {m: saved_file[m] for m in MODELS}
        meta = json.loads(str(saved_file["meta"]))
    scores, keys = compute_scores(allow_training=False)
    print(f"saved in {meta['env']}; now {environment()}")
    failed = 0
    for model in MODELS:
        if keys[model] != meta["keys"][model]:
            print(f"{model}: cache key {keys[model]} differs from the saved {meta['keys'][model]}")
            failed += 1
            continue
        result = compare_scores(saved[model], scores[model], args.atol)
        print(f"{model} ({keys[model]}, {scores[model].shape[0]} histories): {json.dumps(result)}")
        failed += not result["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
