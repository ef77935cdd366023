"""Records before and after a change: seven runners on fixed tiny configs, compared record by record.

Proves that, for a fixed small config of each runner (`probe`, `ctrlbench`, `evolve`, `steereval`,
`promptshift`, `calibrate`, `train-probe`; the audit is these runners' sub-runs), the run
folder's `records.jsonl` written by one version of the code equals the one written by another,
apart from timing fields. Each runner runs as a user runs it,
`python -m ctrlsim.experiments.cli <runner> --out <fresh folder> <flags>`, in its own process, on
the smallest bundled LLM (`smollm2-135m`) and the bundled `minilm` encoder, with
`CTRLSIM_THREADS=1` (and one thread for OpenMP/MKL/torch) and a fresh, private `$CTRLSIM_CACHE` per
runner and side: cached LLM replies, personas or item embeddings of one side can never answer for
the other (before the unit context, ctrlbench cached replies and personas in
`$CTRLSIM_CACHE/ctrlbench` and promptshift ran uncached; since, every runner caches them in its run
folder, which is fresh too). The configs are flags written
here, not the runners' `--preset smoke`: a ref commit from before the presets existed (or with other
preset values) must run the very same config as the working tree.

Sides:
  ref      the runners at a git commit (`--ref`, default HEAD), checked out with `git worktree` into
           a temporary folder and imported from there (PYTHONPATH and the working directory point
           at the worktree; `ctrlsim.envs` and `ctrlsim.agents`, which pyproject maps from the top
           folders `envs/` and `agents/`, are symlinked into its `ctrlsim/`);
  current  the working tree as installed (the editable install of the repository), including any
           edits in progress at that moment (the saved side lists HEAD and the changed files).
Run the script with the project's venv Python: it runs the runners with `sys.executable`, so both
sides share the installed dependencies and bundled models. Every runner process records which
`ctrlsim*` modules it imported, from where (a `sitecustomize` on PYTHONPATH dumps `sys.modules` at
exit); a module loaded from outside the side's tree is an error, so a ref side cannot silently run
the current code or the other way round.

    python benchmarks/records_identity.py                       # HEAD vs the working tree
    python benchmarks/records_identity.py --ref HEAD --save /tmp/records_before.json
    python benchmarks/records_identity.py --against /tmp/records_before.json
    python benchmarks/records_identity.py --ref HEAD --against /tmp/records_before.json  # determinism
    python benchmarks/records_identity.py --diff A.json B.json  # two saved sides, nothing runs
    python benchmarks/records_identity.py --against /tmp/records_before.json --llm-profile exact

The last form proves that a runtime profile reproduces an older default: the working tree's runners
get `smollm2-135m@exact` where the saved side (made before `fast` became the default) got
`smollm2-135m`. Only that spec string is set aside: it is written as the plain model name wherever
it occurs (flags, config fields, unit keys); every record's LLM identity, which names every runtime
setting that differs from `exact`, is compared as written.

`--save FILE` writes the normalised records of the side that ran (the ref side with `--ref`, else the
working tree); `--against FILE` compares that side with a saved one; with neither, both sides run
and are compared. Exit status: 0 when every record is identical, 1 on any difference (a differing,
missing or extra record, a differing header, a runner that failed or ran the wrong code), 2 on a
usage error.

What is compared: each runner's `records.jsonl`, its header line (`{"config": ...}`: the config that
identifies the run) and every `{"key", "record"}` line (the first record per key, as the store reads
it), with the keys in `TIMING_KEYS` (wall and CPU time: `seconds`, `cpu_seconds`, `timing`, ...)
removed at every depth. Values must match exactly, including JSON type (1 vs 1.0 differs) and list
order; dict key order does not matter; NaN equals NaN. The set of keys is compared too. Identities
in the records hold the installed model paths (`llm.path`, the encoder's `model`): equal between
sides in one venv, different against a file saved from another install. Runner processes get
PYTHONHASHSEED=0 (`--hash-seed random` leaves it unset; at 8c33ab3 the records were identical
either way, under different machine load).
What is not compared: `config.json` (holds software versions), `tables.md` and figures (both are
rendered from the records; tables also show wall time), and the other artefacts (rosters,
evolve's `roster_g*.json`, transcripts, `phases.json`, promptshift's `summary.json` with the
metrics computed from its records, response caches).

One side takes about 4-5 minutes on the shared 2-core development machine (probe ~20-30 s,
ctrlbench ~75-105 s, evolve ~65-100 s, steereval ~20-40 s, promptshift ~25-35 s).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORMAT = "ctrlsim-records-identity/1"
LLM = "smollm2-135m"
ENCODER = "minilm"

# Fields that hold wall-clock or CPU time, dropped at every depth of a record (found in real records:
# probe's `seconds`, ctrlbench's `timing: {seconds}`, evolve's phase `seconds`/`cpu_seconds` and the
# evaluation's `seconds`/`cpu_seconds`); the others guard against timing fields a restructure adds.
TIMING_KEYS = frozenset({
    "seconds", "cpu_seconds", "wall_seconds", "process_seconds", "timing", "timings", "started",
    "finished", "elapsed", "elapsed_seconds", "duration_seconds", "wall_time", "cpu_time", "timestamp",
})


@dataclass(frozen=True)
class Runner:
    name: str
    flags: tuple[str, ...]
    note: str


# Tiny configs that still take the real path of each runner (LLM probes, the embedding black box
# and its encoder, the evolution loop's every phase, LLM-written edits, list generation).
RUNNERS: dict[str, Runner] = {r.name: r for r in (
    Runner("probe", ("--recommender", "embedding", "--target", "Film-Noir", "--agents", "8", "--rounds", "8",
                     "--checkpoints", "4,8", "--ceiling-states", "200", "--seed", "0"),
           "random probes vs the embedding box (minilm), episode + beam-search ceiling"),
    Runner("ctrlbench", ("--methods", "base-small,random", "--recommenders", "embedding",
                         "--targets", "War,Film-Noir", "--seeds", "0,1", "--agents", "2,2", "--rounds", "2",
                         "--llm", LLM),
           "LLM personas + LLM probes and random probes, 1 box x 2 targets x 2 seeds (8 episodes)"),
    Runner("evolve", ("--agents", "2", "--merges", "1", "--rounds-per-merge", "1", "--eval-rounds", "2",
                      "--llm", LLM, "--encoder", ENCODER, "--recommender", "embedding",
                      "--debate-max-tokens", "24", "--merge-max-tokens", "96"),
           "2 probes, 1 cluster-debate-merge, 2 evaluation rounds (seeded sampling at 0.7)"),
    Runner("steereval", ("--llm", LLM, "--encoder", ENCODER, "--users", "1", "--tags", "Horror",
                         "--pool-size", "6", "--history-len", "8", "--min-ratings", "20",
                         "--conditions", "default,embedding,llm-append", "--table8-samples", "2"),
           "1 user x Horror x 2 directions x 3 conditions (LLM scoring, embedding ranker, LLM append)"),
    Runner("promptshift", ("--llms", LLM, "--users", "2", "--scenarios", "gender", "--n-candidates", "5",
                           "--k", "4", "--history-len", "5", "--min-fit-positives", "5"),
           "2 users x (L0, P1-P3, one gender cue) generated lists"),
    Runner("calibrate", ("--protocol", "ctrlbench", "--methods", "oracle,random", "--dials", "0,1",
                         "--seeds", "0,1", "--targets", "War", "--agents", "2,2", "--rounds", "2",
                         "--llm", LLM),
           "oracle and random probes on dial boxes 0 and 1, 2 seeds (8 units, no LLM call)"),
    Runner("train-probe", ("--recommender", "popularity", "--target", "War", "--timesteps", "256",
                           "--n-steps", "64", "--budget", "4", "--seed", "0"),
           "a learned probe, 256 PPO timesteps against the popularity box (one unit, trained in the driver)"),
)}

SITECUSTOMIZE = '''\
"""records_identity.py: record which ctrlsim modules this process imported, and from where."""
import atexit as _atexit
import os as _os
import sys as _sys

_OUT = _os.environ.get("RECORDS_IDENTITY_MODULES")
if _OUT:
    def _dump():
        import json
        modules = {name: getattr(module, "__file__", None) for name, module in list(_sys.modules.items())
                   if name == "ctrlsim" or name.startswith("ctrlsim.")}
        main = _sys.modules.get("__main__")  # the runner's CLI module, run with -m
        modules["__main__"] = getattr(main, "__file__", None)
        with open(_OUT, "w") as fh:
            json.dump(modules, fh, indent=1, sort_keys=True)
    _atexit.register(_dump)

# Chain to the sitecustomize this file shadows, if there is one.
_HERE = _os.path.dirname(_os.path.abspath(__file__))
import importlib.machinery as _machinery  # noqa: E402
import importlib.util as _util  # noqa: E402

_spec = _machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _HERE])
if _spec is not None and _spec.loader is not None:
    _module = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
'''

CHECK_IMPORTS = """
import json, ctrlsim, ctrlsim.experiments.cli, ctrlsim.envs, ctrlsim.agents
print(json.dumps({"ctrlsim": ctrlsim.__file__, "ctrlsim.experiments.cli": ctrlsim.experiments.cli.__file__,
                  "ctrlsim.envs": ctrlsim.envs.__file__, "ctrlsim.agents": ctrlsim.agents.__file__}))
