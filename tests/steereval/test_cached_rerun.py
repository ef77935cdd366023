"""A fully cached SteerEval rerun: identical records, tables and figures, and no model library imported.

Both runs are `ctrlsim steereval` processes (the LLM loads in a subprocess, so the `llm` mark is set
by hand): a cold run, then a fresh run folder holding only a copy of its response cache, with the
same $CTRLSIM_CACHE (embeddings, the parsed dataset, the tables and figures the cold run made).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.llm

HEAVY = ("torch", "sentence_transformers", "transformers", "llama_cpp", "matplotlib", "scipy")
FLAGS = ["--llm", "smollm2-135m", "--users", "1", "--tags", "Horror", "--pool-size", "6",
         "--history-len", "8", "--min-ratings", "20", "--conditions", "default,embedding",
         "--table8-samples", "2"]
# The CLI as the `ctrlsim` entry point runs it; at exit, which HEAVY modules the process imported.
WRAPPER = """
import atexit, json, sys
watched = json.loads(sys.argv[1])
atexit.register(lambda: print("MODULES " + json.dumps([m for m in watched if m in sys.modules])))
from ctrlsim.experiments.cli import main
sys.exit(main(sys.argv[2:]))
"""


def steereval(out: Path, cache: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", WRAPPER, json.dumps(HEAVY), "steereval", *FLAGS,
                           "--out", str(out)], capture_output=True, text=True, check=False,
                          env={**os.environ, "CTRLSIM_CACHE": str(cache), "CTRLSIM_THREADS": "1"})
    if done.returncode != 0 and "MissingDependencyError" in done.stderr + done.stdout:
        pytest.skip(done.stderr[-500:])
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES "))
    return json.loads(line.removeprefix("MODULES "))


def outputs(out: Path) -> dict[str, bytes]:
    """The run's records, tables and figures; the tables without their last block, the measured cost
    of the units (a cached rerun costs less by design: docs/performance.md)."""
    from ctrlsim.experiments.cost import TITLE

    tables = (out / "tables.md").read_bytes()
    head, cost_title, _ = tables.partition(f"\n## {TITLE}".encode())
    assert cost_title, "tables.md ends with the cost of the units"
    files = {"records.jsonl": (out / "records.jsonl").read_bytes(), "tables.md": head}
    files.update({f"figures/{p.name}": p.read_bytes() for p in sorted((out / "figures").glob("*.png"))})
    return files


def test_a_fully_cached_rerun_is_identical_and_imports_no_model_library(tmp_path):
    cache = tmp_path / "cache"
    cold = steereval(tmp_path / "cold", cache)
    assert {"llama_cpp", "torch", "sentence_transformers"} <= set(cold)  # the cold run computed

    rerun = tmp_path / "rerun"
    rerun.mkdir()
    shutil.copy(tmp_path / "cold" / "llm-cache.sqlite", rerun / "llm-cache.sqlite")
    assert steereval(rerun, cache) == []
    expected = outputs(tmp_path / "cold")
    assert len(expected) == 4  # records, tables, the two figures
    assert outputs(rerun) == expected
