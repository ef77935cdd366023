"""Executors: where a run's units of work execute (in this process, or on a Ray cluster).

The unit-of-work contract every runner follows
----------------------------------------------
* A **unit** is a call ``unit_fn(config, key) -> record``. ``unit_fn`` is a *top-level*
  function of an importable module (so it pickles by reference and a Ray worker can import
  it); ``config`` is the run's picklable config (a dataclass); ``key`` is the unit's key, a
  string unique within the run (e.g. ``"llm/narm/Film-Noir/seed=3"``).
* A unit is a **pure function** of ``(config, key)``: every seed it uses is derived from them
  and it reads no state left behind by other units. That is what lets it run on any
  worker, be retried after a crash, and give the same record with every executor.
* The **record** is a JSON-able dict.
* **Heavy objects** (a black box, an LLM, an encoder) are fetched with
  ``worker_cache(name, factory)``: the first unit on a worker process calls ``factory()``,
  every later unit on that process gets the same object back. ``name`` must identify
  everything the factory depends on (``f"llm:{config.llm}"``), because the cache outlives
  one run inside a long-lived worker.
* **One writer.** ``executor.run(unit_fn, config, keys, on_record)`` calls
  ``on_record(key, record)`` on the driver, in the driver process, as each unit finishes
  (completion order, not key order). Only ``on_record`` writes the run folder, so resuming
  works the same whatever the executor: pass only the keys not yet stored.
* **Failures.** An exception raised by ``unit_fn`` is a deterministic failure of that unit:
  it becomes the record ``{"failed": True, "error": "<Type>: <message>"}`` (see
  ``failure_record`` / ``is_failure``) and the run goes on. A worker process that *dies*
  mid-unit (killed, out of memory, segfault in a native library) is not a unit failure:
  the Ray executor runs the unit again on a live worker (Ray task retries), and only after
  ``max_retries`` deaths records it as failed. Either way ``on_record`` is called exactly
  once per key. ``KeyboardInterrupt`` stops the run; what was recorded stays recorded.

Executors
---------
``make_executor("local")`` runs units one after another in this process and needs no Ray.
``make_executor("ray", ray_address=...)`` sends them to Ray tasks: ``ray_address=None``
starts a private Ray in this process (or reuses one already started with ``ray.init``),
``"auto"`` joins the cluster this machine belongs to (``ray start --head``), and
``"host:port"`` joins that cluster's head. Ray is imported only then; without it,
``MissingDependencyError`` names the ``ray`` extra. Use an executor as a context manager
so a Ray it started is shut down again::

    from ctrlsim.experiments.executor import make_executor

    def square(config, key):
        return {"value": config["base"] ** 2 + int(key)}

    with make_executor("local") as executor:
        records = {}
        executor.run(square, {"base": 3}, ["1", "2"], records.__setitem__, progress=False)
    assert records == {"1": {"value": 10}, "2": {"value": 11}}
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from tqdm import tqdm

from ctrlsim.errors import ConfigError

logger = logging.getLogger(__name__)

UnitFn = Callable[[Any, str], dict]
OnRecord = Callable[[str, dict], None]

EXECUTOR_KINDS = ("local", "ray")

# ------------------------------------------------------------------------------------ failures

ERROR_MESSAGE_LIMIT = 2000  # a failure record carries the message, not a whole traceback


def failure_record(exc: BaseException) -> dict:
    """The record of a unit that raised `exc`: `{"failed": True, "error": "<Type>: <msg>"}`."""
    message = str(exc)
    if len(message) > ERROR_MESSAGE_LIMIT:
        message = message[:ERROR_MESSAGE_LIMIT] + "..."
    return {"failed": True, "error": f"{type(exc).__name__}: {message}"}


def is_failure(record: dict) -> bool:
    """Whether a record is a failure record (runners leave these out of their tables)."""
    return bool(record.get("failed")) and "error" in record


def run_unit(unit_fn: UnitFn, config, key: str) -> dict:
    """Run one unit where it stands, turning a raised exception into a failure record.

    Both executors go through this function, so a failing unit gives the same record
    whether it ran locally or on a Ray worker.
    """
    try:
        record = unit_fn(config, key)
    except Exception as exc:  # noqa: BLE001 - a failing unit is recorded, it must not sink the run
        # The traceback goes to the worker's log (Ray forwards worker logs to the driver).
        logger.warning("unit %r failed", key, exc_info=True)
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

    def names(self) -> list[str]:
        with self._lock:
            return list(self._objects)

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()


# One per process by design: it is what lets a worker keep a model across units.
_CACHE = _WorkerCache()


def worker_cache(name: str, factory: Callable[[], Any]):
    """The object cached under `name` in this process, built by `factory()` on first use."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"worker_cache needs a non-empty string name, got {name!r}")
    return _CACHE.get(name, factory)


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


class LocalExecutor:
    """Runs units one after another in this process (the default; needs no Ray)."""

    kind = "local"

    def run(self, unit_fn: UnitFn, config, keys: Iterable[str], on_record: OnRecord, *,
            progress: bool = True, desc: str = "units") -> RunSummary:
        keys = unique_keys(keys)
        started, failed = time.perf_counter(), 0
        for key in tqdm(keys, desc=desc, disable=not progress):
            record = run_unit(unit_fn, config, key)
            failed += is_failure(record)
            on_record(key, record)
        return RunSummary(len(keys), failed, time.perf_counter() - started)

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "LocalExecutor()"


_ADDRESS = re.compile(r"^(auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")


def check_ray_address(address: str | None) -> None:
    """`None`, `"auto"`, `"host:port"` or `"ray://host:port"`; anything else is a ConfigError."""
    if address is not None and not _ADDRESS.match(address):
        raise ConfigError(f"ray_address must be 'auto', 'host:port' or 'ray://host:port'; got {address!r}")


def make_executor(kind: str = "local", ray_address: str | None = None, **options) -> Executor:
    """An executor by name. `options` go to the Ray executor (`num_workers`, `max_retries`,
    `cpus_per_unit`, `init_options`); the local executor takes none."""
    if kind not in EXECUTOR_KINDS:
        raise ConfigError(f"executor must be one of {', '.join(EXECUTOR_KINDS)}; got {kind!r}")
    if kind == "local":
        if ray_address is not None:
            raise ConfigError(f"ray_address {ray_address!r} needs the ray executor (--executor ray)")
        if options:
            raise ConfigError(f"the local executor takes no options; got {', '.join(sorted(options))}")
        return LocalExecutor()
    check_ray_address(ray_address)
    from ctrlsim.experiments._ray_executor import RayExecutor

    return RayExecutor(ray_address, **options)


def executor_from_options(run_options, **options) -> Executor:
    """The executor a runner's `RunOptions` (`executor`, `ray_address`) asks for."""
    return make_executor(run_options.executor, run_options.ray_address, **options)
