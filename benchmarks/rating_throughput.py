"""Rating throughput: shared-prefix digit rating vs. generate-and-parse per item.

Measured side by side in one run on the same prompts (SteerEval-style: one
profile, many candidate items):
  A. `llm.rate` (llama.cpp): prompts sorted so the profile prefix is evaluated
     once, then only each item's suffix; one scored position per item;
  B. `llm.rate` with the KV cache cleared before every item (digit rating
     without prefix reuse), to separate the two effects;
  C. `llm.rate_by_generation`: the SteerEval release's method, a generated
     reply per item, first number parsed.
Prints items/s for each and the ratios A/C and A/B.

    python benchmarks/rating_throughput.py --model qwen2.5-0.5b --items 40
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=16, help="reply length for generate-and-parse")
    args = parser.parse_args()

    ds = load_dataset("ml-100k")
    items = ds.items.sort_values("popularity", ascending=False)["text"].head(args.items).tolist()
    convs = [prompt(t) for t in items]
    llm = load_llm(args.model)
    llm.rate(convs[:2])  # warm-up

    rows = []
    llm._llm.reset()
    t0 = time.perf_counter()
    shared = llm.rate(convs)
    t_shared = time.perf_counter() - t0

    t0 = time.perf_counter()
    separate = []
    for conv in convs:
        llm._llm.reset()
        separate.append(llm.rate([conv])[0])
    t_separate = time.perf_counter() - t0

    t0 = time.perf_counter()
    generated, texts = llm.rate_by_generation(convs, rng=np.random.default_rng(0), max_tokens=args.max_tokens)
    t_generate = time.perf_counter() - t0

    n = len(convs)
    rows = [
        ["A: digit rating, shared prefix evaluated once", n / t_shared, t_shared],
        ["B: digit rating, KV cache cleared per item", n / t_separate, t_separate],
        ["C: generate-and-parse per item (SteerEval)", n / t_generate, t_generate],
    ]
    print(f"model={args.model} runtime={llm.identity['runtime']} threads={llm.identity.get('threads')} items={n}")
    print(tabulate(rows, headers=["method", "items/s", "seconds"], floatfmt=".2f"))
    print(f"\nratio A/C (shared-prefix digit rating vs generate-and-parse): {t_generate / t_shared:.1f}x")
    print(f"ratio A/B (prefix reuse alone): {t_separate / t_shared:.1f}x")
    print(f"max |A-B| rating difference: {np.max(np.abs(shared - np.array(separate))):.4f}")
    unparsed = sum(1 for t in texts if not any(c.isdigit() for c in t))
    print(f"distinct generate-and-parse scores: {len(set(np.round(generated, 3)))} of {n}; unparsable replies: {unparsed}")
    print(f"distinct digit-rating scores: {len(set(np.round(shared, 3)))} of {n}")


if __name__ == "__main__":
    main()
