"""What a run's units cost, measured, and what the units still to run will cost, estimated.

The driver times each stored unit (wall seconds from the previous record's arrival, or from the
wave's start: a unit's share of the run as the executor ran it, model loading included in the
first; and the process's CPU seconds over the same span where the units run in this process) and
appends it to the run folder's `unit-seconds.jsonl`. When a run ends it adds one line
to `$CTRLSIM_CACHE/unit-seconds.jsonl`: the runner, a signature of its config without the fields
that only add units (seeds, methods, boxes), and the median seconds per unit. Before any model
loads, the driver prints the planned units and an estimate of their cost from (first found)

1. this folder's own measured units (a resumed or extended run),
2. earlier runs of the same runner and signature on this machine (the cache's log),

or says that no unit of such a run was measured yet. Nothing here changes a record: costs are
measurements of the machine, kept apart from results.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

FOLDER_LOG = "unit-seconds.jsonl"
CACHE_LOG = "unit-seconds.jsonl"


@dataclass(frozen=True)
class CostEstimate:
    """Seconds per unit (median of `measured` units) and where the figure comes from."""

    seconds_per_unit: float | None
    measured: int
    source: str

    def total(self, units: int) -> float | None:
        return None if self.seconds_per_unit is None else self.seconds_per_unit * units


def signature(identity: Mapping, extensible: Iterable[str]) -> str:
    """A digest of a config without its extensible fields: runs that differ only in how many seeds,
    methods or boxes they hold have units of the same kind."""
    kept = {k: v for k, v in identity.items() if k not in set(extensible)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read_lines(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash: the others still count
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class UnitClock:
    """Wall and CPU seconds since the previous record arrived (or the wave started). CPU time is
    this process's, every thread counted (llama.cpp's included): a unit's only where the executor
    runs units in this process; elsewhere (Ray workers) it is None."""

    def __init__(self) -> None:
        self.in_process = True
        self.restart()

    def restart(self, in_process: bool | None = None) -> None:
        if in_process is not None:
            self.in_process = in_process
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float | None]:
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        self.restart()
        return wall, (cpu if self.in_process else None)


def folder_units(folder: Path, finished: Iterable[str]) -> dict[str, dict]:
    """The measured lines of a run folder's finished units (unit key -> {"seconds"[, "cpu_seconds"]});
    the last line of a key wins (a unit rerun after its record was lost)."""
    keep = set(finished)
    return {row["key"]: row for row in _read_lines(folder / FOLDER_LOG)
            if row.get("key") in keep and isinstance(row.get("seconds"), (int, float))}


def folder_seconds(folder: Path, finished: Iterable[str]) -> dict[str, float]:
    """Measured seconds of the finished units of a run folder (unit key -> seconds)."""
    return {key: float(row["seconds"]) for key, row in folder_units(folder, finished).items()}


def record_unit(folder: Path, key: str, seconds: float, cpu_seconds: float | None = None) -> None:
    """One line in the folder's log, through the guarded appender (`ctrlsim.jsonlines`: no link
    followed, a torn last line moved aside); unsynced, as a lost line costs an estimate only."""
    from ctrlsim.jsonlines import append_object

    row: dict = {"key": key, "seconds": round(seconds, 3)}
    if cpu_seconds is not None:
        row["cpu_seconds"] = round(cpu_seconds, 3)
    append_object(folder / FOLDER_LOG, row, sync=False)


def _cache_root() -> Path | None:
    from ctrlsim.backends.bundled import cache_root

    try:
        return cache_root()
    except (OSError, RuntimeError):  # no home folder to default to
        return None


def record_run(runner: str, sig: str, seconds: Iterable[float]) -> None:
    """One line in the machine's log: this run's median seconds per unit (nothing when none ran).
    Only into a cache folder that exists and is writable: a run that keeps nothing in the cache
    never creates it, and a lost line costs an estimate, never a result."""
    import os

    values = list(seconds)
    root = _cache_root()
    if not values or root is None or not root.is_dir() or not os.access(root, os.W_OK):
        return
    row = {"runner": runner, "signature": sig, "seconds_per_unit": round(statistics.median(values), 3),
           "units": len(values), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    from ctrlsim.errors import DataFileError
    from ctrlsim.jsonlines import append_object

    try:
        append_object(root / CACHE_LOG, row, sync=False)
    except DataFileError:  # unwritable, or a link where the log belongs: nothing written through it
        return


def estimate(runner: str, sig: str, folder: Path | None, finished: Iterable[str]) -> CostEstimate:
    """Seconds per unit from this folder's measured units, else from the machine's log."""
    if folder is not None:
        own = folder_seconds(folder, finished)
        if own:
            return CostEstimate(statistics.median(own.values()), len(own), "this folder's finished units")
    root = _cache_root()
    rows = [] if root is None else [r for r in _read_lines(root / CACHE_LOG)
                                    if r.get("runner") == runner and r.get("signature") == sig]
    if rows:
        per_unit = [float(r["seconds_per_unit"]) for r in rows[-5:]]
        units = sum(int(r.get("units", 0)) for r in rows[-5:])
        return CostEstimate(statistics.median(per_unit), units, "earlier runs of this config on this machine")
    return CostEstimate(None, 0, "no unit of such a run was measured on this machine yet")


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plan_line(runner: str, unit_name: str, planned: int, finished: int, est: CostEstimate) -> str:
    """The line a run prints before any model loads: its units and what they will cost."""
    todo = planned - finished
    head = f"{runner}: {planned} {unit_name} planned, {finished} finished, {todo} to run"
    if todo == 0:
        return head
    if est.seconds_per_unit is None:
        return f"{head}; cost unknown ({est.source})"
    return (f"{head}; estimated {format_duration(est.total(todo) or 0.0)} "
            f"({est.seconds_per_unit:.1f} s per unit, median of {est.measured} measured: {est.source})")
