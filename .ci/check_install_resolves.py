"""Check that the README's set-up resolves on each supported Python, without installing anything.

For every interpreter given (default: Python 3.10, 3.11, 3.12 and 3.13, found on PATH or under
pyenv), this makes a fresh virtual environment in a temporary folder and runs the `pip install`
steps of one README set-up command (`--command test`: the one with `pytest`; `main`: the one
running `ctrlsim ctrlbench`) as `pip install --dry-run --report`, with that venv's own pip, as a
fresh machine would:

- the steps that resolve dependencies (`pip install torch==2.13.0`, `pip install -e ".[all,dev]"`)
  are resolved together in one dry run: what the README installs one after the other must be
  one consistent set;
- a `--no-deps` step (`pip install --no-deps recbole==1.2.1`) is resolved on its own, and each
  requirement its package declares must be met by the set resolved above, except the pins
  listed in `RELAXED` (named in pyproject.toml's `recbole` extra), which need only be present.

It prints one line per Python (resolved numpy, pandas, Ray, torch, setuptools versions, seconds)
and exits 1 if any Python failed. It needs the package index (PyPI) and `packaging`.

    python .ci/check_install_resolves.py
    python .ci/check_install_resolves.py --python 3.13 --python /usr/bin/python3.12 --command main
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
#: Requirements of a `--no-deps` package that ctrlsim deliberately does not honour: it needs only
#: their presence. RecBole 1.2.1 pins Ray for hyper-parameter tuning only (not imported by ctrlsim),
#: and its exact pins of colorlog and colorama are five years old.
RELAXED = {"recbole": frozenset({"ray", "colorlog", "colorama"})}
SHOWN = ("numpy", "pandas", "ray", "torch", "setuptools", "recbole")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


class SetupError(Exception):
    """The README set-up cannot be checked (no such command, no such Python)."""


@dataclass
class Outcome:
    """What one Python resolved to."""

    python: str
    ok: bool = False
    versions: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def readme_command(readme: str, which: str) -> str:
    """The README's one-line set-up command: `test` (the one running pytest) or `main` (ctrlsim ctrlbench)."""
    marker = {"test": "pytest", "main": "ctrlsim ctrlbench"}[which]
    for kind, body in FENCE.findall(readme):
        for line in body.splitlines():
            if kind == "bash" and line.startswith("python3 -m venv") and marker in line:
                return line.strip()
    raise SetupError(f"the README has no one-line set-up command containing {marker!r}")


def pip_steps(command: str) -> list[list[str]]:
    """The arguments of each `pip install` step of a `&&`-chained shell command, in order."""
    steps = []
    for part in command.split("&&"):
        argv = shlex.split(part)
        if argv[:2] == ["pip", "install"]:
            steps.append(argv[2:])
    if not steps:
        raise SetupError(f"no `pip install` step in {command!r}")
    return steps


def unmet_requirements(requires: list[str], resolved: dict[str, str], environment: dict[str, str],
                       relaxed: frozenset[str] = frozenset()) -> list[str]:
    """Requirements (PEP 508 strings) that apply in `environment` and that `resolved` does not meet.

    `resolved` maps canonical names to versions. A requirement named in `relaxed` needs only
    its package present. Requirements that apply only with an extra are not checked.
    """
    problems = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            problems.append(f"unparsable requirement {text!r}")
            continue
        if req.marker is not None and not req.marker.evaluate({**environment, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in resolved:
            problems.append(f"{text!r}: {name} is not installed")
            continue
        if name in relaxed:
            continue
        try:
            met = req.specifier.contains(Version(resolved[name]), prereleases=True)
        except InvalidVersion:
            met = False
        if not met:
            problems.append(f"{text!r}: resolved {name} {resolved[name]}")
    return problems


def report_versions(report: dict) -> dict[str, str]:
    """Canonical name -> version of every distribution a pip `--report` would install."""
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in report.get("install", [])}


def find_python(spec: str) -> str:
    """An interpreter path for a `3.12`-style version (pyenv's newest, then PATH) or an explicit path.

    A candidate counts only if it runs and reports that version (pyenv's shims on PATH name
    versions that are installed but not selected).
    """
    if os.sep in spec:
        if not os.access(spec, os.X_OK):
            raise SetupError(f"{spec} is not an executable")
        return spec
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(os.path.join(root, "versions", f"{spec}.*", "bin", "python3")),
                        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parts[-3])], reverse=True)
    on_path = shutil.which(f"python{spec}")
    for candidate in [*candidates, *([on_path] if on_path else [])]:
        try:
            done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == spec:
            return candidate
    raise SetupError(f"no working Python {spec} found in {root}/versions or on PATH")


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _dry_run(pip: list[str], args: list[str], report: Path, timeout: float) -> dict:
    done = _run([*pip, "install", "--dry-run", "--quiet", "--report", str(report), *args], timeout)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SetupError(f"pip install --dry-run {shlex.join(args)} failed:\n{tail}")
    return json.loads(report.read_text())


