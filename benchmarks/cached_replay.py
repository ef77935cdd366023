"""Cold vs fully cached rerun of one `ctrlsim steereval` command: the caches answer, so no model loads.

Both sides run in one invocation, each as its own `ctrlsim steereval ...` process (the command
line a user types, with `--out`; imports, dataset loading and everything else a rerun pays are
included):
  cold   - a fresh run folder and a fresh ctrlsim cache folder ($CTRLSIM_CACHE; only the
           assembled bundled GGUF files are linked in from your cache, so no model is re-assembled):
           profiles and ratings computed by the LLM, embeddings by the encoder, every answer
           written to the folder's response cache and $CTRLSIM_CACHE;
  cached - a second fresh run folder holding only a copy of that response cache, with the same
           $CTRLSIM_CACHE: every record is recomputed from the caches.
The cached side runs `--repeat` times (each time in a fresh folder). Printed: wall and CPU
seconds of each side, the load average before each, the ratio cold/cached (wall, median of the
cached runs), whether records, tables and figures are byte-identical, and which model libraries
(torch, sentence_transformers, transformers, llama_cpp) and heavy helpers (matplotlib, scipy)
were in `sys.modules` when each process ended.

Defaults are the command of issue 25:

    ctrlsim steereval --llm qwen2.5-0.5b --users 1 --tags Horror,Romance --pool-size 20 \\
        --conditions default,embedding

    python benchmarks/cached_replay.py --repeat 5

Python writes bytecode (`__pycache__`) as it does by default, so the cached side, like a
user's second run, does not compile ctrlsim's sources again (`--dont-write-bytecode` keeps a
PYTHONDONTWRITEBYTECODE=1 environment as it is). `--shared-cache` uses your $CTRLSIM_CACHE as
it is instead of a fresh one (then the cold side finds whatever embeddings, parsed datasets and
outputs earlier runs left there).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

WATCHED = ("torch", "sentence_transformers", "transformers", "llama_cpp", "matplotlib", "scipy")
MODEL_LIBRARIES = ("torch", "sentence_transformers", "transformers", "llama_cpp")

# Runs the CLI exactly as the `ctrlsim` entry point does, and notes at exit which watched modules
# the process had imported (atexit runs after the command's own SystemExit).
WRAPPER = """
import atexit, json, sys
watched, report = json.loads(sys.argv[1]), sys.argv[2]
def _note():
    with open(report, "w") as fh:
        json.dump(sorted(m for m in watched if m in sys.modules), fh)
atexit.register(_note)
sys.argv = ["ctrlsim"] + sys.argv[3:]
from ctrlsim.experiments.cli import main
sys.exit(main())
"""


def command(args: argparse.Namespace, out: Path) -> list[str]:
    line = ["steereval", "--llm", args.llm, "--users", str(args.users), "--tags", args.tags,
            "--pool-size", str(args.pool_size), "--conditions", args.conditions, "--out", str(out)]
    if args.figures == "off":
        line += ["--figures", "false"]
    return line


def run_side(args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict:
    report = out.parent / f"{out.name}.modules.json"
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAPPER, json.dumps(WATCHED), str(report),
                           *command(args, out)], capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"ctrlsim steereval failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "load": load, "modules": json.loads(report.read_text())}


def records(out: Path) -> list:
    lines = (out / "records.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines if line.strip()), key=json.dumps)


def outputs(out: Path) -> dict[str, bytes]:
    files = {"tables.md": (out / "tables.md").read_bytes()}
    for png in sorted((out / "figures").glob("*.png")) if (out / "figures").is_dir() else []:
        files[f"figures/{png.name}"] = png.read_bytes()
    return files


def side_env(args: argparse.Namespace, cache: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if not args.dont_write_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if cache is not None:
        env["CTRLSIM_CACHE"] = str(cache)
    return env


def fresh_cache(root: Path) -> Path:
    """An empty ctrlsim cache folder with the assembled bundled models linked in from yours."""
    from ctrlsim.backends.bundled import cache_root

    cache = root / "ctrlsim-cache"
    cache.mkdir()
    models = cache_root() / "models"
    if models.is_dir():
        (cache / "models").symlink_to(models, target_is_directory=True)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--tags", default="Horror,Romance")
    parser.add_argument("--users", type=int, default=1)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--conditions", default="default,embedding")
    parser.add_argument("--figures", choices=["on", "off"], default="on",
                        help="the command as given (figures on), or with --figures false")
    parser.add_argument("--repeat", type=int, default=3, help="cached runs (each in a fresh folder)")
    parser.add_argument("--shared-cache", action="store_true",
                        help="use your $CTRLSIM_CACHE as it is, not a fresh one for the pair")
    parser.add_argument("--dont-write-bytecode", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE from the environment "
                             "(default: Python writes bytecode)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ctrlsim-replay-") as tmp:
        root = Path(tmp)
        env = side_env(args, None if args.shared_cache else fresh_cache(root))
        print("command: ctrlsim " + " ".join(command(args, Path("<out>"))))
        print(f"cache: {'your $CTRLSIM_CACHE' if args.shared_cache else 'fresh (bundled models linked)'}; "
              f"bytecode written: {'PYTHONDONTWRITEBYTECODE' not in env}")
        cold_out = root / "cold"
        cold = run_side(args, cold_out, env)
        cached = []
        for i in range(args.repeat):
            out = root / f"cached-{i}"
            out.mkdir()
            shutil.copy(cold_out / "llm-cache.sqlite", out / "llm-cache.sqlite")
            cached.append(run_side(args, out, env) | {"out": out})
        cold_records, cold_outputs = records(cold_out), outputs(cold_out)
        same_records = all(records(c["out"]) == cold_records for c in cached)
        same_outputs = all(outputs(c["out"]) == cold_outputs for c in cached)

    rows = [["cold", f"{cold['wall']:.2f}", f"{cold['cpu']:.2f}", f"{cold['load']:.2f}",
             ", ".join(cold["modules"]) or "none"]]
    rows += [[f"cached {i + 1}", f"{c['wall']:.2f}", f"{c['cpu']:.2f}", f"{c['load']:.2f}",
              ", ".join(c["modules"]) or "none"] for i, c in enumerate(cached)]
    print(tabulate(rows, headers=["run", "wall s", "CPU s", "load avg (1 min) before", "imported at exit"]))
    wall = statistics.median(c["wall"] for c in cached)
    cpu = statistics.median(c["cpu"] for c in cached)
    libraries = sorted({m for c in cached for m in c["modules"] if m in MODEL_LIBRARIES})
    print(f"records identical: {same_records} ({len(cold_records)} records); "
          f"tables and figures byte-identical: {same_outputs} ({len(cold_outputs)} files)")
    print(f"model libraries imported by the cached side: {', '.join(libraries) or 'none'}")
    print(f"ratio cold/cached: {cold['wall'] / wall:.1f}x wall (cached median {wall:.2f} s), "
          f"{cold['cpu'] / cpu:.1f}x CPU")


if __name__ == "__main__":
    main()
