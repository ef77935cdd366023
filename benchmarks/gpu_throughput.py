"""SteerEval scenarios per minute and LLM-probe decisions per second, for several LLM specs side by side.

Made for `benchmarks/gpu_check.sh`, which runs it on a GPU machine with the same model on the CPU
(`qwen2.5-1.5b`) and offloaded (`qwen2.5-1.5b@n_gpu_layers=-1`); it runs anywhere, on any specs.
Per spec, in this one process, one after the other:

  SteerEval   `ctrlsim steereval` on the default condition (the LLM ranks each scenario's pool by
              digit ratings after the profile edit) in a fresh run folder with a fresh cache:
              scenarios (records) per minute of wall time, model loading excluded (the model is
              loaded and warmed before the clock starts);
  decisions   an LLM-probe episode as `llm_probe_throughput.py` plays it (K template personas,
              R rounds against the popularity box, append conversations, the spec's runtime
              profile): probe decisions per second of wall time.

The last lines give each spec's figures against the first spec's (`ratio`), and the load average.

    python benchmarks/gpu_throughput.py --llms qwen2.5-0.5b,qwen2.5-0.5b@exact --users 2 --agents 8 --rounds 2
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from llm_probe_throughput import episode
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset


def steereval_rate(llm, spec: str, args, work: Path) -> tuple[int, float]:
    """(scenarios, seconds) of a fresh SteerEval run on `llm` (served under its spec)."""
    import ctrlsim

    started = time.perf_counter()
    result = ctrlsim.run("steereval", out=work / "steereval", llm=spec, encoder="minilm", users=args.users,
                         tags=tuple(args.tags.split(",")), pool_size=args.pool_size,
                         history_len=args.history_len, min_ratings=args.history_len + 20,
                         conditions=("default",), llms={spec: llm}, show_progress=False)
    if result.failed:
        first = next(iter(result.failed.values()))
        raise SystemExit(f"{spec}: {len(result.failed)} SteerEval unit(s) failed: {first}")
    return len(result.records_by_key), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llms", required=True, help="comma-separated LLM specs; the first is the baseline")
    parser.add_argument("--users", type=int, default=4, help="SteerEval users per tag")
    parser.add_argument("--tags", default="Horror,Comedy", help="SteerEval tags (each in both directions)")
    parser.add_argument("--pool-size", type=int, default=20, help="items ranked per scenario")
    parser.add_argument("--history-len", type=int, default=20,
                        help="rated items each profile is written from")
    parser.add_argument("--agents", type=int, default=16, help="probes in the decision episode")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the decision episode")
    args = parser.parse_args()
    dataset = load_dataset("ml-100k")
    load_before = os.getloadavg()[0]
    rows = []
    for spec in [s.strip() for s in args.llms.split(",") if s.strip()]:
        llm = load_llm(spec)
        llm.chat([[{"role": "user", "content": "Say OK."}]], max_tokens=2)  # weights load outside the clocks
        with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as tmp:
            os.environ["CTRLSIM_CACHE"] = str(Path(tmp) / "cache")  # a fresh cache: nothing replayed
            scenarios, seconds = steereval_rate(llm, spec, args, Path(tmp))
        played = episode(llm, dataset, args.agents, args.rounds, 0, conversation="append", reuse=llm.kv_reuse)
        rows.append([spec, scenarios, 60 * scenarios / seconds, played["decisions"],
                     played["decisions"] / played["seconds"]])
        print(f"{spec}: {scenarios} scenarios in {seconds:.0f} s; {played['decisions']} decisions in "
              f"{played['seconds']:.0f} s; load {os.getloadavg()[0]:.2f}", flush=True)
        llm.close()
    base = rows[0]
    table = [[spec, n, f"{per_min:.1f}", f"{per_min / base[2]:.2f}x", d, f"{per_s:.2f}",
              f"{per_s / base[4]:.2f}x"] for spec, n, per_min, d, per_s in rows]
    print(tabulate(table, headers=["LLM spec", "scenarios", "scenarios/min", "ratio", "decisions",
                                   "decisions/s", "ratio"]))
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; threads "
          f"{os.environ.get('CTRLSIM_THREADS', 'all')}")


if __name__ == "__main__":
    main()
