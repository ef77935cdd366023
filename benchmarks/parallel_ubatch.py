"""Prompt evaluation in the parallel context at micro-batches of 512 tokens (the default) and 256.

One sequence evaluates its prompt fastest at 256 tokens per decode on the 2-core CPU
(`benchmarks/prompt_batch_ceiling.py`), so this checks whether the parallel context, which
evaluates the prompts of many sequences together in micro-batches of `min(n_batch, 512)` tokens
(llama.cpp's `n_ubatch`), would gain from 256. The workload is a population step's shape: 16
prompts of about 435 tokens (a system line, 24 ml-100k titles, a question), greedy, 8 generated
tokens, so nearly all the time is prompt evaluation. The two sizes alternate (`--pairs` pairs,
each on a fresh model and fresh prompts), and each pair's replies are compared. The micro-batch
is not a ctrlsim setting, so the benchmark sets it where llama.cpp contexts are built.

    python benchmarks/parallel_ubatch.py --pairs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

SIZES = (512, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()

    from llama_cpp import _internals

    from ctrlsim.backends import load_llm
    from ctrlsim.data import load_dataset

    wanted = {"n_ubatch": SIZES[0]}
    build_context = _internals.LlamaContext.__init__

    def with_ubatch(self, *, model, params, verbose=True):
        if params.n_seq_max > 1:  # the parallel context, not the sequential one
            params.n_ubatch = min(params.n_batch, wanted["n_ubatch"])
        build_context(self, model=model, params=params, verbose=verbose)

    _internals.LlamaContext.__init__ = with_ubatch  # type: ignore[method-assign]

    titles = load_dataset("ml-100k").items["text"].tolist()

    def conversations(offset: int) -> list[list[dict]]:
        out = []
        for n in range(args.prompts):
            seen = "\n".join(titles[offset + 30 * n: offset + 30 * n + 24])
            out.append([{"role": "system", "content": "You are a movie fan choosing films."},
                        {"role": "user", "content": f"Films you saw:\n{seen}\nName the one you liked most."}])
        return out

    seconds: dict[int, list[float]] = {size: [] for size in SIZES}
    print(f"model={args.model} threads={os.environ.get('CTRLSIM_THREADS', 'all')} prompts={args.prompts}")
    for pair in range(args.pairs):
        replies = {}
        for size in SIZES:
            wanted["n_ubatch"] = size
            llm = load_llm(args.model)
            start = time.perf_counter()
            done = llm.chat(conversations(7 * pair), max_tokens=8, temperature=0.0, seed=1)
            spent = time.perf_counter() - start
            llm.close()
            seconds[size].append(spent)
            replies[size] = [r.text for r in done]
            tokens = sum(r.prompt_tokens for r in done)
            print(f"pair {pair}  n_ubatch {size}: {spent:6.1f} s  {tokens} prompt tokens  "
                  f"{tokens / spent:5.1f} tok/s  load {os.getloadavg()[0]:.2f}", flush=True)
        same = sum(a == b for a, b in zip(replies[SIZES[0]], replies[SIZES[1]]))
        print(f"pair {pair}: {same}/{args.prompts} replies equal")
    first, second = (statistics.median(seconds[size]) for size in SIZES)
    print(f"median s: n_ubatch {SIZES[0]} {first:.1f}, n_ubatch {SIZES[1]} {second:.1f}; "
          f"{SIZES[0]} is {second / first:.2f}x the speed of {SIZES[1]}")


if __name__ == "__main__":
    main()