"""


def log(message: str) -> None:
    print(message, flush=True)


# ----------------------------------------------------------------------------------------- git

def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def tree_state() -> dict:
    """The working tree: its HEAD and what differs from it (the current side runs HEAD plus these)."""
    status = git("status", "--porcelain", "--untracked-files=all")
    changed = [line for line in status.splitlines()
               if line[3:].startswith(("ctrlsim/", "envs/", "agents/", "pyproject.toml"))]
    return {"head": git("rev-parse", "HEAD"), "changed_package_files": changed}


# --------------------------------------------------------------------------------------- sides

@dataclass
class Side:
    label: str            # "ref" or "current"
    root: Path            # the tree whose ctrlsim must run
    cwd: Path             # working directory of the runner processes
    pythonpath: list[str]  # in front of the probe folder
    meta: dict


def make_ref_side(ref: str, work: Path) -> Side:
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = work / f"worktree-{commit[:12]}"
    if tree.exists():  # left by an earlier --keep run in the same --work-dir
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True,
                       check=False)
        shutil.rmtree(tree, ignore_errors=True)
        git("worktree", "prune")
    log(f"[ref] git worktree add {tree} {commit[:12]} ({ref})")
    git("worktree", "add", "--detach", "--force", str(tree), commit)
    for name in ("envs", "agents"):  # pyproject's package-dir maps them into the ctrlsim namespace
        link, target = tree / "ctrlsim" / name, tree / name
        if target.is_dir() and not link.exists():
            link.symlink_to(Path("..") / name)
    meta = {"side": "ref", "ref": ref, "commit": commit, "subject": git("log", "-1", "--format=%s", commit)}
    return Side("ref", tree, tree, [str(tree)], meta)


def make_current_side(work: Path) -> Side:
    cwd = work / "current-cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    return Side("current", REPO, cwd, [], {"side": "current", "tree": str(REPO), **tree_state()})


def remove_worktree(side: Side) -> None:
    try:
        git("worktree", "remove", "--force", str(side.root))
    except subprocess.CalledProcessError as exc:
        log(f"[ref] could not remove the worktree {side.root}: {exc.stderr.strip()}")
    git("worktree", "prune")


HASH_SEED = {"value": "0"}  # PYTHONHASHSEED of the runner processes ("random": left unset); see --hash-seed
# The LLM spec the runners get (`LLM` plus `--llm-profile`'s suffix, e.g. smollm2-135m@exact).
LLM_SPEC = {"value": LLM}


def side_env(side: Side, probe_dir: Path, cache: Path | None, modules_file: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLSIM_") and k not in ("PYTHONPATH", "PYTHONHASHSEED")}
    env.update({
        "PYTHONPATH": os.pathsep.join([*side.pythonpath, str(probe_dir)]),
        "CTRLSIM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1",
    })
    if HASH_SEED["value"] != "random":
        env["PYTHONHASHSEED"] = HASH_SEED["value"]
    if cache is not None:
        env["CTRLSIM_CACHE"] = str(cache)
    if modules_file is not None:
        env["RECORDS_IDENTITY_MODULES"] = str(modules_file)
    return env


def foreign_modules(modules: dict, root: Path) -> dict:
    """ctrlsim modules loaded from outside `root` (namespace packages have no file and are skipped)."""
    root = root.resolve()
    bad = {}
    for name, file in modules.items():
        if file is None:
            continue
        path = Path(file)
        if not (path.is_relative_to(root) or path.resolve().is_relative_to(root)):
            bad[name] = file
    return bad


def check_imports(side: Side, probe_dir: Path) -> dict:
    """Print and check where `ctrlsim` and its runner CLI are imported from on this side."""
    env = side_env(side, probe_dir, None, None)
    proc = subprocess.run([sys.executable, "-c", CHECK_IMPORTS], cwd=side.cwd, env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"[{side.label}] cannot import ctrlsim:\n{proc.stderr[-3000:]}")
    files = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, file in files.items():
        log(f"[{side.label}] {name}.__file__ = {file}")
    bad = foreign_modules(files, side.root)
    if bad:
        raise SystemExit(f"[{side.label}] imports come from outside {side.root}: {bad}")
    return files


# ------------------------------------------------------------------------------------- running

def _last_line(path: Path) -> str:
    """The last progress line of a log (tqdm rewrites its line with carriage returns)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4000))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    parts = [p.strip() for p in tail.replace("\r", "\n").split("\n") if p.strip()]
    return parts[-1][:140] if parts else ""


