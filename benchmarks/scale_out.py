"""Units per minute: the local executor vs. Ray with 1 and 2 workers, on the same run, side by side.

Two workloads, each run by every executor:

  episodes   CPU-bound units: one PopulationEnv episode of K random probes against the
             popularity box on ml-100k (the env is built once per worker via `worker_cache`)
  cheap      units that return at once: what the Ray path costs per unit (scheduling,
             serialising the record, the driver's `on_record`)

One local Ray with as many CPUs as the most workers compared; "ray, N workers" runs at most
N units at once on it. After a warm-up (every worker imports ctrlsim and builds the env) the
executors take turns for `--passes` passes and the best pass of each is reported, so load
that drifts during the run hits them alike. The records of every executor are compared with
the local ones: they must be identical.

`--servers URL[,URL...]` adds a served-LLM table: one `chat` batch sent to OpenAI-compatible
servers (several URLs are replicas of one model) with `max_concurrency` 1, 2 and 4.

    python benchmarks/scale_out.py --episodes 40 --cheap 400
    python -m ctrlsim.backends.llamacpp.server --model MODEL.gguf --port 8001 &   # one per slot
    python -m ctrlsim.backends.llamacpp.server --model MODEL.gguf --port 8002 &
    python benchmarks/scale_out.py --episodes 0 --servers http://127.0.0.1:8001/v1,http://127.0.0.1:8002/v1
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from ctrlsim.agents import RandomProbe
from ctrlsim.envs import PopulationEnv
from tabulate import tabulate
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from ctrlsim.experiments._ray_executor import import_ray
from ctrlsim.experiments.executor import make_executor, worker_cache
from ctrlsim.seeding import derive_rng


def episode_unit(config: dict, key: str) -> dict:
    """One seeded population episode; the record holds its final metrics."""
    env = worker_cache(f"scale-out-env:{config['agents']}:{config['rounds']}",
                       lambda: PopulationEnv("popularity", n_agents=config["agents"], budget=config["rounds"],
                                             target="Film-Noir"))
    seed = int(key.split("/")[1])
    obs, _ = env.reset(seed=seed)
    policies = {a: RandomProbe(derive_rng(seed, "policy", a)) for a in env.agents}
    while env.agents:
        obs, *_ = env.step({a: policies[a].act(obs[a]) for a in env.agents})
    metrics = env.population_metrics()
    return {k: float(v) if isinstance(v, (int, float, np.floating)) else v for k, v in metrics.items()}


def cheap_unit(config: dict, key: str) -> dict:
    return {"key": key}


def timed_run(executor, unit_fn, config, keys) -> tuple[float, dict]:
    records: dict = {}
    started = time.perf_counter()
    executor.run(unit_fn, config, keys, records.__setitem__, progress=False)
    return time.perf_counter() - started, records


def served_rows(servers: str, batch: int, max_tokens: int) -> list[list]:
    """Seconds for one batch at several max_concurrency values; the replies must not change."""
    from ctrlsim.backends.openai_compat import OpenAICompatLLM

    conversations = [[{"role": "user", "content": f"Name one film about the number {i}."}]
                     for i in range(batch)]
    rows, reference, first = [], None, None
    for concurrency in (1, 2, 4):
        llm = OpenAICompatLLM(servers, max_concurrency=concurrency)
        started = time.perf_counter()
        replies = llm.chat(conversations, max_tokens=max_tokens)
        seconds = time.perf_counter() - started
        texts = [r.text for r in replies]
        reference, first = reference or texts, first or seconds
        counts = [r.completion_tokens for r in replies]  # None where the server sent no usage
        rate = "unknown (no token counts)" if None in counts else f"{sum(counts) / seconds:.1f}"
        rows.append([concurrency, f"{seconds:.2f}", rate, f"{first / seconds:.2f}",
                     "yes" if texts == reference else "NO"])
        llm.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=40, help="CPU-bound units per executor")
    parser.add_argument("--cheap", type=int, default=400, help="near-empty units per executor")
    parser.add_argument("--agents", type=int, default=26)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", default="1,2", help="Ray worker counts to compare with local")
    parser.add_argument("--passes", type=int, default=3, help="passes per executor (best one reported)")
    parser.add_argument("--servers", default=None, help="OpenAI-compatible server URL(s), comma-separated")
    parser.add_argument("--batch", type=int, default=8, help="conversations per served batch")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    if args.servers:
        rows = served_rows(args.servers, args.batch, args.max_tokens)
        print(f"\none chat batch of {args.batch} conversations, {args.max_tokens} tokens each, to "
              f"{args.servers.count(',') + 1} server(s)\n")
        print(tabulate(rows, headers=["max_concurrency", "seconds", "generated tokens/s", "x serial",
                                      "same replies"], tablefmt="github"))
    if args.episodes < 1:
        return

    config = {"agents": args.agents, "rounds": args.rounds}
    episode_keys = [f"episode/{i}" for i in range(args.episodes)]
    cheap_keys = [f"cheap/{i}" for i in range(args.cheap)]
    workers = [int(n) for n in args.workers.split(",")]
    # One Ray with as many CPUs as the largest worker count; each Ray executor attaches to it and
    # caps its units in flight at its worker count. So the modes can alternate pass after pass
    # (a busy machine's load drifts; the best pass of each mode is reported).
    started = time.perf_counter()
    import_ray().init(num_cpus=max(workers), include_dashboard=False, logging_level="ERROR")
    ray_start = time.perf_counter() - started
    executors = {"local": make_executor("local")}
    executors.update({f"ray, {n} worker{'s' if n > 1 else ''}": make_executor("ray", num_workers=n)
                      for n in workers})
    warm_keys = [f"episode/{10**6 + i}" for i in range(2 * max(workers))]
    for executor in executors.values():  # every worker imports ctrlsim and builds its env
        executor.run(episode_unit, config, warm_keys, lambda k, r: None, progress=False)
    best: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name in executors}
    records: dict[str, dict] = {}
    # Ray gives each worker one BLAS/OpenMP thread per CPU it holds; the local run gets the same,
    # else its BLAS threads spin against the other processes of a busy machine.
    with threadpool_limits(limits=1):
        for _ in tqdm(range(args.passes), desc="passes"):
            for name, executor in executors.items():
                episode_s, records[name] = timed_run(executor, episode_unit, config, episode_keys)
                cheap_s, _ = timed_run(executor, cheap_unit, config, cheap_keys)
                best[name] = [min(best[name][0], episode_s), min(best[name][1], cheap_s)]
    for executor in executors.values():
        executor.close()
    local_episode_s, local_cheap_s = best["local"]
    rows = [[name, f"{60 * len(episode_keys) / episode_s:.0f}", f"{local_episode_s / episode_s:.2f}",
             f"{1000 * cheap_s / len(cheap_keys):.2f}",
             f"{1000 * (cheap_s - local_cheap_s) / len(cheap_keys):+.2f}",
             "yes" if records[name] == records["local"] else "NO"]
            for name, (episode_s, cheap_s) in best.items()]
    load = os.getloadavg()
    print(f"\n{args.episodes} episodes ({args.agents} random probes x {args.rounds} rounds, popularity box, "
          f"ml-100k); {args.cheap} cheap units; best of {args.passes} passes; "
          f"Ray started in {ray_start:.1f} s; {os.cpu_count()} CPUs, "
          f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n")
    print(tabulate(rows, headers=["executor", "episodes/min", "x local", "ms per cheap unit",
                                  "overhead vs local (ms)", "same records"], tablefmt="github"))


if __name__ == "__main__":
    main()
