"""What a decode step costs per generated token at several widths, and what that leaves for drafts.

On a CPU a decode step of a few sequences reads every weight for a few tokens; a wider step
spreads that over more tokens until the matrix products are compute-bound. Two levers for the
evolution loop's decoding (about a third of its time on the 2-core machine) hang on that curve:

  wider steps     `n_parallel` above its default 16 gains what the per-token cost falls from
                  16 to 32 or 64 sequences;
  speculative     a step that verifies k drafted tokens for each of 16 sequences evaluates
  decoding        16 * (k + 1) tokens, about what a step of 16 * (k + 1) sequences costs, and
                  keeps on average 16 * (1 + accepted). It pays only where the accepted
                  drafts outrun the extra tokens: accepted > (k + 1) * c(16(k+1)) / c(16) - 1,
                  with c(w) the per-token cost at width w. The script prints that break-even.

For each model in `--llm` and each width w in `--widths` one LLM is loaded with `n_parallel = w`
and separate KV streams (as the fastest settings run; flash attention follows the spec:
`--llm qwen2.5-0.5b@flash_attn=1`), and w prompts of about `--context` tokens (a story request padded with
catalogue text, so attention covers a realistic conversation) are sent twice from an empty
cache: once for one token and once for `--tokens` sampled tokens. The difference of the two
wall (and CPU) times over the difference of generated tokens is the decode cost per token,
prompt evaluation taken out. Widths run one after another in one process, nothing else should
run beside it; the machine load is printed with each row.

    python benchmarks/decode_width.py --llm qwen2.5-0.5b --widths 16,32 --tokens 33 --context 200
"""
from __future__ import annotations

import argparse
import os
import time

from prompt_batch_ceiling import SENTENCES  # benchmarks/ is the script's folder, so on sys.path
from tabulate import tabulate

from ctrlsim.backends import load_llm

TOPICS = ("a lighthouse keeper", "a chess club", "a desert train", "a night market", "a glacier survey",
          "a village baker", "a radio station", "a lost violin", "a mountain school", "an old ferry",
          "a museum guard", "a river pilot", "a tea farm", "a clock repairer", "a subway choir",
          "a kite festival")


def conversations(count: int, context: int, tokenize) -> list[list[dict]]:
    """`count` distinct story requests of about `context` prompt tokens each."""
    per_padding = max(1, len(tokenize(SENTENCES)))
    notes = SENTENCES * max(0, (context - 40) // per_padding)
    return [[{"role": "user",
              "content": f"Notes:\n{notes}\nWrite a long, detailed story about {TOPICS[n % len(TOPICS)]} "
                         f"(draft {n}). Use many sentences."}] for n in range(count)]


def decode_cost(llm, prompts: list[list[dict]], tokens: int) -> dict:
    """Per-token decode cost: a `tokens`-token call minus a one-token call, both from an empty cache."""
    timed = []
    for max_tokens in (1, tokens):
        wall, cpu = time.perf_counter(), time.process_time()
        replies = llm.chat(prompts, max_tokens=max_tokens, temperature=0.7, seed=list(range(len(prompts))))
        timed.append((time.perf_counter() - wall, time.process_time() - cpu,
                      sum(r.completion_tokens or 0 for r in replies)))
    (wall1, cpu1, gen1), (wall2, cpu2, gen2) = timed
    decoded = max(gen2 - gen1, 1)
    return {"prompt tokens": sum(r.prompt_tokens or 0 for r in replies), "decoded tokens": decoded,
            "share of the limit": round(gen2 / (len(prompts) * tokens), 2),
            "ms/token wall": 1000 * (wall2 - wall1) / decoded, "ms/token CPU": 1000 * (cpu2 - cpu1) / decoded,
            "load": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b", help="comma-separated LLM specs")
    parser.add_argument("--widths", default="16,32,64", help="n_parallel values, comma-separated")
    parser.add_argument("--tokens", type=int, default=65, help="sampled tokens per sequence")
    parser.add_argument("--context", type=int, default=400, help="prompt tokens per sequence (about)")
    args = parser.parse_args()
    widths = sorted({int(w) for w in args.widths.split(",")})
    if widths[0] < 1 or args.tokens < 2:
        raise SystemExit("widths must be >= 1 and --tokens >= 2")
    n_ctx = max(256, args.context + args.tokens + 64)  # a stream per sequence: keep each one small

    rows = []
    for spec in args.llm.split(","):
        for width in widths:
            llm = load_llm(spec, n_parallel=width, kv_streams=True, n_ctx=n_ctx)
            prompts = conversations(width, args.context, llm.tokenize)
            llm.chat(prompts[:2], max_tokens=2, temperature=0.7, seed=[1, 2])  # load the weights, warm up
            row = {"model": spec, "width": width, **decode_cost(llm, prompts, args.tokens)}
            rows.append(row)
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
            identity = llm.identity
            llm.close()

    print(f"\nthreads={identity['threads']} flash_attn={identity.get('flash_attn', False)} "
          f"kv_streams={identity.get('kv_streams', False)} n_ctx={n_ctx}")
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".2f"))
    narrow = widths[0]
    for spec in args.llm.split(","):
        cost = {r["width"]: r["ms/token wall"] for r in rows if r["model"] == spec}
        for width in widths[1:]:
            drafts = width // narrow - 1  # a step of `width` tokens verifies this many drafts per sequence
            break_even = (drafts + 1) * cost[width] / cost[narrow] - 1
            print(f"{spec}: width {width} vs {narrow}: {cost[narrow] / cost[width]:.2f}x per token; "
                  f"{narrow} sequences verifying {drafts} draft(s) each break even at "
                  f"{break_even:.2f} accepted drafts per sequence and step")
    if len(rows) > len(widths):
        first, *others = args.llm.split(",")
        for spec in others:
            ratio = [r0["ms/token wall"] / r1["ms/token wall"] for r0, r1 in zip(
                [r for r in rows if r["model"] == first], [r for r in rows if r["model"] == spec])]
            ratios = ", ".join(f"{x:.2f}x" for x in ratio)
            print(f"{spec} vs {first}, per token at widths {widths}: {ratios}")


if __name__ == "__main__":
    main()
