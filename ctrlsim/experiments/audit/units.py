"""The audit's units: its sub-runs, each a protocol run through the driver into its own folder."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ctrlsim.errors import CtrlsimError
from ctrlsim.experiments.audit.config import (
    AUDIT_FILE,
    DEFAULT_OUT,
    AuditConfig,
    SubRun,
    plan_subruns,
    subrun_config,
)
from ctrlsim.experiments.audit.folder import AuditFolder
from ctrlsim.experiments.audit.report import write_report
from ctrlsim.experiments.config import RunOptions


class AuditFailedError(CtrlsimError, RuntimeError):
    """A sub-run of an audit had failed units: nothing was reported (a rerun retries them)."""

    def __init__(self, subrun: str, message: str):
        self.subrun = subrun
        super().__init__(f"audit sub-run {subrun} did not finish; no report was written.\n{message}")


@dataclass
class SubRunResult:
    """A finished sub-run: its plan, its driver result and what it cost in this process."""

    subrun: SubRun
    result: Any  # driver.RunResult
    wall_s: float
    cpu_s: float


def _cpu_seconds() -> float:
    import os

    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_audit(config: AuditConfig, options: RunOptions | None = None, *, show_progress: bool = True,
              resources: dict | None = None) -> dict:
    """Run (or resume) every sub-run of `config`, then write summary.json and report.html.

    Returns the summary. Raises `AuditFailedError` when a sub-run has failed units (no report)."""
    from ctrlsim.experiments.driver import drive, failure_summary
    from ctrlsim.experiments.runner import get_runner

    options = options or RunOptions()
    out = Path(options.out or DEFAULT_OUT)
    subruns = plan_subruns(config)
    typed = [(s, subrun_config(s)) for s in subruns]  # every value is checked before anything runs
    with AuditFolder(out, overwrite=options.overwrite) as folder:
        if folder.previous is not None and show_progress:
            print(f"--overwrite: the previous contents of {out} are now in {folder.previous}",
                  file=sys.stderr)
        sub_outs = {s.name: folder.file(s.name) for s, _ in typed}  # a sub-run folder that is a link: refused
        folder.remove_report()  # never leave a report beside sub-runs that may now fail
        folder.write_json(AUDIT_FILE, audit_identity(config, typed))
        started, cpu0 = time.perf_counter(), _cpu_seconds()
        done: list[SubRunResult] = []
        try:
            for subrun, sub_config in typed:
                sub_out = sub_outs[subrun.name]
                if show_progress:
                    print(f"audit: {subrun.name} ({subrun.protocol}) -> {sub_out}", file=sys.stderr)
                t0, c0 = time.perf_counter(), _cpu_seconds()
                result = drive(get_runner(subrun.protocol), sub_config, replace(options, out=str(sub_out)),
                               show_progress=show_progress, resources=resources)
                done.append(SubRunResult(subrun, result, time.perf_counter() - t0, _cpu_seconds() - c0))
                if result.failed:
                    raise AuditFailedError(subrun.name, failure_summary(result))
        finally:  # every invocation's cost is kept, a failed or interrupted one too: a resume costs less
            cost = {"wall_s": time.perf_counter() - started, "cpu_s": _cpu_seconds() - cpu0,
                    "units_ran": sum(d.result.ran for d in done), "finished": len(done) == len(typed)}
            folder.append_cost({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **cost})
        return write_report(config, done, folder, {**cost, "history": folder.read_costs()})


def audit_identity(config: AuditConfig, typed: Sequence[tuple[SubRun, Any]]) -> dict:
    """What identifies an audit (audit.json): its settings and every sub-run's typed config."""
    from ctrlsim.experiments.config import config_to_dict

    return {"boxes": list(config.boxes), "size": config.size, "llm": config.llm, "dataset": config.dataset,
            "slate_size": config.slate_size,
            "subruns": {s.name: {"protocol": s.protocol, "config": config_to_dict(c)} for s, c in typed}}
