"""Continuous batching with separate KV streams against groups one after another, side by side.

The workload is the evolution loop's debate (`agents.evolution.debate.run_debate`, the paper's
prompts): template personas of ml-100k users in clusters of two, two rounds, sampled at the
temperature and with the turn length of `ctrlsim evolve`'s defaults (`EvolveConfig`), each
conversation with its own seed. Both variants run in one process on one model with separate KV
streams (`kv_streams=True`) and a cleared KV cache before each debate, alternating, so the
machine's state is shared:

  grouped     the call's prompts in groups of `n_parallel`, a group starting when the last one
              ends (a group's steps narrow while its last sequences finish);
  continuous  a waiting prompt takes the first stream that frees, its prompt tokens in the same
              decode as the other sequences' next tokens (what ctrlsim does with streams).

Prints a table (wall seconds, decode steps, mean sequences per step, generated tokens, tokens
evaluated) per run, the machine load, and last `continuous vs grouped: <ratio>x` (grouped wall
time over continuous, medians over the repetitions). Sampled replies depend on their seeds only,
so both variants generate the same text up to batching noise; the generated-token column shows
how close they came.

    python benchmarks/continuous_batching.py --llm qwen2.5-0.5b --clusters 16 --repeat 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from ctrlsim.agents.evolution.debate import GenerationSettings, run_debate
from ctrlsim.agents.profiles import ProfileGenerator
from ctrlsim.agents.prompts import domain_nouns
from ctrlsim.envs.roster import user_order
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset
from ctrlsim.experiments.evolve.config import EvolveConfig


def one_debate(llm, groups, dataset, continuous: bool) -> dict:
    parallel = llm._parallel_context()
    parallel.reset()
    parallel.continuous = continuous
    steps, widths, evaluated = parallel.steps, parallel.step_sequences, llm.evaluated_tokens
    defaults = EvolveConfig()
    settings = GenerationSettings(max_tokens=defaults.debate_max_tokens, temperature=defaults.temperature,
                                  seed=0)
    start = time.perf_counter()
    transcripts = run_debate(llm, groups, dataset, domain_nouns(dataset.name), settings)
    wall = time.perf_counter() - start
    steps, widths = parallel.steps - steps, parallel.step_sequences - widths
    turns = [t for transcript in transcripts for t in transcript]
    return {"variant": "continuous" if continuous else "grouped", "wall s": round(wall, 1),
            "decode steps": steps, "sequences/step": round(widths / max(steps, 1), 1),
            "turns": len(turns), "generated tokens": sum(len(llm.tokenize(t.text)) for t in turns),
            "tokens evaluated": llm.evaluated_tokens - evaluated,
            "load": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--clusters", type=int, default=16, help="clusters of two probes that debate")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant, alternating")
    args = parser.parse_args()

    dataset = load_dataset("ml-100k")
    llm = load_llm(args.llm, kv_streams=True)
    profiles = ProfileGenerator(dataset, llm)
    users = user_order(dataset)[: 2 * args.clusters]
    personas = [profiles.template_persona(u, profiles.seed_items(u, 0)) for u in users]
    groups = [personas[n:n + 2] for n in range(0, len(personas), 2)]
    print(f"{args.llm}, {len(groups)} clusters of two, n_parallel {llm.n_parallel}, "
          f"{llm.n_threads} thread(s), load before {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for _ in range(args.repeat):
        for continuous in (False, True):
            rows.append(one_debate(llm, groups, dataset, continuous))
            print(rows[-1], flush=True)
    print(tabulate(rows, headers="keys", tablefmt="github"))
    median = {v: statistics.median(r["wall s"] for r in rows if r["variant"] == v)
              for v in ("grouped", "continuous")}
    print(f"continuous vs grouped: {median['grouped'] / median['continuous']:.2f}x")


if __name__ == "__main__":
    main()
