"""A cache of a run's derived outputs (tables text, figure PNGs), keyed by everything they are made of.

A runner's tables and figures are pure functions of its records and config, run by ctrlsim's code
on a few libraries. A fully cached rerun recomputes identical records, so drawing its figures again
(importing matplotlib costs more than the rest of such a run) and recomputing its significance
tests (scipy) only reproduce bytes it already made. `cached_text` and `cached_figures` keep those
bytes in `$CTRLSIM_CACHE/outputs`, one JSON file per key, and write them into the run folder
instead.

The key is a SHA-256 over: what is made (`kind`), the exact inputs of the function that makes it
(canonical JSON; inputs that are not JSON are never cached), ctrlsim's source digest (the one
provenance records), the Python version and the versions of the libraries the output is made
with; for figures also every matplotlib settings file matplotlib would read (`matplotlibrc` in
the working folder, `$MATPLOTLIBRC`, the user's config folder) and its font list, since those
change the pixels without changing any version. An entry whose bytes do not match their stored
SHA-256 is damaged: it is removed with a `CacheCorruptionWarning` and the output is made again.
That SHA-256 only catches damage, since whoever edits the bytes can recompute it. Every entry also
carries a seal (`ctrlsim.cache_seal`: an HMAC under the folder's own secret key of the entry's key
and its files' SHA-256s). An entry whose seal does not verify was rewritten or copied from another
key. It is treated as damaged, so a run's tables never come from bytes this cache did not make.
A cache folder that cannot be written costs only the saving (`CacheUnavailableWarning`).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import warnings
from pathlib import Path
from typing import Any, Callable

from ctrlsim.cache_seal import cache_secret, seal, verify
from ctrlsim.errors import CacheCorruptionWarning, CacheUnavailableWarning, CtrlsimError

#: Part of every key: bumped when the entry layout changes (2: sealed entries).
CACHE_FORMAT = 2
TABLE_LIBRARIES = ("numpy", "scipy", "tabulate", "pandas")
FIGURE_LIBRARIES = ("numpy", "matplotlib", "pillow")


def _versions(dists: tuple[str, ...]) -> dict[str, str]:
    from ctrlsim.experiments.provenance import library_version

    found = {"python": platform.python_version()}
    found.update({dist: library_version(dist) or "absent" for dist in dists})
    return found


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def matplotlib_settings() -> dict[str, Any]:
    """Digests of the files that set how matplotlib draws, found as matplotlib finds them, without
    importing it: `matplotlibrc` in the working folder, `$MATPLOTLIBRC` (a file, or a folder holding
    one), `matplotlibrc` in the user's config folder, and the font list in its cache folder."""
    home = Path.home()
    config = Path(os.environ["MPLCONFIGDIR"]) if os.environ.get("MPLCONFIGDIR") else None
    config_dirs = [config] if config else [Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
                                           / "matplotlib", home / ".matplotlib"]
    cache_dirs = [config] if config else [Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")
                                          / "matplotlib", home / ".matplotlib"]
    rc = [Path.cwd() / "matplotlibrc"]
    if os.environ.get("MATPLOTLIBRC"):
        given = Path(os.environ["MATPLOTLIBRC"])
        rc += [given, given / "matplotlibrc"]
    rc += [folder / "matplotlibrc" for folder in config_dirs]
    fonts = sorted(p for folder in cache_dirs if folder.is_dir() for p in folder.glob("fontlist-*.json"))
    return {"rc": {str(p): _file_digest(p) for p in rc}, "fonts": {str(p): _file_digest(p) for p in fonts}}


