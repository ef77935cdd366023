"""Cold vs fully cached replay of a small SteerEval run: the cache answers, so no model loads.

Both sides run in one invocation, each as its own Python process (imports, dataset
loading and everything else a user's rerun pays are included):
  cold   - a fresh run folder: profiles and ratings computed by the LLM, every
           answer written to the folder's response cache;
  cached - a second fresh run folder holding only a copy of that response cache:
           every record is recomputed, every LLM call is answered from the cache,
           and the LLM handle never loads its weights.
Prints both wall times, the ratio, whether the records are identical, and
whether the cached side loaded the model. By default the pair runs twice: as a
user runs it (tables and figures), and with `--figures false` (records and
tables only), since drawing the figures is most of what the cached side costs.

    python benchmarks/cached_replay.py --llm qwen2.5-0.5b --users 2 --pool-size 10
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

RUN = """
import json, sys, time
started = time.perf_counter()
from ctrlsim.backends import load_llm
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.steereval_tables import SteerEvalConfig, run_steereval
config = SteerEvalConfig(**json.loads(sys.argv[1]))
out = sys.argv[2]
llm = load_llm(config.llm, cache=out + "/llm-cache.sqlite")
run_steereval(config, RunOptions(out=out, figures=sys.argv[3] == "on"), llm=llm, show_progress=False)
print(json.dumps({"seconds": time.perf_counter() - started, "loaded": llm.loaded}))
"""


def run(config: dict, out: Path, figures: str) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps(config), str(out), figures],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"steereval run failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - started
    return result


def records(out: Path) -> list:
    lines = (out / "records.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines if line.strip()), key=json.dumps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--tag", default="Horror")
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--figures", choices=["both", "on", "off"], default="both",
                        help="time the run with figures, without them (--figures false), or both")
    args = parser.parse_args()
    config = {"llm": args.llm, "tags": [args.tag], "users": args.users, "pool_size": args.pool_size,
              "conditions": ["default"], "table8_samples": 2}

    print(f"llm={args.llm} tag={args.tag} users={args.users} pool={args.pool_size} condition=default")
    for figures in (["on", "off"] if args.figures == "both" else [args.figures]):
        with tempfile.TemporaryDirectory(prefix="ctrlsim-replay-") as tmp:
            cold_out, cached_out = Path(tmp) / "cold", Path(tmp) / "cached"
            cold = run(config, cold_out, figures)
            cached_out.mkdir()
            shutil.copy(cold_out / "llm-cache.sqlite", cached_out / "llm-cache.sqlite")
            cached = run(config, cached_out, figures)
            cold_records, cached_records = records(cold_out), records(cached_out)

        print(f"\nfigures {figures}: {len(cold_records)} episodes")
        rows = [["cold (fresh cache)", cold["process_seconds"], cold["seconds"], cold["loaded"]],
                ["cached (copy of the cold run's cache)", cached["process_seconds"], cached["seconds"],
                 cached["loaded"]]]
        print(tabulate(rows,
                       headers=["run", "process seconds", "seconds after start", "model loaded"],
                       floatfmt=".2f"))
        whole = cold["process_seconds"] / cached["process_seconds"]
        print(f"ratio cold/cached: {whole:.1f}x (whole process), "
              f"{cold['seconds'] / cached['seconds']:.1f}x (after interpreter start)")
        print(f"records identical: {cold_records == cached_records} ({len(cold_records)} records)")


if __name__ == "__main__":
    main()
