"""Per-call vs. batched latency of every black box on ml-100k.

For each recommender: the time of N single-state `recommend` calls (one user
at a time, as a naive population loop would call it) against one call with
all N states, measured side by side in one run; prints both and the ratio.

    python benchmarks/recommender_latency.py                       # non-LLM boxes, N=100
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--with-llm", action="store_true", help="also nl-profile and keyword-bm25")
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--llm-users", type=int, default=5)
    parser.add_argument("--pool", type=int, default=20, help="candidate pool size for nl-profile")
    args = parser.parse_args()

    ds = load_dataset("ml-100k")
    boxes = [("popularity", {}), ("embedding", {"encoder": "minilm"}), ("twhin-bert", {"encoder": "minilm"}),
             ("bge", {"encoder": "minilm"}), ("sasrec", {}), ("narm", {})]
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


if __name__ == "__main__":
    main()