def output_key(kind: str, inputs: Any, libraries: tuple[str, ...], extra: Any = None) -> str | None:
    """The cache key of output `kind` made from `inputs`, or None when `inputs` is not plain JSON."""
    from ctrlsim.experiments.provenance import code_version

    try:
        shown = json.dumps(inputs, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    blob = json.dumps({"cache_format": CACHE_FORMAT, "kind": kind, "inputs": shown,
                       "source_sha256": code_version()["source_sha256"], "libraries": _versions(libraries),
                       "extra": extra}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _entry_path(key: str) -> Path | None:
    from ctrlsim.backends.bundled import cache_dir

    try:
        return cache_dir("outputs") / f"{key}.json"
    except OSError as exc:  # CacheUnwritableError is an OSError
        warnings.warn(CacheUnavailableWarning(f"{exc}; outputs are made without their cache"), stacklevel=4)
        return None


def _secret(path: Path) -> bytes | None:
    """The seal key of the cache folder holding entry `path`; None (the cache unused) without one."""
    try:
        return cache_secret(path.parent)
    except OSError as exc:  # CacheUnwritableError is an OSError
        warnings.warn(CacheUnavailableWarning(f"{exc}; outputs are made without their cache"), stacklevel=4)
        return None


def _sealed_parts(key: str, listed: dict[str, Any]) -> tuple[str, str, str]:
    """What an entry's seal covers: its key and the name and SHA-256 of each file it holds."""
    return "outputs", key, json.dumps({name: item["sha256"] for name, item in listed.items()}, sort_keys=True)


def _read(path: Path, secret: bytes) -> dict[str, bytes] | None:
    """The stored outputs (name -> bytes), None when there is no entry; a damaged entry is removed."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(CacheUnavailableWarning(f"output cache entry {path} cannot be read ({exc})"),
                      stacklevel=4)
        return None
    try:
        entry = json.loads(raw)
        listed = entry["files"]
        files = {name: base64.b64decode(item["base64"], validate=True) for name, item in listed.items()}
        if entry.get("format") != CACHE_FORMAT:
            raise ValueError(f"entry format {entry.get('format')!r}, expected {CACHE_FORMAT}")
        if any(hashlib.sha256(data).hexdigest() != listed[name]["sha256"] for name, data in files.items()):
            raise ValueError("content does not match its sha256")
        if not verify(secret, entry.get("seal"), *_sealed_parts(path.stem, listed)):
            raise ValueError("its seal does not verify: it was rewritten or replaced since this cache "
                             "wrote it")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # json and base64 errors are ValueErrors
        warnings.warn(CacheCorruptionWarning(f"output cache entry {path} is damaged ({exc}); removed it, the "
                                             "outputs are made again"), stacklevel=4)
        path.unlink(missing_ok=True)
        return None
    return files


def _write(path: Path, secret: bytes, kind: str, files: dict[str, bytes]) -> None:
    from ctrlsim.atomic import atomic_write_text

    listed = {name: {"sha256": hashlib.sha256(data).hexdigest(),
                     "base64": base64.b64encode(data).decode("ascii")} for name, data in files.items()}
    entry = {"format": CACHE_FORMAT, "kind": kind, "files": listed,
             "seal": seal(secret, *_sealed_parts(path.stem, listed))}
    try:
        atomic_write_text(path, json.dumps(entry))
    except (OSError, CtrlsimError) as exc:
        warnings.warn(CacheUnavailableWarning(f"outputs not cached: {path} cannot be written ({exc})"),
                      stacklevel=4)


def cached_text(kind: str, inputs: Any, make: Callable[[], str],
                libraries: tuple[str, ...] = TABLE_LIBRARIES) -> str:
    """`make()`, or the text it made before from the same `inputs` (see the module docstring)."""
    key = output_key(kind, inputs, libraries)
    path = _entry_path(key) if key is not None else None
    secret = _secret(path) if path is not None else None
    stored = _read(path, secret) if path is not None and secret is not None else None
    if stored is not None and set(stored) == {"text"}:
        return stored["text"].decode("utf-8")
    text = make()
    if path is not None and secret is not None:
        _write(path, secret, kind, {"text": text.encode("utf-8")})
    return text


class _FigureRecorder:
    """Stands in for a run folder while figures are drawn: keeps each figure's PNG bytes by name."""

    def __init__(self) -> None:
        self.figures: dict[str, bytes] = {}

    def save_figure(self, fig, name: str) -> str:
        from ctrlsim.experiments.runfolder import figure_png

        self.figures[name] = figure_png(fig)
        return name


def cached_figures(folder, kind: str, inputs: Any, draw: Callable[[Any], None]) -> list[Path]:
    """Write into run folder `folder` the figures `draw(target)` saves with `target.save_figure(fig,
    name)`, drawing them only when the cache has no figures made from the same `inputs`."""
    key = output_key(kind, inputs, FIGURE_LIBRARIES, extra=matplotlib_settings())
    path = _entry_path(key) if key is not None else None
    secret = _secret(path) if path is not None else None
    stored = _read(path, secret) if path is not None and secret is not None else None
    if stored is None:
        recorder = _FigureRecorder()
        draw(recorder)
        stored = recorder.figures
        if path is not None and secret is not None:
            _write(path, secret, kind, stored)
    return [folder.write_figure(name, png) for name, png in stored.items()]
