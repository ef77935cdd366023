"""SteerEval scenarios per minute: batched pipeline vs. a naive per-item loop.

Same scenarios, same profiles (generated once, then cached), side by side:
  parallel - `SteerEvalEnv` with digit rating: one `rate` call per ranking over
             the whole pool; llama.cpp parallel sequences (profile prefix
             evaluated once, the item suffixes side by side in one llama_batch);
  batched  - the same with n_parallel=1: profile prefix evaluated once (KV
             reuse), then each item's suffix one after another;
  naive    - the SteerEval release's way: one generate-and-parse LLM call per
             item (rating="generate"), each from a fresh context.
A scenario = ranking the pool with the original and the steered profile. Times
are wall clock and CPU time (the machine is shared; CPU time is steadier).

    python benchmarks/steereval_throughput.py --llm qwen2.5-0.5b --scenarios 4 --pool-size 20
"""
from __future__ import annotations

import argparse
import time

from ctrlsim.agents.steering import TemplateAppend
from ctrlsim.envs.steereval_env import SteerEvalEnv, build_scenario, eligible_users
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset


def run(env, scenarios) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for sc in scenarios:
        obs, info = env.reset(options={"scenario": sc})
        env.step(TemplateAppend().act(obs, info))
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--scenarios", type=int, default=4)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=16, help="sequences decoded together")
    args = parser.parse_args()

    ds = load_dataset("ml-100k")
    llm = load_llm(args.llm, n_parallel=args.parallel)
    scenarios = []
    for user in eligible_users(ds):
        for tag in ("Horror", "Romance"):
            for direction in ("increase", "decrease"):
                sc = build_scenario(ds, user, tag, direction, pool_size=args.pool_size)
                if sc is not None and len(scenarios) < args.scenarios:
                    scenarios.append(sc)
        if len(scenarios) >= args.scenarios:
            break
    parallel = SteerEvalEnv(dataset=ds, llm=llm, pool_size=args.pool_size)
    batched = SteerEvalEnv(dataset=ds, llm=llm, pool_size=args.pool_size)
    naive = SteerEvalEnv(dataset=ds, llm=llm, pool_size=args.pool_size, rating="generate")
    # Every variant writes its profiles before timing (same greedy path, so the same texts), so each
    # times exactly the two rankings of a scenario: the original profile's and the steered one's.
    llm.n_parallel = args.parallel
    profiles = [[env.original_profile(sc) for sc in scenarios] for env in (parallel, batched, naive)]
    if not profiles[0] == profiles[1] == profiles[2]:
        raise SystemExit("the variants wrote different profiles; the comparison would not be fair")

    t_parallel, c_parallel = run(parallel, scenarios)
    llm.n_parallel = 1  # today's sequential paths
    t_batched, c_batched = run(batched, scenarios)
    t_naive, c_naive = run(naive, scenarios)  # every generation from a fresh context
    n = len(scenarios)
    print(f"llm={llm.identity['model']} runtime={llm.identity['runtime']} "
          f"threads={llm.identity.get('threads')} gpu_layers={llm.identity.get('gpu_layers')} "
          f"scenarios={n} pool={args.pool_size}")
    print(tabulate([[f"parallel sequences ({args.parallel}), digit rating", 60 * n / t_parallel,
                     60 * n / c_parallel, t_parallel],
                    ["batched (digit rating, shared prefix, sequential)", 60 * n / t_batched,
                     60 * n / c_batched, t_batched],
                    ["naive per-item generate-and-parse", 60 * n / t_naive, 60 * n / c_naive, t_naive]],
                   headers=["pipeline", "scenarios/min (wall)", "scenarios/min (CPU)", "seconds"],
                   floatfmt=".2f"))
    print(f"ratio parallel/batched: {t_batched / t_parallel:.2f}x wall, {c_batched / c_parallel:.2f}x CPU")
    print(f"ratio parallel/naive: {t_naive / t_parallel:.1f}x wall, {c_naive / c_parallel:.1f}x CPU")
    print(f"ratio batched/naive: {t_naive / t_batched:.1f}x wall, {c_naive / c_batched:.1f}x CPU")

if __name__ == "__main__":
    main()
