"""A bundled model against its converted copies (`name@q4_0`, `@q8_0`, `@bf16`): speed and what changes.

Side by side in one run, for the bundled model and each copy (made by llama.cpp's quantizer on
first use, `ctrlsim.backends.requantize`):

  prompt tokens/s   llama.cpp evaluating one 512-token prompt from a fresh KV cache (CPU time,
                    so comparable at another load); the repacked Q4_0 kernels show here;
  episode           an episode of 16 template-persona probes against the popularity box, greedy
                    (benchmarks/llm_probe_throughput.py's): with `--conversation memory`, the
                    paper-like memory prompts from an empty KV cache every call; with `append`,
                    growing conversations with KV reuse. Wall and CPU seconds, prompt tokens
                    evaluated, unusable replies. `--runtime` gives every model the same llama.cpp
                    settings (`flash_attn=1,kv_streams=1`, appended to each spec as `@...`) and
                    CTRLSIM_THREADS its threads, so the episode runs as the run it stands for:
                    without flash attention every token of the default unified cache attends
                    over all 16 sequences' cells, which no weight type speeds;
  same decisions    round-1 decisions (liked items) equal to the bundled model's, out of K: the
                    first round's prompts are identical, so this is how often the copy decides
                    as the original does on the same input;
  rating gap        mean 0-5 rating of five sci-fi films minus five romantic comedies for a
                    sci-fi fan's profile (the check of tests/backends/test_llm_behaviour.py);
  largest rating change  the largest difference between the copy's and the bundled model's rating
                    of one of those ten items: how far the copy moves a single figure.

The machine load is printed; take figures with nothing else running.

    python benchmarks/quantized_copy.py --llm qwen2.5-0.5b
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from llm_probe_throughput import episode  # benchmarks/ is the script's folder, so on sys.path
from prompt_batch_ceiling import TEXT
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset

SCIFI = ["Star Wars (1977), (Action, Adventure, Sci-Fi)", "Alien (1979), (Horror, Sci-Fi)",
         "The Matrix (1999), (Action, Sci-Fi)", "Blade Runner (1982), (Film-Noir, Sci-Fi)",
         "Star Trek: First Contact (1996), (Action, Adventure, Sci-Fi)"]
ROMCOM = ["Sleepless in Seattle (1993), (Comedy, Romance)", "Notting Hill (1999), (Comedy, Romance)",
          "Pretty Woman (1990), (Comedy, Romance)", "While You Were Sleeping (1995), (Comedy, Romance)",
          "French Kiss (1995), (Comedy, Romance)"]
PROFILE = ("I love science fiction films: space battles, aliens, robots and the future. "
           "I find romantic comedies boring and never watch them.")


def ratings(llm) -> np.ndarray:
    """The 0-5 ratings of the five sci-fi films, then the five romantic comedies, for the sci-fi fan."""
    def prompt(item: str) -> list[dict]:
        return [{"role": "system", "content": "You are a movie recommender."},
                {"role": "user", "content": f"User profile: {PROFILE}\n\nHow much would this user enjoy the "
                                            f"movie {item}? Rate it from 0 (not at all) to 5 (very much)."}]

    return np.asarray(llm.rate([prompt(i) for i in SCIFI + ROMCOM]), dtype=float)


def prompt_rate(llm, tokens: int, repetitions: int) -> float:
    """Prompt tokens per CPU second of llama.cpp itself (one sequence, fresh cache each time)."""
    model = llm._llm  # noqa: SLF001 - the runtime's own model object; loads the weights
    ids = model.tokenize(TEXT.encode(), add_bos=False)[:tokens]
    model.reset()
    model.eval(ids[:8])  # warm-up
    cpu = time.process_time()
    for _ in range(repetitions):
        model.n_tokens = 0
        model.eval(ids)
    return len(ids) * repetitions / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b", help="a bundled model")
    parser.add_argument("--types", default="q4_0,q8_0,bf16", help="copies to compare with it")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--conversation", default="memory", choices=["memory", "append"],
                        help="probe prompts of the episode (append: with KV reuse)")
    parser.add_argument("--tokens", type=int, default=512, help="prompt length for the prompt rate")
    parser.add_argument("--repetitions", type=int, default=4)
    parser.add_argument("--runtime", default="", help="llama.cpp runtime settings for every model, "
                        "e.g. flash_attn=1,kv_streams=1 (see ctrlsim.backends.llamacpp.profile)")
    args = parser.parse_args()
    dataset = load_dataset("ml-100k")
    settings = f"@{args.runtime}" if args.runtime else ""
    specs = [f"{args.llm}{settings}"] + [f"{args.llm}@{t}{settings}" for t in args.types.split(",") if t]
    print(f"load average {os.getloadavg()[0]:.2f} before", flush=True)
    rows: list[list] = []
    first_round: dict[str, dict] = {}
    base_ratings: np.ndarray | None = None
    for spec in specs:
        llm = load_llm(spec)  # no response cache: every reply is generated
        rate = prompt_rate(llm, args.tokens, args.repetitions)
        run = episode(llm, dataset, args.agents, args.rounds, seed=0, conversation=args.conversation,
                      reuse=args.conversation == "append")
        first_round[spec] = run["first_actions"]
        same = sum(first_round[spec][a] == first_round[specs[0]].get(a) for a in first_round[spec])
        rated = ratings(llm)
        gap = float(rated[:len(SCIFI)].mean() - rated[len(SCIFI):].mean())
        base_ratings = base_ratings if base_ratings is not None else rated
        rating_change = float(np.abs(rated - base_ratings).max())
        size = f"{llm.model_path.stat().st_size / 2**20:.0f}"
        rows.append([spec, size, rate, run["seconds"], run["cpu_seconds"], run["evaluated"],
                     run["unusable"], f"{same}/{len(first_round[spec])}", gap, rating_change])
        print(f"{spec}: {rate:.0f} prompt tokens/s (CPU), episode {run['seconds']:.0f} s wall, rating gap "
              f"{gap:+.2f}; load {os.getloadavg()[0]:.2f}", flush=True)
        llm.close()
    base_rate, base_wall = rows[0][2], rows[0][3]
    table = [row[:3] + [row[2] / base_rate] + row[3:4] + [base_wall / row[3]] + row[4:] for row in rows]
    print(tabulate(table, headers=["model", "MiB", "prompt tokens/s (CPU)", "x bundled", "episode wall s",
                                   "x bundled", "episode CPU s", "evaluated tokens", "unusable",
                                   "same round-1 decisions", "rating gap",
                                   "largest rating change"], floatfmt=".2f"))
    threads = os.environ.get("CTRLSIM_THREADS", "all CPUs")
    print(f"\n{args.agents} probes x {args.rounds} rounds, {args.conversation} conversations, "
          f"runtime settings {args.runtime or 'the default profile'}, "
          f"threads {threads}; "
          f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
