"""Every code block in the README and docs/ runs as written.

Python blocks of one page run top to bottom in one namespace (later blocks use earlier
names), in a scratch folder. Shell blocks that call `ctrlsim` run in the slow suite
(they train models or load LLMs); the set-up blocks (fresh venv + pip) are what CI itself
runs: `.ci/run` must contain the README's test command verbatim.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(page.read_text()) if kind == lang]


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def page_loads_llm(page: Path) -> bool:
    """Whether a page's Python blocks load an LLM (their test then carries the `llm` mark)."""
    return any("load_llm(" in body for body in blocks(page, "python"))


@pytest.mark.parametrize("page", [pytest.param(p, marks=[pytest.mark.llm] if page_loads_llm(p) else [])
                                  for p in PAGES if blocks(p, "python")], ids=page_id)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    # A real module, so dataclasses and pickling defined in a doc block resolve their module.
    module = types.ModuleType("ctrlsim_doc_page")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for n, code in enumerate(blocks(page, "python"), 1):
        exec(compile(code, f"{page_id(page)} block {n}", "exec"), module.__dict__)  # noqa: S102 - docs are ours


def test_ci_runs_the_readme_test_command():
    readme_cmds = [line for b in blocks(ROOT / "README.md", "bash") for line in b.splitlines()
                   if "pytest" in line]
    assert readme_cmds, "the README must show the command that installs and runs the tests"
    assert readme_cmds[0] in (ROOT / ".ci" / "run").read_text()


def shell_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for body in blocks(page, "bash"):
            for line in body.splitlines():
                line = line.strip()
                if line.startswith("python3 -m venv"):  # set-up lines: run by CI itself
                    continue
                if line.startswith(("ctrlsim ", "python benchmarks/")):
                    found.append((page_id(page), line))
    return found


LLM_FLAGS = ("--llm", "--llms", "--model")


def command_loads_llm(command: str) -> bool:
    """Whether a documented command loads an LLM: it names one, or runs ctrlbench methods besides random."""
    argv = shlex.split(command)
    if any(arg in LLM_FLAGS for arg in argv) or argv[:2] == ["ctrlsim", "audit"]:  # an audit runs LLM probes
        return True
    if argv[:2] == ["ctrlsim", "calibrate"]:  # scripted probes and templates load none
        methods = argv[argv.index("--methods") + 1].split(",") if "--methods" in argv else ["oracle"]
        scripted = {"random", "oracle", "template", "stronger", "weaker", "b0", "b1", "b2", "b3"}
        return not set(methods) <= scripted or ("--compare" in argv and "promptshift" in argv)
    if argv[:2] != ["ctrlsim", "ctrlbench"]:
        return False
    methods = argv[argv.index("--methods") + 1].split(",") if "--methods" in argv else ["base-large"]
    return set(methods) != {"random"}


@pytest.mark.slow
@pytest.mark.parametrize("page, command", [
    pytest.param(page, command, marks=[pytest.mark.llm] if command_loads_llm(command) else [], id=command)
    for page, command in shell_commands()])
def test_shell_commands_run(page, command, tmp_path):
    argv = shlex.split(command)
    if argv[0] == "ctrlsim":
        argv = [sys.executable, "-m", "ctrlsim.experiments.cli", *argv[1:]]
    else:
        argv = [sys.executable, str(ROOT / argv[1]), *argv[2:]]
    env = {**os.environ, "CTRLSIM_THREADS": os.environ.get("CTRLSIM_THREADS", "1")}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, f"{page}: {command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