def check_python(spec: str, steps: list[list[str]], timeout: float = 1800.0) -> Outcome:
    """Resolve the README's `pip install` steps in a fresh venv of one Python."""
    outcome = Outcome(python=spec)
    started = time.perf_counter()
    try:
        python = find_python(spec)
        with tempfile.TemporaryDirectory(prefix="ctrlsim-resolve-") as tmp:
            venv = Path(tmp) / "venv"
            made = _run([python, "-m", "venv", str(venv)], 300)
            if made.returncode != 0:
                raise SetupError(f"{python} -m venv failed: {made.stderr.strip()[-500:]}")
            pip = [str(venv / "bin" / "python"), "-m", "pip"]
            outcome.python = f"{spec} ({_run([pip[0], '-V'], 60).stdout.split()[1]})"
            resolving = [a for step in steps if "--no-deps" not in step for a in step]
            report = _dry_run(pip, resolving, Path(tmp) / "resolve.json", timeout)
            resolved = report_versions(report)
            environment = report.get("environment", {})
            for n, step in enumerate(s for s in steps if "--no-deps" in s):
                alone = _dry_run(pip, step, Path(tmp) / f"nodeps-{n}.json", timeout)
                for item in alone.get("install", []):
                    meta = item["metadata"]
                    name = canonicalize_name(meta["name"])
                    resolved[name] = meta["version"]
                    for problem in unmet_requirements(meta.get("requires_dist", []) or [], resolved,
                                                      environment, RELAXED.get(name, frozenset())):
                        outcome.problems.append(f"{name} {meta['version']} needs {problem}")
            outcome.versions = {name: resolved.get(name, "-") for name in SHOWN}
            outcome.ok = not outcome.problems
    except (SetupError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as exc:
        outcome.problems.append(f"{type(exc).__name__}: {exc}")
    outcome.seconds = round(time.perf_counter() - started, 1)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", help="a version (3.12) or an interpreter path; "
                        f"repeatable (default: {', '.join(PYTHONS)})")
    parser.add_argument("--command", choices=("test", "main"), default="test",
                        help="which README set-up command to resolve (default: test)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per dry run")
    args = parser.parse_args(argv)
    try:
        steps = pip_steps(readme_command((ROOT / "README.md").read_text(encoding="utf-8"), args.command))
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("resolving:", " ; ".join("pip install " + shlex.join(s) for s in steps), flush=True)
    failed = 0
    for spec in args.python or PYTHONS:
        outcome = check_python(spec, steps, args.timeout)
        shown = ", ".join(f"{k} {v}" for k, v in outcome.versions.items())
        print(f"Python {outcome.python}: {'resolves' if outcome.ok else 'FAILS'} in {outcome.seconds} s"
              + (f": {shown}" if shown else ""), flush=True)
        for problem in outcome.problems:
            print(f"  {problem}", flush=True)
        failed += not outcome.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
