"""Population steps per second: one batched PopulationEnv vs. a loop of single ProbeEnvs.

K random probes (default 100) on each non-LLM black box, same seeds, same
slates; both variants run side by side in one process. A "population step"
is one round for all K probes. Prints steps/s for both and the ratio.

    python benchmarks/population_throughput.py --agents 100 --rounds 10
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from ctrlsim.agents import RandomProbe
from ctrlsim.envs import PopulationEnv, ProbeEnv
from tabulate import tabulate
from tqdm import tqdm

from ctrlsim.data import load_dataset
from ctrlsim.recommenders import make_recommender


def batched(rec, k, rounds, seed) -> tuple[float, list]:
    env = PopulationEnv(rec, n_agents=k, budget=rounds, target="Film-Noir")
    obs, _ = env.reset(seed=seed)
    roster = [p.spec for p in env.probes.values()]
    pols = {a: RandomProbe(np.random.default_rng([seed, i])) for i, a in enumerate(env.agents)}
    t0 = time.perf_counter()
    while env.agents:
        obs, *_ = env.step({a: pols[a].act(obs[a]) for a in env.agents})
    return time.perf_counter() - t0, roster


def looped(rec, roster, rounds, seed) -> float:
    envs = [ProbeEnv(rec, budget=rounds, target="Film-Noir") for _ in roster]
    obs = [e.reset(seed=seed, options={"probe": spec})[0] for e, spec in zip(envs, roster)]
    pols = [RandomProbe(np.random.default_rng([seed, i])) for i in range(len(roster))]
    t0 = time.perf_counter()
    for _ in range(rounds):
        for i, env in enumerate(envs):
            obs[i] = env.step(pols[i].act(obs[i]))[0]
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per variant; the best counts")
    parser.add_argument("--recommenders", default="popularity,embedding,twhin-bert,bge,sasrec,narm")
    args = parser.parse_args()

    ds = load_dataset("ml-100k")
    rows = []
    for name in tqdm(args.recommenders.split(","), desc="recommenders"):
        opts = {"encoder": "minilm"} if name in ("embedding", "twhin-bert", "bge") else {}
        rec = make_recommender(name, ds, mask_shown=True, **opts)
        # Best of `repeats`: the first pass through a model pays one-off warm-up costs.
        t_batch, roster = min(batched(rec, args.agents, args.rounds, args.seed) for _ in range(args.repeats))
        t_loop = min(looped(rec, roster, args.rounds, args.seed) for _ in range(args.repeats))
        rows.append([name, args.agents, args.rounds / t_batch, args.rounds / t_loop, t_loop / t_batch])
    print(tabulate(rows, headers=["recommender", "K", "steps/s batched", "steps/s single-env loop",
                                  "ratio"], floatfmt=".2f"))


if __name__ == "__main__":
    main()