def run_runner(side: Side, runner: Runner, work: Path, probe_dir: Path, *, timeout: float,
               heartbeat: float) -> dict:
    """Run one runner on one side in a fresh folder and cache; returns its raw records and facts."""
    base = work / side.label / runner.name
    if base.exists():
        shutil.rmtree(base)
    out, cache = base / "run", base / "cache"
    cache.mkdir(parents=True)
    modules_file, log_file = base / "modules.json", base / "runner.log"
    flags = [LLM_SPEC["value"] if flag == LLM else flag for flag in runner.flags]
    command = [sys.executable, "-m", "ctrlsim.experiments.cli", runner.name, "--out", str(out), *flags]
    env = side_env(side, probe_dir, cache, modules_file)
    log(f"[{side.label}] {runner.name}: running (log {log_file})")
    started = time.perf_counter()
    with open(log_file, "wb") as fh:
        fh.write(("$ " + " ".join(command) + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(command, cwd=side.cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        last_beat = started
        try:
            while True:
                try:
                    code = proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    now = time.perf_counter()
                    if now - started > timeout:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        code = None
                        break
                    if now - last_beat >= heartbeat:
                        last_beat = now
                        log(f"[{side.label}] {runner.name}: {now - started:5.0f} s  {_last_line(log_file)}")
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    seconds = time.perf_counter() - started
    result: dict = {"flags": [plain_spec(f, LLM_SPEC["value"]) for f in flags], "seconds": round(seconds, 1),
                    "error": None, "llm_spec": LLM_SPEC["value"]}
    if code != 0:
        tail = log_file.read_text(errors="replace")[-2500:]
        why = f"timed out after {timeout:.0f} s" if code is None else f"exited with {code}"
        result["error"] = f"{why}; log tail:\n{tail}"
        log(f"[{side.label}] {runner.name}: FAILED ({why}) after {seconds:.0f} s\n"
            + textwrap.indent(tail, "    "))
    records_file = out / "records.jsonl"
    if records_file.exists():
        header, records = read_records(records_file)
        dropped: set[str] = set()
        result["header"] = normalise(header, dropped, "header", spec=LLM_SPEC["value"])
        result["records"] = {plain_spec(k, LLM_SPEC["value"]): normalise(v, dropped, spec=LLM_SPEC["value"])
                             for k, v in records.items()}
        result["dropped"] = sorted(dropped)
    else:
        result["header"], result["records"] = None, {}
        result["error"] = result["error"] or "no records.jsonl written"
    try:
        modules = json.loads(modules_file.read_text())
    except (OSError, json.JSONDecodeError):
        modules = {}
        result["error"] = result["error"] or "the runner process did not report its imported modules"
    bad = foreign_modules(modules, side.root)
    if bad:
        result["error"] = f"ran code from outside {side.root}: {dict(list(bad.items())[:5])}"
    result["modules"] = len(modules)
    result["cli_file"] = modules.get("__main__")
    if result["error"] is None:
        log(f"[{side.label}] {runner.name}: done in {seconds:.1f} s, {len(result['records'])} records, "
            f"{len(modules)} ctrlsim modules from {side.root} (cli: {result['cli_file']}); timing fields "
            f"dropped: {', '.join(result.get('dropped', [])) or 'none'}")
    return result


def run_side(side: Side, runners: list[Runner], work: Path, probe_dir: Path, *, timeout: float,
             heartbeat: float) -> dict:
    files = check_imports(side, probe_dir)
    started = time.perf_counter()
    results = {}
    for n, runner in enumerate(runners, 1):
        log(f"[{side.label}] ({n}/{len(runners)}) {runner.name} {' '.join(runner.flags)}")
        results[runner.name] = run_runner(side, runner, work, probe_dir, timeout=timeout, heartbeat=heartbeat)
    meta = {**side.meta, "imports": files, "python": platform.python_version(), "host": platform.node(),
            "pythonhashseed": HASH_SEED["value"], "llm_spec": LLM_SPEC["value"],
            "when": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.perf_counter() - started, 1)}
    log(f"[{side.label}] all runners done in {meta['seconds']:.0f} s")
    return {"format": FORMAT, "meta": meta, "timing_keys": sorted(TIMING_KEYS), "runners": results}


# ------------------------------------------------------------------------------- normalisation

def read_records(path: Path) -> tuple[dict, dict[str, dict]]:
    """(header config, key -> first record), skipping torn lines and repair markers as the store does."""
    lines = path.read_text(encoding="utf-8").split("\n")
    header = json.loads(lines[0])
    records: dict[str, dict] = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "key" in row and "record" in row:
            records.setdefault(str(row["key"]), row["record"])
    return header, records


def plain_spec(text, spec: str):
    """`text` with the LLM spec the runners were given written as the plain model name (`LLM`)."""
    return text.replace(spec, LLM) if isinstance(text, str) and spec != LLM else text


def normalise(value, dropped: set | None = None, path: str = "", *, spec: str = LLM):
    """`value` without the timing fields, at every depth (their paths go to `dropped`), and with the
    LLM spec the runners were given (`spec`, e.g. `smollm2-135m@exact` under `--llm-profile exact`)
    written as the plain model name wherever it occurs (config fields, unit keys such as
    PromptShift's `<llm>/<user>`), so that only the spec string the user typed is set aside; the
    LLM identity in every record (model, file, every runtime setting that differs from `exact`) is
    compared as written."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            here = f"{path}.{k}" if path else k
            if k in TIMING_KEYS:
                if dropped is not None:
                    dropped.add(here)
            else:
                out[plain_spec(k, spec)] = normalise(v, dropped, here, spec=spec)
        return out
    if isinstance(value, list):
        return [normalise(v, dropped, f"{path}[]", spec=spec) for v in value]
    return plain_spec(value, spec)


# --------------------------------------------------------------------------------- comparison

def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return type(value).__name__


_ABSENT = object()


def differences(a, b, path: str = "", limit: int = 5, found: list | None = None) -> list:
    """Up to `limit` (JSON path, before, after) where `a` and `b` differ (empty: identical)."""
    found = [] if found is None else found
    if len(found) >= limit:
        return found
    if a is _ABSENT or b is _ABSENT or _kind(a) != _kind(b):
        found.append((path or "$", a, b))
    elif isinstance(a, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            differences(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{path}.{key}" if path else key,
                        limit, found)
    elif isinstance(a, list):
        for i in range(max(len(a), len(b))):
            differences(a[i] if i < len(a) else _ABSENT, b[i] if i < len(b) else _ABSENT, f"{path}[{i}]",
                        limit, found)
    elif isinstance(a, float) and math.isnan(a) and math.isnan(b):
        pass
    elif a != b:
        found.append((path or "$", a, b))
    return found


def _show(value) -> str:
    if value is _ABSENT:
        return "<absent>"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 160 else text[:157] + "..."


def compare(before: dict, after: dict, *, show_records: int, show_paths: int) -> bool:
    """Print the table and the first differences; True when everything is identical."""
    from tabulate import tabulate

    rows, details, ok = [], [], True
    names = [n for n in RUNNERS if n in before["runners"] or n in after["runners"]]
    names += [n for n in [*before["runners"], *after["runners"]] if n not in names]
    for name in names:
        b, a = before["runners"].get(name), after["runners"].get(name)
        if b is None or a is None:
            ok = False
            missing_side = "before" if b is None else "after"
            rows.append([name, "-", "-", "-", "-", "-", f"not run on the {missing_side} side"])
            continue
        notes = []
        if b["flags"] != a["flags"]:
            notes.append("different flags")
            details.append(f"{name}: flags differ\n  before: {' '.join(b['flags'])}\n"
                           f"  after:  {' '.join(a['flags'])}")
        for label, side in (("before", b), ("after", a)):
            if side.get("error"):
                notes.append(f"{label} side failed")
                details.append(f"{name}: the {label} side failed: {side['error'].splitlines()[0]}")
        header = differences(b["header"], a["header"], "header", show_paths)
        if header:
            notes.append("header differs")
            details.append(f"{name}: records.jsonl header differs\n" + "\n".join(
                f"  {p}\n    before: {_show(x)}\n    after:  {_show(y)}" for p, x, y in header))
        same = differing = 0
        shown = 0
        for key, record in b["records"].items():
            if key not in a["records"]:
                continue
            found = differences(record, a["records"][key], "", show_paths)
            if not found:
                same += 1
                continue
            differing += 1
            if shown < show_records:
                shown += 1
                details.append(f"{name} [{key}]: record differs\n" + "\n".join(
                    f"  {p}\n    before: {_show(x)}\n    after:  {_show(y)}" for p, x, y in found))
        missing = [k for k in b["records"] if k not in a["records"]]
        extra = [k for k in a["records"] if k not in b["records"]]
        if differing > shown:
            details.append(f"{name}: {differing - shown} more differing record(s) not shown")
        if missing:
            details.append(f"{name}: keys missing after: {', '.join(missing[:10])}")
        if extra:
            details.append(f"{name}: keys only after: {', '.join(extra[:10])}")
        if differing or missing or extra:
            notes.insert(0, "records differ")
        if notes:
            ok = False
        rows.append([name, len(b["records"]), same, differing, len(missing), len(extra),
                     "DIFFERENT: " + ", ".join(notes) if notes else "identical"])
    print()
    headers = ["runner", "units", "identical", "differing", "missing", "extra", "verdict"]
    print(tabulate(rows, headers=headers))
    for text in details:
        print()
        print(text)
    return ok


def describe(side: dict, label: str) -> str:
    meta = side["meta"]
    if meta.get("side") == "ref":
        what = f"{meta['ref']} = {meta['commit'][:12]} ({meta.get('subject', '')})"
    else:
        changed = meta.get("changed_package_files") or []
        what = f"working tree at {meta.get('head', '?')[:12]} + {len(changed)} changed package file(s)"
    order = [n for n in RUNNERS if n in side["runners"]] + [n for n in side["runners"] if n not in RUNNERS]
    secs = ", ".join(f"{n} {side['runners'][n]['seconds']:.0f} s" for n in order)
    return f"{label}: {what}; recorded {meta.get('when')}; {secs}"


# -------------------------------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Configs:\n" + "\n".join(
                                         f"  {r.name}: {' '.join(r.flags)}" for r in RUNNERS.values()))
    parser.add_argument("--ref", help="git commit/branch of the 'before' side (default with no "
                                      "--save/--against: HEAD)")
    parser.add_argument("--save", metavar="FILE", help="write the normalised records of the side that ran")
    parser.add_argument("--against", metavar="FILE", help="compare the side that ran with a saved side")
    parser.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two saved sides")
    parser.add_argument("--runners", default=",".join(RUNNERS),
                        help=f"comma-separated subset of {','.join(RUNNERS)}")
    parser.add_argument("--work-dir", help="where run folders, caches and the worktree go (default: a "
                                           "temporary folder, removed at the end unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (and print where)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per runner before it is killed")
    parser.add_argument("--heartbeat", type=float, default=20, help="seconds between progress lines")
    parser.add_argument("--hash-seed", default="0",
                        help="PYTHONHASHSEED of the runners ('random': unset, to test that records do not "
                             "depend on set/dict-of-str order)")
    parser.add_argument("--llm-profile", metavar="NAME",
                        help="run the LLM with this runtime profile (`--llm-profile exact`: "
                             "smollm2-135m@exact), to prove that a profile reproduces the records of a "
                             "commit whose default it was")
    parser.add_argument("--show-records", type=int, default=3, help="differing records shown per runner")
    parser.add_argument("--show-paths", type=int, default=5, help="differing JSON paths shown per record")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.runners.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNNERS]
    if unknown or not names:
        parser.error(f"--runners: unknown {unknown}; choose from {', '.join(RUNNERS)}")
    args.runner_list = [RUNNERS[n] for n in names]
    if args.diff and (args.save or args.against or args.ref):
        parser.error("--diff compares two saved files; it takes no --ref/--save/--against")
    return args


def load_side(path: str) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise SystemExit(f"{path}: not a records_identity file (format {data.get('format')!r})")
    spec = data["meta"].get("llm_spec", LLM)  # files saved before --llm-profile ran the plain spec
    for result in data["runners"].values():  # the current rules may drop more than the saved ones
        result["header"] = normalise(result["header"], spec=spec)
        result["records"] = {plain_spec(k, spec): normalise(v, spec=spec)
                             for k, v in result["records"].items()}
    return data


def save_side(side: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(side, indent=1, sort_keys=True) + "\n")
    log(f"saved {sum(len(r['records']) for r in side['runners'].values())} normalised records to {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    HASH_SEED["value"] = args.hash_seed
    LLM_SPEC["value"] = f"{LLM}@{args.llm_profile}" if args.llm_profile else LLM
    if args.diff:
        before, after = load_side(args.diff[0]), load_side(args.diff[1])
        print(describe(before, "before"))
        print(describe(after, "after"))
        return 0 if compare(before, after, show_records=args.show_records, show_paths=args.show_paths) else 1
    both = not args.save and not args.against
    ref = args.ref or ("HEAD" if both else None)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="records-identity-"))
    work.mkdir(parents=True, exist_ok=True)
    probe_dir = work / "probe"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log(f"work folder: {work}; runners: {', '.join(r.name for r in args.runner_list)}")
    started = time.perf_counter()
    ref_side = make_ref_side(ref, work) if ref else None
    try:
        if both:
            assert ref_side is not None
            before = run_side(ref_side, args.runner_list, work, probe_dir, timeout=args.timeout,
                              heartbeat=args.heartbeat)
            after = run_side(make_current_side(work), args.runner_list, work, probe_dir, timeout=args.timeout,
                             heartbeat=args.heartbeat)
        else:
            side = ref_side or make_current_side(work)
            after = run_side(side, args.runner_list, work, probe_dir, timeout=args.timeout,
                             heartbeat=args.heartbeat)
            before = None
            if args.save:
                save_side(after, args.save)
            if args.against:
                before = load_side(args.against)
    finally:
        if ref_side is not None:
            remove_worktree(ref_side)
        if args.keep:
            log(f"run folders kept in {work}")
        elif not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    log(f"total {time.perf_counter() - started:.0f} s")
    failed = [n for n, r in after["runners"].items() if r.get("error")]
    if before is None:  # --save only
        from tabulate import tabulate

        print(describe(after, "ran"))
        print(tabulate([[n, r["seconds"], len(r["records"]), "FAILED" if r.get("error") else "ok"]
                        for n, r in after["runners"].items()], headers=["runner", "seconds", "records", ""]))
        if failed:
            log(f"runner(s) failed: {', '.join(failed)}")
        return 1 if failed else 0
    print()
    print(describe(before, "before"))
    print(describe(after, "after"))
    identical = compare(before, after, show_records=args.show_records, show_paths=args.show_paths)
    print()
    print("IDENTICAL apart from timing fields" if identical else "DIFFERENT (see above)")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
