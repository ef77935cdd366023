"""Prefix reuse for a population larger than the KV cache: the host stash on and off.

K probes (default 48, about 29,000 cells of conversation after three rounds, more than the
16,384-cell cache) play R append-mode rounds with KV reuse on, as in
`llm_probe_throughput.py`, twice in one process: with the host stash (`kv_host_mb`, the
default 2,048 MiB) and without it (`kv_host_mb=0`: least recently used sequences are evicted).
Prints, for each, the tokens llama.cpp evaluated per decision, wall and CPU seconds, the
stash's counters, and the two ratios. Run it on an idle machine; the load is printed.

    python benchmarks/kv_host_stash.py --agents 48 --rounds 3
"""
from __future__ import annotations

import argparse
import os

from llm_probe_throughput import episode  # this folder is on sys.path when a script here runs
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--agents", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host-mb", type=int, default=2048, help="the stash's budget in the 'on' run")
    args = parser.parse_args()
    dataset = load_dataset("ml-100k")
    llm = load_llm(args.llm, kv_reuse=True)
    llm.chat([[{"role": "user", "content": "Say OK."}]], max_tokens=2)  # load the weights outside the timing
    rows, per = [], {}
    for name, host_mb in (("stash on", args.host_mb), ("stash off", 0)):
        llm.kv_host_mb = host_mb
        r = episode(llm, dataset, args.agents, args.rounds, args.seed, conversation="append", reuse=True)
        pool = llm._parallel.pool
        stash = pool.stash
        per[name] = r
        rows.append([name, r["decisions"], f"{r['evaluated'] / r['decisions']:.0f}", f"{r['seconds']:.0f}",
                     f"{r['cpu_seconds']:.0f}", pool.evictions,
                     f"{stash.parked}/{stash.restored}/{stash.dropped}" if stash else "-",
                     r["unusable"], f"{os.getloadavg()[0]:.2f}"])
        print(f"{name}: done; load {os.getloadavg()[0]:.2f}", flush=True)
    print(tabulate(rows, headers=["variant", "decisions", "evaluated tokens/decision", "wall s", "CPU s",
                                  "evictions", "parked/restored/dropped", "unusable", "load"]))
    on, off = per["stash on"], per["stash off"]
    print(f"evaluated tokens per decision, stash off / on: "
          f"{(off['evaluated'] / off['decisions']) / (on['evaluated'] / on['decisions']):.2f}x")
    print(f"wall time, stash off / on: {off['seconds'] / on['seconds']:.2f}x "
          f"(CTRLSIM_THREADS={llm.n_threads})")


if __name__ == "__main__":
    main()
