"""RecBole without its stale pins: the numpy-2 layer, the install message, the extra's coverage.

RecBole 1.2.1 is installed with `--no-deps` (its metadata pins `ray<=2.6.3`); ctrlsim's `recbole`
extra carries its runtime needs instead, and `ctrlsim.recommenders.recbole.sandbox.numpy_aliases`
supplies the numpy 1 names it reads while it runs. The RecBole boxes' own tests
(test_sequential.py) train, cache and score through that layer on whatever numpy is installed.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from ctrlsim.data.registry import RECBOLE_INSTALL, recbole_missing
from ctrlsim.errors import MissingDependencyError
from ctrlsim.recommenders.recbole.sandbox import numpy_aliases

ROOT = Path(__file__).resolve().parents[2]
NUMPY_2 = int(np.__version__.split(".")[0]) >= 2
# Every numpy name RecBole 1.2.1's Config.compatibility_settings reads or assigns (read off its source).
RECBOLE_NAMES = ("float_", "complex_", "unicode_", "bool", "int", "float", "complex", "object", "str", "long",
                 "unicode")


def _namespace() -> dict[str, int]:
    """id() of each of RECBOLE_NAMES that numpy's module dict holds (absent names are left out)."""
    return {name: id(np.__dict__[name]) for name in RECBOLE_NAMES if name in np.__dict__}


def _like_recbole_config() -> None:
    """What RecBole's Config.compatibility_settings does (recbole/config/configurator.py)."""
    np.bool = np.bool_
    np.int = np.int_
    np.float = np.float_
    np.complex = np.complex_
    np.object = np.object_
    np.str = np.str_
    np.long = np.int_
    np.unicode = np.unicode_


def test_aliases_inside_and_namespace_restored_after():
    before = _namespace()
    with numpy_aliases():
        assert np.float_ is np.float64 and np.complex_ is np.complex128 and np.unicode_ is np.str_
        _like_recbole_config()
        assert np.float is np.float64 and np.long is np.int_
    assert _namespace() == before
    if NUMPY_2:  # numpy 2 has none of the removed names once RecBole is done
        removed = {"float_", "complex_", "unicode_", "float", "int", "object", "str", "unicode"}
        assert not removed & set(np.__dict__)
        with pytest.raises(AttributeError):
            np.float_  # noqa: B018 - the attribute access is the test


def test_numpy_1_aliases_are_its_own_objects():
    """On numpy 1.x the layer adds nothing: inside it, the aliases are numpy's originals."""
    if NUMPY_2:
        pytest.skip("numpy 1.x only")
    originals = {name: np.__dict__[name] for name in ("float_", "complex_", "unicode_")}
    with numpy_aliases():
        assert {name: np.__dict__[name] for name in originals} == originals


def test_namespace_restored_when_recbole_raises():
    before = _namespace()
    with pytest.raises(RuntimeError, match="boom"):
        with numpy_aliases():
            _like_recbole_config()
            raise RuntimeError("boom")
    assert _namespace() == before


def test_nested_blocks_restore_the_outer_state():
    before = _namespace()
    with numpy_aliases():
        with numpy_aliases():
            _like_recbole_config()
        assert np.float_ is np.float64  # the outer block's alias survives the inner exit
    assert _namespace() == before


def test_recboles_own_compatibility_settings_run_on_this_numpy():
    if importlib.util.find_spec("recbole") is None:
        pytest.skip(f"recbole is not installed: {RECBOLE_INSTALL}")
    from ctrlsim.recommenders.recbole.sandbox import import_recbole

    try:
        rb = import_recbole()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    before = _namespace()
    with numpy_aliases():
        rb.Config.compatibility_settings(None)  # uses no state of the instance
        assert np.float is np.float64 and np.unicode is np.str_
    assert _namespace() == before


def test_missing_recbole_names_both_install_steps():
    exc = recbole_missing("the bundled ml-100k data")
    assert isinstance(exc, MissingDependencyError) and isinstance(exc, ImportError)
    assert exc.module == "recbole" and exc.extra == "recbole"
    assert str(exc) == ("Python package 'recbole' is not installed (needed for the bundled ml-100k data). "
                        'Install it with: pip install "ctrlsim[recbole]" && '
                        "pip install --no-deps recbole==1.2.1")


def _extra(name: str) -> dict[str, str]:
    """Canonical name -> requirement string of one of pyproject.toml's extras."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {canonicalize_name(Requirement(r).name): r for r in extras[name]}


def test_recbole_extra_carries_recboles_runtime_needs_without_its_pins():
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    extra = _extra("recbole")
    assert "recbole" not in extra and "ray" not in extra  # either would bring back ray<=2.6.3
    try:
        declared = importlib.metadata.requires("recbole") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"recbole is not installed: {RECBOLE_INSTALL}")
    needed = {canonicalize_name(Requirement(r).name) for r in declared if "extra ==" not in r}
    assert "ray" in needed  # RecBole 1.2.1's metadata, as installed
    assert needed - {"ray"} == set(extra)


def test_readme_and_ci_install_recbole_without_its_dependencies():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    setups = [line for line in readme.splitlines() if line.startswith("python3 -m venv")]
    assert len(setups) == 2
    for line in setups:
        # After the extras: the step that resolves last must not see RecBole's ray pin.
        assert ' && pip install --no-deps recbole==1.2.1 && ' in line
        assert line.index('pip install -e ".[all') < line.index("--no-deps recbole")
    assert "pip install --no-deps recbole==1.2.1" in ci
