"""The user's own code a run names, for its provenance: which modules, and a digest of their source.

A `module:attribute` method (or a method registered from the user's code) runs code that is not
ctrlsim's, so ctrlsim's source digest does not cover it: an edited builder resumed into a folder
would mix two policies under one method name. `user_code(identity)` finds the modules the config's
registered methods run (`ctrlsim.agents.methods.method_modules`), skips ctrlsim's own, and records
for each its source: for a module inside a package, every Python file of its top-level package (an
edited helper module changes the policy as much as the builder does); for a top-level module, its
file. A module with no source file (a notebook's `__main__`, a module made in memory) is recorded
with `sha256: null`, which no later run can match: a resume naming it is a code change.

The entry sits in the provenance's `code` as `user_code`, and `changes` compares two of them as
ctrlsim's own source is compared: refused on resume unless `--allow-code-change`, which is recorded.
Nothing here imports `provenance` (it imports this module).
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

OWN = ("ctrlsim",)  # covered by the provenance's own source digest


def config_strings(value: Any) -> Iterable[str]:
    """Every string in a config value, at any depth (mappings' values, lists, tuples): where module
    names and input paths are looked for. Shared with provenance's input digests."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from config_strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from config_strings(item)


def _spec(name: str):
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None), module
    try:
        return importlib.util.find_spec(name), None
    except (ImportError, ValueError):  # not importable (any more): nothing to hash
        return None, None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def module_source(name: str, files_listed: int) -> dict[str, Any]:
    """{"path", "sha256"} of module `name`'s source (with "files", each file's digest, for a package
    of at most `files_listed` files); sha256 is None when there is no source file to hash."""
    top = name.partition(".")[0]
    spec, loaded = _spec(top)
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    if locations:  # a package: every Python file under it, by name relative to its folder
        files = {}
        for root in (Path(location).resolve() for location in locations):
            for path in sorted(root.rglob("*.py")):
                if "__pycache__" not in path.parts:
                    files[f"{root.name}/{path.relative_to(root).as_posix()}"] = _sha256(path)
        digest = hashlib.sha256()
        for file, value in sorted(files.items()):
            digest.update(file.encode() + b"\0" + value.encode() + b"\0")
        found: dict[str, Any] = {"path": str(Path(locations[0]).resolve()), "sha256": digest.hexdigest()}
        if len(files) <= files_listed:  # so a refusal can name the file that changed
            found["files"] = files
        return found
    origin = getattr(spec, "origin", None) or getattr(loaded, "__file__", None)
    source = Path(origin) if origin else None
    if source is None or not source.is_file():
        return {"path": None, "sha256": None}
    return {"path": str(source.resolve()), "sha256": _sha256(source)}


def user_code(identity: Mapping[str, Any], files_listed: int) -> dict[str, dict[str, Any]]:
    """Module name -> `module_source` for every module outside ctrlsim that a method named anywhere
    in the config runs (methods already registered when the config was checked)."""
    from ctrlsim.agents.methods import method_modules

    modules = [m for m in method_modules(set(config_strings(identity)))
               if m.partition(".")[0] not in OWN]
    return {module: module_source(module, files_listed) for module in modules}


def files_changed(then: Mapping[str, Any], now: Mapping[str, Any], shown: int) -> str | None:
    """"files changed: a, b ..." between two digests of a folder (their `files` maps), or None when
    either has no per-file digests. Shared with provenance's input changes."""
    files_then, files_now = then.get("files"), now.get("files")
    if not isinstance(files_then, dict) or not isinstance(files_now, dict):
        return None
    changed = sorted(f for f in set(files_then) | set(files_now) if files_then.get(f) != files_now.get(f))
    return f"files changed: {', '.join(changed[:shown])}" + (" ..." if len(changed) > shown else "")


def changes(then: Mapping[str, Any], now: Mapping[str, Any], labels: tuple[str, str],
            shown: int) -> list[str]:
    """One line per module recorded in both entries whose source differs (or is unknown)."""
    was, is_ = labels
    lines = []
    for name in sorted(set(then) & set(now)):
        a, b = then[name] or {}, now[name] or {}
        if a.get("sha256") is None or b.get("sha256") is None:
            lines.append(f"user code {name}: its source cannot be hashed (no source file), so it cannot be "
                         "shown unchanged")
            continue
        if a.get("sha256") == b.get("sha256"):
            continue
        what = files_changed(a, b, shown) or "source changed"
        lines.append(f"user code {name} ({b.get('path')}): {what} "
                     f"(sha256 {str(a.get('sha256'))[:12]}... {was}, {str(b.get('sha256'))[:12]}... {is_})")
    return lines
