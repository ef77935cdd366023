"""Chat throughput for a population step: a batch of short JSON replies, parallel vs one by one.

One batch of probe decisions (default 26, the population size), each a short
JSON action constrained by a JSON schema, measured side by side in one run:
  parallel   - `llm.chat` with llama.cpp parallel sequences (n_parallel > 1):
               shared system prefix evaluated once, every conversation its own
               sequence, one llama_batch per decode step;
  one-by-one - the same call with n_parallel=1: each conversation decoded alone
               from a fresh context (llama-cpp-python's create_completion).
Both are greedy. Prints decisions/s (wall clock and CPU time; the machine is
shared), the ratio, and how many replies are identical and schema-valid.
`--free` also times the same batch without the schema.

    python benchmarks/chat_throughput.py --model qwen2.5-0.5b --batch 26
"""
from __future__ import annotations

import argparse
import json
import time

from tabulate import tabulate

from ctrlsim.backends import load_llm

ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "maxLength": 40},
        "liked": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "stop": {"type": "boolean"},
    },
    "required": ["query", "liked", "stop"],
    "additionalProperties": False,
}
SYSTEM = ("You are a probe testing how controllable a movie recommender is. Each round you see the slate it "
          "showed you and answer with one JSON action: a search query, the ids of slate items you like, "
          "and whether to stop.")
GENRES = ["space opera", "romantic comedy", "film noir", "western", "horror", "animated musical",
          "war drama", "heist thriller", "documentary", "martial arts", "courtroom drama", "road movie",
          "biopic"]


def conversations(n: int) -> list[list[dict]]:
    out = []
    for k in range(n):
        genre = GENRES[k % len(GENRES)]
        slate = ", ".join(f"{100 + 7 * k + j}: a {GENRES[(k + j) % len(GENRES)]}" for j in range(3))
        out.append([{"role": "system", "content": SYSTEM},
                    {"role": "user",
                     "content": f"Target: more {genre} films. Round {k % 5 + 1}. Slate: {slate}."}])
    return out


def valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(value) == set(ACTION_SCHEMA["required"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--batch", type=int, default=26)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--parallel", type=int, default=16, help="sequences decoded together")
    parser.add_argument("--free", action="store_true", help="also time the batch without the JSON schema")
    args = parser.parse_args()

    llm = load_llm(args.model, n_parallel=args.parallel)
    convs = conversations(args.batch)
    llm.chat(convs[:1], max_tokens=2)  # warm-up (loads the model)

    def timed(n_parallel: int, schema):
        llm.n_parallel = n_parallel
        llm.reset_kv()
        wall, cpu = time.perf_counter(), time.process_time()
        replies = llm.chat(convs, max_tokens=args.max_tokens, json_schema=schema)
        return replies, time.perf_counter() - wall, time.process_time() - cpu

    rows, ratios = [], []
    for label, schema in [("JSON schema", ACTION_SCHEMA)] + ([("free text", None)] if args.free else []):
        par, t_par, c_par = timed(args.parallel, schema)
        seq, t_seq, c_seq = timed(1, schema)
        n = len(convs)
        same = sum(a.text == b.text for a, b in zip(par, seq))
        rows += [[f"{label}: {args.parallel} parallel sequences", n / t_par, n / c_par,
                  sum(r.completion_tokens for r in par), sum(valid(r.text) for r in par) if schema else "-"],
                 [f"{label}: one by one", n / t_seq, n / c_seq,
                  sum(r.completion_tokens for r in seq), sum(valid(r.text) for r in seq) if schema else "-"]]
        ratios.append(f"{label}: parallel/one-by-one {t_seq / t_par:.2f}x wall, {c_seq / c_par:.2f}x CPU; "
                      f"identical replies {same}/{n}")
    print(f"model={args.model} runtime={llm.identity['runtime']} threads={llm.identity.get('threads')} "
          f"gpu_layers={llm.identity.get('gpu_layers')} "
          f"batch={args.batch} max_tokens={args.max_tokens}")
    print(tabulate(rows, headers=["path", "decisions/s (wall)", "decisions/s (CPU)", "tokens", "valid JSON"],
                   floatfmt=".2f"))
    print()
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
