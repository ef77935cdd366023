"""What a served black box costs per step: the same episodes in-process and through `ctrlsim serve`
(stateless and stateful), measured side by side in one run, reported as times and ratios.

    python benchmarks/http_box_overhead.py                 # dial:1, 8 episodes of 20 rounds
    python benchmarks/http_box_overhead.py --box popularity --episodes 4

The episodes are checked to be identical across the three ways (the slates, step by step), so the
ratio compares the same work. The served box runs in its own process on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import time


def episodes(env, n: int, rounds: int) -> tuple[float, list]:
    import numpy as np

    started = time.perf_counter()
    seen = []
    for seed in range(n):
        observation, _ = env.reset(seed=seed)
        for step in range(rounds):
            likes = np.array([(seed + step + position) % 2 for position in range(len(observation["slate"]))])
            observation, *_ = env.step({"likes": likes, "query": ""})
            seen.append(observation["slate"].tolist())
    return time.perf_counter() - started, seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--box", default="dial:1")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)

    from ctrlsim.envs import ProbeEnv
    from tabulate import tabulate

    from ctrlsim.data import load_dataset
    from ctrlsim.recommenders.http.serve_process import ServedBox

    dataset = load_dataset("ml-100k")
    print(f"load average {os.getloadavg()[0]:.2f} at start")
    served = ServedBox(args.box)
    try:
        results = {}
        for label, spec in (
            ("in-process", args.box),
            ("served, stateless", served.url),
            ("served, stateful", f"{served.url}#mode=stateful"),
        ):
            env = ProbeEnv(spec, dataset=dataset, target="War", budget=args.rounds, allow_search=False)
            episodes(env, 1, 2)  # warm-up: imports, first connection
            results[label] = episodes(env, args.episodes, args.rounds)
    finally:
        served.stop()
    reference_seconds, reference = results["in-process"]
    steps = args.episodes * args.rounds
    rows = []
    for label, (seconds, seen) in results.items():
        assert seen == reference, f"{label}: the episodes differ from the in-process ones"
        rows.append([label, f"{1000 * seconds / steps:.2f}", f"{seconds / reference_seconds:.1f}x"])
    print(tabulate(rows, headers=["box", "ms per step", "vs in-process"], tablefmt="github"))
    print(f"{steps} steps each, identical slates; load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
