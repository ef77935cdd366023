"""Milliseconds per generated token: free text, greedy JSON and sampled JSON, in one process.

Four conversations ask `qwen2.5-0.5b` for a persona (name, bio, interests) and generate up to
200 tokens each, decoded as parallel sequences: sampled free text, greedy with the persona
JSON schema, and sampled with it. A grammar check costs about as much for each candidate token,
so these show what the grammar adds per token (`ctrlsim/backends/llamacpp/sampling.py` checks a
short list of the highest logits first). CPU seconds are the figure; the load is printed.

    CTRLSIM_THREADS=1 python benchmarks/json_decoding.py
"""
from __future__ import annotations

import os
import time

from ctrlsim.agents.profiles import PROFILE_SCHEMA
from tabulate import tabulate

from ctrlsim.backends import load_llm

GENRES = ["film noir", "horror", "musicals", "westerns"]


def main() -> None:
    llm = load_llm("qwen2.5-0.5b")
    ask = "Invent a movie fan who loves {}. Reply as JSON with name, bio (two sentences) and interests."
    conversations = [[{"role": "user", "content": ask.format(g)}] for g in GENRES]
    llm.chat([[{"role": "user", "content": "Say OK."}]], max_tokens=2)  # load the weights outside the timing
    rows = []
    for name, kwargs in (("free text, sampled", {"temperature": 0.7}),
                         ("JSON schema, greedy", {"temperature": 0.0, "json_schema": PROFILE_SCHEMA}),
                         ("JSON schema, sampled", {"temperature": 0.7, "json_schema": PROFILE_SCHEMA})):
        llm.reset_kv()
        cpu = time.process_time()
        replies = llm.chat(conversations, max_tokens=200, seed=[1, 2, 3, 4], **kwargs)
        cpu = time.process_time() - cpu
        tokens = sum(r.completion_tokens for r in replies)
        rows.append([name, tokens, f"{cpu:.1f}", f"{1000 * cpu / tokens:.1f}"])
    print(tabulate(rows, headers=["decoding", "tokens", "CPU s", "ms per token"]))
    print(f"load average {os.getloadavg()}, CTRLSIM_THREADS={llm.n_threads}")


if __name__ == "__main__":
    main()
