"""Rating throughput: shared-prefix digit rating vs. generate-and-parse per item.

Measured side by side in one run on the same prompts (SteerEval-style: one
profile, many candidate items):
  P. `llm.rate` with parallel sequences (llama.cpp, n_parallel > 1): the profile
     prefix evaluated once, every item's suffix a sequence of one llama_batch;
  A. `llm.rate` sequentially (n_parallel=1): prompts sorted so the profile
     prefix is evaluated once, then each item's suffix one after another;
  B. `llm.rate` with the KV cache cleared before every item (digit rating
     without prefix reuse), to separate the two effects;
  C. `llm.rate_by_generation`: the SteerEval release's method, a generated
     reply per item, first number parsed.
Prints items/s (wall clock and CPU time: the machine is shared, and CPU time is
less sensitive to other load), the ratios P/A, A/C and A/B, and the largest
rating difference between P and A.

    python benchmarks/rating_throughput.py --model qwen2.5-0.5b --items 40 --parallel 16
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset

PROFILE = (
    "This user is drawn to tense, atmospheric thrillers and science fiction with big ideas. They rate "
    "highly films such as Alien, Blade Runner, The Terminator and Se7en, enjoy clever plots, strong "
    "directors and dark visual style, and tend to dislike broad romantic comedies and family musicals. "
    "They watch older classics as well as recent releases and value originality over spectacle."
)


def prompt(item_text: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are a movie recommender."},
        {"role": "user", "content": f"User profile: {PROFILE}\n\nHow much would this user enjoy the movie "
                                    f"{item_text}? Rate it from 0 (not at all) to 5 (very much)."},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=16, help="reply length for generate-and-parse")
    parser.add_argument("--parallel", type=int, default=16, help="sequences decoded together in path P")
    args = parser.parse_args()

    ds = load_dataset("ml-100k")
    items = ds.items.sort_values("popularity", ascending=False)["text"].head(args.items).tolist()
    convs = [prompt(t) for t in items]
    llm = load_llm(args.model, n_parallel=args.parallel)
    llm.rate(convs[:2])  # warm-up (loads the model)

    def timed(fn):
        llm.reset_kv()
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        return result, time.perf_counter() - wall, time.process_time() - cpu

    llm.n_parallel = args.parallel
    parallel, t_par, c_par = timed(lambda: llm.rate(convs))
    llm.n_parallel = 1
    shared, t_shared, c_shared = timed(lambda: llm.rate(convs))

    def one_by_one():
        out = []
        for conv in convs:
            llm.reset_kv()
            out.append(llm.rate([conv])[0])
        return np.array(out)

    separate, t_separate, c_separate = timed(one_by_one)
    (generated, texts), t_generate, c_generate = timed(
        lambda: llm.rate_by_generation(convs, rng=np.random.default_rng(0), max_tokens=args.max_tokens))

    n = len(convs)
    rows = [
        [f"P: digit rating, {args.parallel} parallel sequences", n / t_par, n / c_par, t_par],
        ["A: digit rating, shared prefix, one item after another", n / t_shared, n / c_shared, t_shared],
        ["B: digit rating, KV cache cleared per item", n / t_separate, n / c_separate, t_separate],
        ["C: generate-and-parse per item (SteerEval)", n / t_generate, n / c_generate, t_generate],
    ]
    print(f"model={args.model} runtime={llm.identity['runtime']} threads={llm.identity.get('threads')} "
          f"gpu_layers={llm.identity.get('gpu_layers')} "
          f"items={n}")
    print(tabulate(rows, headers=["method", "items/s (wall)", "items/s (CPU)", "seconds"], floatfmt=".2f"))
    print(f"\nratio P/A (parallel sequences vs sequential shared prefix): {t_shared / t_par:.2f}x wall, "
          f"{c_shared / c_par:.2f}x CPU")
    print(f"ratio A/C (shared-prefix digit rating vs generate-and-parse): {t_generate / t_shared:.1f}x")
    print(f"ratio A/B (prefix reuse alone): {t_separate / t_shared:.1f}x")
    print(f"max |P-A| rating difference: {np.max(np.abs(parallel - shared)):.4f}")
    print(f"max |A-B| rating difference: {np.max(np.abs(shared - separate)):.4f}")
    unparsed = sum(1 for t in texts if not any(c.isdigit() for c in t))
    print(f"distinct generate-and-parse scores: {len(set(np.round(generated, 3)))} of {n}; "
          f"unparsable replies: {unparsed}")
    print(f"distinct digit-rating scores: {len(set(np.round(shared, 3)))} of {n}")


if __name__ == "__main__":
    main()
