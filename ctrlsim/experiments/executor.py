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
  one run inside a long-lived worker. A runner's units do not call it themselves: the driver
  runs each ``unit_fn(payload, unit)`` through ``context.call_unit``, and the unit's
  ``UnitContext`` fetches datasets, boxes, LLMs and encoders from this cache under one key
  format per kind.
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

import re
import time
from typing import Iterable

from tqdm import tqdm

from ctrlsim.errors import ConfigError

# The shared unit-of-work pieces, re-exported: runners and tests import them from here.
from ctrlsim.experiments.units import (  # noqa: F401
    ERROR_MESSAGE_LIMIT,
    Executor,
    OnRecord,
    RunSummary,
    UnitFn,
    cached_names,
    clear_worker_cache,
    failure_record,
    is_failure,
    run_unit,
    unique_keys,
    worker_cache,
)

EXECUTOR_KINDS = ("local", "ray")

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
