"""The Ray executor: units of work as Ray tasks (Ray core only; RLlib is not used).

Each unit is one Ray task running `executor.run_unit`, so an exception inside the unit
comes back as a failure record (never as a Ray error), while a worker process that dies
mid-unit is a *system* failure that Ray retries on a live worker (`max_retries`). Tasks
run in long-lived Ray worker processes, so `worker_cache` keeps each model loaded across
the units a worker runs. The run's config goes into the object store once, not once per
unit. Results are collected with `ray.wait` and handed to `on_record` on the driver as they
finish; the number of units in flight is bounded, so a run of many thousand units does not
queue them all at once.
"""
from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from typing import Iterable

from tqdm import tqdm

from ctrlsim.errors import ConfigError, ExecutorError, MissingDependencyError
from ctrlsim.experiments.units import (
    OnRecord,
    RunSummary,
    UnitFn,
    driver_environment,
    failure_record,
    is_failure,
    run_unit,
    unique_keys,
)

logger = logging.getLogger(__name__)


def import_ray():
    """The `ray` module, or a MissingDependencyError naming the `ray` extra."""
    try:
        with warnings.catch_warnings():
            # Ray 2.6 imports pkg_resources, which setuptools deprecates at import time.
            warnings.filterwarnings("ignore", message=".*pkg_resources.*")
            import ray
    except ImportError as exc:
        raise MissingDependencyError("ray", "ray", "the Ray executor (--executor ray)") from exc
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast when nothing listens at a cluster head's `host:port` (ray.init would retry for minutes)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ExecutorError(f"no Ray cluster head answers at {address!r} ({exc}); start one there with "
                            f"`ray start --head --port={port}` or pass --ray-address auto on a cluster node"
                            ) from exc


class RayExecutor:
    """Runs units as Ray tasks on a local or remote Ray cluster.

    address: `None` (reuse this process's Ray if `ray.init` ran already, otherwise start a
        private one here), `"auto"` (the cluster this machine joined with `ray start`), or
        `"host:port"` / `"ray://host:port"` of a cluster head.
    num_workers: at most this many units run at once. For a Ray this executor starts itself it
        is the Ray's CPU count (default: all cores); on an existing cluster it caps the units
        in flight (default: the cluster's CPUs divided by `cpus_per_unit`).
    max_retries: how often a unit is re-run after its worker process died.
    cpus_per_unit: CPUs Ray reserves per unit (raise it for units that load big models, so
        fewer run per node).
    init_options: extra keyword arguments for `ray.init` when this executor starts Ray.
    """

    kind = "ray"

    def __init__(self, address: str | None = None, *, num_workers: int | None = None, max_retries: int = 3,
                 cpus_per_unit: float = 1.0, init_options: dict | None = None):
        if num_workers is not None and (isinstance(num_workers, bool) or int(num_workers) != num_workers
                                        or num_workers < 1):
            raise ConfigError(f"num_workers must be a positive integer, got {num_workers!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        if not cpus_per_unit > 0:
            raise ConfigError(f"cpus_per_unit must be > 0, got {cpus_per_unit!r}")
        self.address = address
        self.num_workers = num_workers
        self.max_retries = max_retries
        self.cpus_per_unit = float(cpus_per_unit)
        self.init_options = dict(init_options or {})
        self._ray = import_ray()
        self._started_ray = False
        self._connect()
        # Workers see the driver's $CTRLSIM_* settings (cache folder, threads), not their node's.
        self._remote_unit = self._ray.remote(run_unit).options(
            num_cpus=self.cpus_per_unit, max_retries=self.max_retries, retry_exceptions=False,
            runtime_env={"env_vars": driver_environment()})

    # ---------------------------------------------------------------- cluster
    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        if self.address not in (None, "auto") and not self.address.startswith("ray://"):
            check_reachable(self.address)
        options = {"include_dashboard": False, "logging_level": logging.WARNING, **self.init_options}
        if self.address is None:
            options.setdefault("num_cpus", self.num_workers or os.cpu_count() or 1)
        try:
            ray.init(address=self.address, **options)
        except ConnectionError as exc:
            hint = ("start one with `ray start --head`" if self.address == "auto"
                    else "check the head's address and that `ray start --head` runs there")
            raise ExecutorError(f"no Ray cluster at {self.address!r} ({hint}): {exc}") from exc
        self._started_ray = True

    def cluster_cpus(self) -> float:
        return float(self._ray.cluster_resources().get("CPU", 0.0))

    def max_in_flight(self) -> int:
        """How many units are submitted at once (Ray's CPU accounting decides how many run)."""
        slots = max(1, int(self.cluster_cpus() // self.cpus_per_unit))
        if self._started_ray:
            # Ray's own CPU limit caps concurrency; one extra unit per slot keeps workers busy
            # while the driver records a finished one.
            return 2 * slots
        return min(slots, self.num_workers) if self.num_workers else 2 * slots

    # -------------------------------------------------------------------- run
    def run(self, unit_fn: UnitFn, config, keys: Iterable[str], on_record: OnRecord, *,
            progress: bool = True, desc: str = "units") -> RunSummary:
        ray = self._ray
        keys = unique_keys(keys)
        started, failed = time.perf_counter(), 0
        config_ref = ray.put(config)
        todo = iter(keys)
        pending: dict = {}  # ObjectRef -> key
        limit = self.max_in_flight()

        def submit_next() -> None:
            key = next(todo, None)
            if key is not None:
                pending[self._remote_unit.remote(unit_fn, config_ref, key)] = key

        for _ in range(limit):
            submit_next()
        bar = tqdm(total=len(keys), desc=desc, disable=not progress)
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    key = pending.pop(ref)
                    record = self._result(ref, key)
                    failed += is_failure(record)
                    on_record(key, record)
                    bar.update(1)
                    submit_next()
        finally:
            bar.close()
            for ref in pending:  # interrupted: stop what is still queued or running
                ray.cancel(ref, force=True)
        return RunSummary(len(keys), failed, time.perf_counter() - started)

    def _result(self, ref, key: str) -> dict:
        errors = self._ray.exceptions
        # Failures of this one unit: its worker died more often than max_retries allows (killed,
        # out of memory, its node lost), or it raised something run_unit does not catch
        # (SystemExit). Anything else (e.g. a worker that cannot import the unit's module)
        # would fail every unit alike, so it stops the run instead of filling it with failures.
        unit_failures = tuple(getattr(errors, name) for name in
                              ("WorkerCrashedError", "OutOfMemoryError", "NodeDiedError", "ObjectLostError",
                               "RayTaskError") if hasattr(errors, name))
        try:
            return self._ray.get(ref)
        except unit_failures as exc:
            from ctrlsim.redact import redact_secrets

            logger.warning("unit %r failed on Ray after %d retries: %s", key, self.max_retries,
                           redact_secrets(str(exc)))
            return failure_record(exc)
        except errors.RayError as exc:
            raise ExecutorError(f"Ray could not run unit {key!r}: {exc}\nEvery worker needs ctrlsim and the "
                                f"module defining the unit function installed (pip install \"ctrlsim[all]\")"
                                ) from exc

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Shut down the Ray this executor started (a Ray started elsewhere keeps running)."""
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()
        self._started_ray = False

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"RayExecutor(address={self.address!r}, num_workers={self.num_workers}, "
                f"max_retries={self.max_retries}, cpus_per_unit={self.cpus_per_unit})")
