"""The unit-of-work pieces every executor shares: failure records, the worker cache, run summaries.

Kept apart from `executor` (which picks an executor and imports the Ray one on demand) so the Ray
executor can use them without importing `executor` back.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from ctrlsim.errors import ConfigError

logger = logging.getLogger("ctrlsim.experiments.executor")

UnitFn = Callable[[Any, str], dict]
OnRecord = Callable[[str, dict], None]

# ------------------------------------------------------------------------------------ failures

ERROR_MESSAGE_LIMIT = 2000  # a failure record carries the message, not a whole traceback


def failure_record(exc: BaseException) -> dict:
    """The record of a unit that raised `exc`: `{"failed": True, "error": "<Type>: <msg>"}`."""
    from ctrlsim.redact import redact_secrets

    message = redact_secrets(str(exc))
    if len(message) > ERROR_MESSAGE_LIMIT:
        message = message[:ERROR_MESSAGE_LIMIT] + "..."
    return {"failed": True, "error": f"{type(exc).__name__}: {message}"}


def is_failure(record: dict) -> bool:
    """Whether a record is a failure record (runners leave these out of their tables)."""
    return bool(record.get("failed")) and "error" in record


def run_unit(unit_fn: UnitFn, config, key: str) -> dict:
    """Run one unit where it stands, turning a raised exception into a failure record.

    Both executors go through this function, so a failing unit gives the same record
    whether it ran locally or on a Ray worker. Every unit starts with the KV caches of this
    process's models emptied (`_WorkerCache.reset_kv`): prefix reuse then spans the calls of one
    unit only, so what a unit computes does not depend on which units ran before it here.
    """
    _CACHE.reset_kv()
    try:
        record = unit_fn(config, key)
    except Exception as exc:  # noqa: BLE001 - a failing unit is recorded, it must not sink the run
        # The traceback goes to the worker's log (Ray forwards worker logs to the driver).
        import traceback

        from ctrlsim.redact import redact_secrets

        logger.warning("unit %r failed\n%s", key, redact_secrets(traceback.format_exc()))
        return failure_record(exc)
    if not isinstance(record, dict):
        return failure_record(TypeError(f"unit {key!r}: {getattr(unit_fn, '__name__', unit_fn)} "
                                        f"returned {type(record).__name__}, expected a dict record"))
    return record


# -------------------------------------------------------------------------------- worker cache

class _WorkerCache:
    """Objects built once per process and shared by every unit that runs there."""

    def __init__(self):
        self._objects: dict[str, Any] = {}
        self._lock = threading.RLock()  # re-entrant: a factory may fetch another cached object

    def get(self, name: str, factory: Callable[[], Any]):
        with self._lock:
            if name not in self._objects:
                self._objects[name] = factory()
            return self._objects[name]

    def put(self, name: str, obj: Any) -> None:
        with self._lock:
            self._objects[name] = obj

    def names(self) -> list[str]:
        with self._lock:
            return list(self._objects)

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()

    def reset_kv(self) -> None:
        """Empty the KV cache of every cached model that keeps one (llama.cpp, vLLM)."""
        with self._lock:
            for obj in self._objects.values():
                reset = getattr(obj, "reset_kv", None)
                if callable(reset):
                    reset()


# One per process by design: it is what lets a worker keep a model across units.
_CACHE = _WorkerCache()


def worker_cache(name: str, factory: Callable[[], Any]):
    """The object cached under `name` in this process, built by `factory()` on first use."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"worker_cache needs a non-empty string name, got {name!r}")
    return _CACHE.get(name, factory)


def put_in_worker_cache(name: str, obj: Any) -> None:
    """Make `worker_cache(name, ...)` in this process return `obj` from now on (a loaded model lent
    to a run replaces whatever was kept under its name)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"put_in_worker_cache needs a non-empty string name, got {name!r}")
    _CACHE.put(name, obj)


def run_dataset(spec: str):
    """The dataset `spec` as a run loads it: parsed once per machine, then read back from the
    parsed-dataset cache in `$CTRLSIM_CACHE/datasets` (keyed by the digest of its files; see
    `ctrlsim.data.parsed_cache`). Where that folder cannot be created the dataset is parsed, with a
    `CacheUnavailableWarning`. A fresh object on every call (units get the process's one object
    from `context.UnitContext.dataset`)."""
    import warnings

    from ctrlsim.backends.bundled import cache_dir
    from ctrlsim.data import load_dataset
    from ctrlsim.errors import CacheUnavailableWarning, CacheUnwritableError

    try:
        folder = cache_dir("datasets")
    except CacheUnwritableError as exc:
        warnings.warn(CacheUnavailableWarning(f"{exc}; the dataset is parsed without its cache"),
                      stacklevel=2)
        return load_dataset(spec)
    return load_dataset(spec, cache=folder)


def progress(iterable: Iterable | None = None, *, desc: str, show: bool, total: int | None = None,
             unit: str = "it"):
    """The one progress bar of the experiments layer (tqdm), drawn only where `show` is true (units
    draw theirs through `context.UnitContext.progress`)."""
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, disable=not show)


def cached_names() -> list[str]:
    """Names held by this process's worker cache (for tests and diagnostics)."""
    return _CACHE.names()


def clear_worker_cache() -> None:
    """Drop every cached object of this process (frees the models it held)."""
    _CACHE.clear()


# ----------------------------------------------------------------------------------- executors

@dataclass
class RunSummary:
    """What one `executor.run` did."""

    units: int
    failed: int
    seconds: float

    @property
    def succeeded(self) -> int:
        return self.units - self.failed


class Executor(Protocol):
    kind: str

    def run(self, unit_fn: UnitFn, config, keys: Iterable[str], on_record: OnRecord, *,
            progress: bool = True, desc: str = "units") -> RunSummary: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Executor": ...

    def __exit__(self, *exc) -> None: ...


def unique_keys(keys: Iterable[str]) -> list[str]:
    """The keys as a list; a repeated key is an error (the store has one record per key)."""
    keys = list(keys)
    repeated = [k for k, n in Counter(keys).items() if n > 1]
    if repeated:
        raise ConfigError(f"unit keys must be unique; repeated: {', '.join(map(repr, repeated[:5]))}")
    return keys




def driver_environment() -> dict[str, str]:
    """The driver's ctrlsim settings ($CTRLSIM_*) for workers started elsewhere, with the cache
    folder made absolute: a worker resolves a relative path from wherever its node was started."""
    env = {k: v for k, v in os.environ.items() if k.startswith("CTRLSIM_")}
    if "CTRLSIM_CACHE" in env:
        env["CTRLSIM_CACHE"] = str(Path(env["CTRLSIM_CACHE"]).expanduser().resolve())
    return env
