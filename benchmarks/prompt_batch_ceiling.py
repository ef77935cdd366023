"""How much can batching prompt tokens gain on this machine? The ceiling for parallel rating.

Rating many items after one profile evaluates the same tokens whichever way it is
done: the profile once, then every item's suffix (about 30 tokens). Parallel
sequences only change how many of those tokens go through the model per
`llama_decode` call: one item's suffix at a time (sequential shared prefix) or
the suffixes of many items together (parallel sequences). So the most that
path can gain is the ratio of prompt-evaluation throughput at a large batch to
that at a batch of one suffix.

This script measures that throughput (tokens/s of CPU time, one sequence, fresh
KV cache per repetition) at several batch sizes, side by side in one run, and
prints each as a ratio to the batch of `--suffix` tokens. On a CPU the curve is
flat beyond a few dozen tokens (evaluation is compute-bound). A GPU is far from
busy at a few dozen tokens, which is where parallel sequences pay off (on an
H200, parallel rating was 2.9-3.3x the sequential path; docs/performance.md).

    python benchmarks/prompt_batch_ceiling.py --model qwen2.5-0.5b
"""
from __future__ import annotations

import argparse
import time

from tabulate import tabulate

from ctrlsim.backends import load_llm

SENTENCES = ("The archive holds letters, maps and diaries from the expedition, catalogued by year and place. "
             "Each box lists its contents on a card, and the cards are filed by the name of the writer. ")
TEXT = SENTENCES * 40


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--suffix", type=int, default=30, help="tokens of one item's suffix (the baseline)")
    parser.add_argument("--sizes", default="1,8,30,64,128,256,512", help="batch sizes to time")
    parser.add_argument("--tokens", type=int, default=512, help="tokens evaluated per batch size")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")} | {args.suffix})

    llm = load_llm(args.model)
    # The runtime's own model object: this measures llama.cpp itself, not ctrlsim's code paths.
    model = llm._llm  # noqa: SLF001 - loads the weights
    tokens = model.tokenize(TEXT.encode(), add_bos=False)
    if len(tokens) < max(sizes):
        raise SystemExit(f"the sample text has {len(tokens)} tokens; ask for batch sizes up to that")
    model.reset()
    model.eval(tokens[:8])  # warm-up

    rates = {}
    for size in sizes:
        repetitions = max(1, args.tokens // size)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(repetitions):
            model.n_tokens = 0  # a fresh sequence: every token of the batch is evaluated
            model.eval(tokens[:size])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        rates[size] = (size * repetitions / cpu, size * repetitions / wall)
        print(f"batch {size}: {rates[size][0]:.1f} tokens/s (CPU)", flush=True)

    base = rates[args.suffix][0]
    print(f"\nmodel={args.model} threads={llm.identity.get('threads')} "
          f"gpu_layers={llm.identity.get('gpu_layers')}")
    print(tabulate([[size, cpu, wall, cpu / base] for size, (cpu, wall) in rates.items()],
                   headers=["tokens per decode", "tokens/s (CPU)", "tokens/s (wall)",
                            f"ratio to a {args.suffix}-token batch"], floatfmt=".2f"))
    best = max(rates, key=lambda s: rates[s][0])
    print(f"\nceiling for batching {args.suffix}-token item suffixes together: {rates[best][0] / base:.2f}x "
          f"(at {best} tokens per decode)")


if __name__ == "__main__":
    main()
