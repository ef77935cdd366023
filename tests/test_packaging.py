"""A wheel holds every package of the source tree: pyproject's explicit `packages` list names each
folder that has an `__init__.py` (a missing one installs only in editable mode)."""
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, roots = set(tool["packages"]), tool["package-dir"]
    found = set()
    for name, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    # a folder mapped as a package root of its own (ctrlsim.envs, ctrlsim.agents) is found twice
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
