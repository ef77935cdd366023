"""Per-call vs. batched latency of every black box on ml-100k.

For each recommender: the time of N single-state `recommend` calls (one user
at a time, as a naive population loop would call it) against one call with
all N states, measured side by side in one run; prints both and the ratio.

A second table shows what building a RecBole box from its cache costs now that the
weights load on the first scores: construction (metadata only) against the first
`recommend` call (which loads the weights) and a later one.

    python benchmarks/recommender_latency.py                       # non-LLM boxes, N=100
    python benchmarks/recommender_latency.py --recbole-quick       # short RecBole training
    python benchmarks/recommender_latency.py --with-llm --llm-users 5 --llm qwen2.5-0.5b
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from tabulate import tabulate
from tqdm import tqdm

from ctrlsim.data import load_dataset
from ctrlsim.recommenders import UserState, make_recommender
from ctrlsim.recommenders.recbole import SequentialConfig

# The test suite's short training (tests/recommenders/test_sequential.py): about a minute per model.
QUICK_RECBOLE = SequentialConfig(epochs=2, train_batch_size=256, learning_rate=0.003, max_seq_length=10)


def states_for(ds, n: int, seed: int = 0) -> list[UserState]:
    rng = np.random.default_rng(seed)
    users = rng.choice(ds.user_ids, size=n, replace=False)
    return [UserState(history=tuple(ds.history_ids(u)[:20]), user_id=str(u)) for u in users]


def measure(rec, states, k, candidates=None) -> tuple[float, float]:
    rec.recommend(states[:1], k, candidates)  # warm-up (lazy loads, caches)
    t0 = time.perf_counter()
    for s in states:
        rec.recommend([s], k, candidates)
    single = time.perf_counter() - t0
    t0 = time.perf_counter()
    rec.recommend(states, k, candidates)
    batch = time.perf_counter() - t0
    return single, batch


def cached_recbole_costs(ds, name: str, config: SequentialConfig, states, k: int) -> list:
    """[name, construct ms, first recommend ms, later recommend ms] for a box already in the cache."""
    make_recommender(name, ds, config=config)  # trains and caches on the first run
    t0 = time.perf_counter()
    rec = make_recommender(name, ds, config=config)
    built = time.perf_counter() - t0
    assert rec.loaded_from_cache and not rec.model_loaded
    t0 = time.perf_counter()
    rec.recommend(states, k)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    rec.recommend(states, k)
    later = time.perf_counter() - t0
    return [name, 1000 * built, 1000 * first, 1000 * later, first / built]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--with-llm", action="store_true", help="also nl-profile and keyword-bm25")
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--llm-users", type=int, default=5)
    parser.add_argument("--pool", type=int, default=20, help="candidate pool size for nl-profile")
    parser.add_argument("--recbole-quick", action="store_true",
                        help="sasrec/narm with the test suite's short training (2 epochs, history 10) "
                             "instead of the default config")
    args = parser.parse_args()
    recbole = {"config": QUICK_RECBOLE} if args.recbole_quick else {}

    ds = load_dataset("ml-100k")
    boxes = [("popularity", {}), ("embedding", {"encoder": "minilm"}), ("twhin-bert", {"encoder": "minilm"}),
             ("bge", {"encoder": "minilm"}), ("sasrec", recbole), ("narm", recbole)]
    rows = []
    for name, opts in tqdm(boxes, desc="recommenders"):
        rec = make_recommender(name, ds, **opts)
        states = states_for(ds, args.users)
        single, batch = measure(rec, states, args.k)
        n = len(states)
        rows.append([name, n, 1000 * single / n, 1000 * batch, 1000 * batch / n, single / batch])
    if args.with_llm:
        from ctrlsim.backends import load_llm

        llm = load_llm(args.llm)
        pool = ds.items.sort_values("popularity", ascending=False)["item_id"].head(args.pool).tolist()
        for name, opts, cands in [("keyword-bm25", {"llm": llm}, None),
                                  ("nl-profile", {"llm": llm}, pool)]:
            rec = make_recommender(name, ds, **opts)
            states = states_for(ds, args.llm_users, seed=1)
            if name == "nl-profile":  # profiles are written once per history; time the ranking itself
                states = [UserState(profile=p) for p in rec.profiles(states)]
            single, batch = measure(rec, states, args.k, cands)
            n = len(states)
            rows.append([f"{name} ({args.llm})", n, 1000 * single / n, 1000 * batch, 1000 * batch / n,
                         single / batch])
    print(tabulate(rows, headers=["recommender", "users", "ms/call (single)", "ms (batch)", "ms/user (batch)",
                                  "single/batch"], floatfmt=".2f"))
    config = recbole.get("config", SequentialConfig())
    states = states_for(ds, args.users)
    cached = [cached_recbole_costs(ds, name, config, states, args.k) for name in ("sasrec", "narm")]
    print()
    print(tabulate(cached, headers=["cached box", "construct ms (metadata)", "first recommend ms (+weights)",
                                    "later recommend ms", "first/construct"], floatfmt=".1f"))


if __name__ == "__main__":
    main()
