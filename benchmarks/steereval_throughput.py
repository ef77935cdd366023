"""SteerEval scenarios per minute: batched pipeline vs. a naive per-item loop.

Same scenarios, same profiles (generated once, then cached), side by side:
  batched - `SteerEvalEnv` with digit rating: one `rate` call per ranking over
            the whole pool, profile prefix evaluated once (llama.cpp KV reuse);
  naive   - the SteerEval release's way: one generate-and-parse LLM call per
            item (rating="generate"), each from a fresh context.
A scenario = ranking the pool with the original and the steered profile.

    python benchmarks/steereval_throughput.py --llm qwen2.5-0.5b --scenarios 4 --pool-size 20
"""
from __future__ import annotations

import argparse
import time

from tabulate import tabulate

from ctrlsim.agents.steering import TemplateAppend
from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset
from ctrlsim.envs.steereval_env import SteerEvalEnv, build_scenario, eligible_users


def run(env, scenarios) -> float:
    t0 = time.perf_counter()
    for sc in scenarios:
        obs, info = env.reset(options={"scenario": sc})
        env.step(TemplateAppend().act(obs, info))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--scenarios", type=int, default=4)
    parser.add_argument("--pool-size", type=int, default=20)
    args = parser.parse_args()

    ds = load_dataset("ml-100k")
    llm = load_llm(args.llm)
    scenarios = []
    for user in eligible_users(ds):
        for tag in ("Horror", "Romance"):
            for direction in ("increase", "decrease"):
                sc = build_scenario(ds, user, tag, direction, pool_size=args.pool_size)
                if sc is not None and len(scenarios) < args.scenarios:
                    scenarios.append(sc)
        if len(scenarios) >= args.scenarios:
            break
    batched = SteerEvalEnv(dataset=ds, llm=llm, pool_size=args.pool_size)
    naive = SteerEvalEnv(dataset=ds, llm=llm, pool_size=args.pool_size, rating="generate")
    for sc in scenarios:  # write the profiles once so both variants time only the rankings
        naive._original_profiles.setdefault(f"{sc.user_id}/paragraph", batched.original_profile(sc))

    t_batched = run(batched, scenarios)
    t_naive = run(naive, scenarios)  # llama.cpp generation evaluates every prompt from a fresh context
    n = len(scenarios)
    print(f"llm={llm.identity['model']} runtime={llm.identity['runtime']} threads={llm.identity.get('threads')} "
          f"scenarios={n} pool={args.pool_size}")
    print(tabulate([["batched (digit rating, shared prefix)", 60 * n / t_batched, t_batched],
                    ["naive per-item generate-and-parse", 60 * n / t_naive, t_naive]],
                   headers=["pipeline", "scenarios/min", "seconds"], floatfmt=".2f"))
    print(f"ratio batched/naive: {t_naive / t_batched:.1f}x")


if __name__ == "__main__":
    main()
