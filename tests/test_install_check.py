"""The CI helper scripts for installs: `.ci/check_install_resolves.py` and `.ci/compare_recbole_scores.py`.

The fast tests check their parsing and comparison logic on hand-made inputs; the slow test runs
the dry-run resolution of the README's test set-up on every Python 3.10-3.13 this machine has
(it needs the package index, and a few minutes per Python).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    """A `.ci/` script as a module (registered in sys.modules: its dataclasses need that)."""
    spec = importlib.util.spec_from_file_location(f"ctrlsim_ci_{name}", ROOT / ".ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


resolves = _load("check_install_resolves")
scores = _load("compare_recbole_scores")


def test_readme_test_command_and_its_pip_steps():
    command = resolves.readme_command((ROOT / "README.md").read_text(), "test")
    assert command in (ROOT / ".ci" / "run").read_text()
    assert resolves.pip_steps(command) == [["torch==2.13.0"], ["-e", ".[all,dev]"],
                                           ["--no-deps", "recbole==1.2.1"]]
    main = resolves.readme_command((ROOT / "README.md").read_text(), "main")
    assert resolves.pip_steps(main)[1] == ["-e", ".[all]"]


def test_pip_steps_of_a_made_up_command():
    command = ('python3 -m venv v && . v/bin/activate && pip install "a[b]>=1" c && pip --version'
               ' && echo pip install x')
    assert resolves.pip_steps(command) == [["a[b]>=1", "c"]]
    with pytest.raises(resolves.SetupError):
        resolves.pip_steps("python3 -m venv v && make")
    with pytest.raises(resolves.SetupError, match="pytest"):
        resolves.readme_command("```bash\necho hi\n```\n", "test")


LINUX_313 = {"sys_platform": "linux", "python_version": "3.13", "python_full_version": "3.13.0",
             "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython",
             "platform_release": "", "platform_version": "", "implementation_version": "3.13.0"}
RECBOLE_LIKE = ["numpy (>=1.17.2)", "ray (<=2.6.3,>=1.13.0)", "scipy>=1.6.0", "colorlog==4.7.2",
                "hyperopt (==0.2.5) ; extra == 'hyperopt'", "pywin32; sys_platform == 'win32'",
                "tomli; python_version < '3.11'"]


def test_unmet_requirements_by_hand():
    resolved = {"numpy": "2.5.5", "ray": "2.60.0", "scipy": "1.17.1", "colorlog": "6.12.0"}
    # ray 2.60.0 > 2.6.3 and colorlog 6.12.0 != 4.7.2; hyperopt (extra), pywin32 and tomli (markers) skipped.
    assert resolves.unmet_requirements(RECBOLE_LIKE, resolved, LINUX_313) == [
        "'ray (<=2.6.3,>=1.13.0)': resolved ray 2.60.0", "'colorlog==4.7.2': resolved colorlog 6.12.0"]
    relaxed = frozenset({"ray", "colorlog"})
    assert resolves.unmet_requirements(RECBOLE_LIKE, resolved, LINUX_313, relaxed) == []
    no_scipy = {k: v for k, v in resolved.items() if k != "scipy"}
    assert resolves.unmet_requirements(RECBOLE_LIKE, no_scipy, LINUX_313, relaxed) == [
        "'scipy>=1.6.0': scipy is not installed"]
    old_numpy = {**resolved, "numpy": "1.16.0"}
    assert resolves.unmet_requirements(["numpy>=1.17.2"], old_numpy, LINUX_313) == [
        "'numpy>=1.17.2': resolved numpy 1.16.0"]
    # A relaxed requirement still has to be present.
    assert resolves.unmet_requirements(["ray<=2.6.3"], {}, LINUX_313, frozenset({"ray"})) == [
        "'ray<=2.6.3': ray is not installed"]
    assert resolves.RELAXED["recbole"] == {"ray", "colorlog", "colorama"}


def test_report_versions_canonicalises_names():
    report = {"install": [{"metadata": {"name": "PyYAML", "version": "6.0.4"}},
                          {"metadata": {"name": "scikit_learn", "version": "1.9.1"}}]}
    assert resolves.report_versions(report) == {"pyyaml": "6.0.4", "scikit-learn": "1.9.1"}


def test_find_python():
    assert resolves.find_python(sys.executable) == sys.executable
    with pytest.raises(resolves.SetupError):
        resolves.find_python("2.1")
    with pytest.raises(resolves.SetupError):
        resolves.find_python("/no/such/python")


def test_compare_scores_by_hand():
    saved = np.array([[3.0, 1.0, -np.inf, 2.0], [0.5, 0.25, -np.inf, 1.0]])
    close = saved + np.array([[5e-7, 0, 0, -5e-7], [0, 0, 0, 0]])
    result = scores.compare_scores(saved, close, atol=1e-6, top=2)
    assert result["ok"] and not result["bit_identical"] and result["same_top_slates"] == "2/2"
    assert result["max_abs_diff"] == pytest.approx(5e-7, abs=1e-12)
    assert scores.compare_scores(saved, saved.copy(), atol=0.0, top=2)["bit_identical"]
    far = saved.copy()
    far[0, 0] += 2e-6
    assert not scores.compare_scores(saved, far, atol=1e-6, top=2)["ok"]
    swapped = saved.copy()
    swapped[1, [0, 1]] = [0.25, 0.5]  # same values, other slate order
    assert scores.compare_scores(saved, swapped, atol=1.0, top=2)["same_top_slates"] == "1/2"
    moved_inf = saved.copy()
    moved_inf[0, 1], moved_inf[0, 2] = -np.inf, 1.0
    assert not scores.compare_scores(saved, moved_inf, atol=10.0, top=2)["ok"]
    assert not scores.compare_scores(saved, saved[:1], atol=1.0)["ok"]


def _available(version: str) -> bool:
    try:
        resolves.find_python(version)
    except resolves.SetupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("version", resolves.PYTHONS)
def test_readme_setup_resolves(version):
    """`pip install --dry-run` of the README's test set-up in a fresh venv of each Python (minutes each)."""
    if not _available(version):
        pytest.skip(f"no Python {version} on this machine")
    script = ROOT / ".ci" / "check_install_resolves.py"
    done = subprocess.run([sys.executable, str(script), "--python", version], capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith(f"Python {version}"))
    versions = dict(part.rsplit(" ", 1) for part in line.split(": ", 1)[1].split(", "))
    assert int(versions["numpy"].split(".")[0]) >= 2, line
    ray = tuple(int(x) for x in versions["ray"].split(".")[:2])
    assert ray > (2, 6), line  # a current Ray, not RecBole's 2.6.3
    assert versions["recbole"] == "1.2.1"
