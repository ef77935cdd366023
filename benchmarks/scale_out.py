"""Units per minute: the local executor vs. Ray with 1 and 2 workers, on the same run, side by side.

Two workloads, each run by every executor:

  episodes   CPU-bound units: one PopulationEnv episode of K random probes against the
             popularity box on ml-100k (the env is built once per worker via `worker_cache`)
  cheap      units that return at once: what the Ray path costs per unit (scheduling,
             serialising the record, the driver's `on_record`)

Each Ray executor starts its own local Ray with `num_workers` CPUs; its start and a warm-up
(every worker imports ctrlsim and builds the env) are reported apart from the timed runs.
The records of every executor are compared with the local ones: they must be identical.

    python benchmarks/scale_out.py --episodes 40 --cheap 400
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from ctrlsim.agents import RandomProbe
from ctrlsim.envs import PopulationEnv
from tabulate import tabulate

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=40, help="CPU-bound units per executor")
    parser.add_argument("--cheap", type=int, default=400, help="near-empty units per executor")
    parser.add_argument("--agents", type=int, default=26)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", default="1,2", help="Ray worker counts to compare with local")
    args = parser.parse_args()

    config = {"agents": args.agents, "rounds": args.rounds}
    episode_keys = [f"episode/{i}" for i in range(args.episodes)]
    cheap_keys = [f"cheap/{i}" for i in range(args.cheap)]
    modes = [("local", {})] + [(f"ray, {n} worker{'s' if n > 1 else ''}", {"num_workers": n})
                               for n in map(int, args.workers.split(","))]
    rows, reference = [], None
    for name, options in modes:
        started = time.perf_counter()
        with make_executor("local" if not options else "ray", **options) as executor:
            warm_keys = [f"episode/{10**6 + i}" for i in range(2 * options.get("num_workers", 1))]
            executor.run(episode_unit, config, warm_keys, lambda k, r: None, progress=False)
            startup = time.perf_counter() - started
            episode_s, records = timed_run(executor, episode_unit, config, episode_keys)
            cheap_s, _ = timed_run(executor, cheap_unit, config, cheap_keys)
        if reference is None:
            reference, local_episode_s, local_cheap_s = records, episode_s, cheap_s
        rows.append([name, f"{startup:.1f}", f"{60 * len(episode_keys) / episode_s:.0f}",
                     f"{local_episode_s / episode_s:.2f}", f"{1000 * cheap_s / len(cheap_keys):.2f}",
                     f"{1000 * (cheap_s - local_cheap_s) / len(cheap_keys):+.2f}",
                     "yes" if records == reference else "NO"])
        print(f"{name}: done", flush=True)
    load = os.getloadavg()
    print(f"\n{args.episodes} episodes ({args.agents} random probes x {args.rounds} rounds, popularity box, "
          f"ml-100k); {args.cheap} cheap units; {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n")
    print(tabulate(rows, headers=["executor", "start + warm-up (s)", "episodes/min", "x local",
                                  "ms per cheap unit", "overhead vs local (ms)", "same records"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
