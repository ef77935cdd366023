"""`ctrlsim audit BOX [--compare BOX2 ...]`: every protocol that applies to a box, one report card.

The audit runs its sub-runs (`audit_config.plan_subruns`) one after the other through the driver,
each into its own run folder under the audit folder (`<out>/ctrlbench`, `<out>/calibrate-ctrlbench`,
...), so a rerun resumes every one of them and `--executor ray` scales them out. Only when every
sub-run finished every unit does it write `<out>/summary.json` (every number of the report) and
`<out>/report.html` (one self-contained page). A sub-run with failed units stops the audit: the
failures are listed, the exit status is 1, and no report is written; a report left by an earlier
audit in the folder is removed first, so a folder never holds a report of a run that failed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ctrlsim.errors import CtrlsimError
from ctrlsim.experiments.audit_config import SIZES, AuditConfig, SubRun, parse_overrides, plan_subruns
from ctrlsim.experiments.config import RunOptions

REPORT, SUMMARY, AUDIT_FILE, COST_FILE = "report.html", "summary.json", "audit.json", "cost.jsonl"
DEFAULT_OUT = "results/audit"


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
    from ctrlsim.experiments.audit_config import subrun_config
    from ctrlsim.experiments.driver import drive, failure_summary
    from ctrlsim.experiments.runner import get_runner

    options = options or RunOptions()
    out = Path(options.out or DEFAULT_OUT)
    subruns = plan_subruns(config)
    typed = [(s, subrun_config(s)) for s in subruns]  # every value is checked before anything runs
    out.mkdir(parents=True, exist_ok=True)
    for name in (REPORT, SUMMARY):  # never leave a report beside sub-runs that may now fail
        (out / name).unlink(missing_ok=True)
    (out / AUDIT_FILE).write_text(json.dumps(audit_identity(config, typed), indent=2) + "\n")
    started, cpu0 = time.perf_counter(), _cpu_seconds()
    done: list[SubRunResult] = []
    try:
        for subrun, sub_config in typed:
            if show_progress:
                print(f"audit: {subrun.name} ({subrun.protocol}) -> {out / subrun.name}", file=sys.stderr)
            t0, c0 = time.perf_counter(), _cpu_seconds()
            result = drive(get_runner(subrun.protocol), sub_config,
                           replace(options, out=str(out / subrun.name)), show_progress=show_progress,
                           resources=resources)
            done.append(SubRunResult(subrun, result, time.perf_counter() - t0, _cpu_seconds() - c0))
            if result.failed:
                raise AuditFailedError(subrun.name, failure_summary(result))
    finally:  # every invocation's cost is kept, a failed or interrupted one too: a resume costs less
        cost = {"wall_s": time.perf_counter() - started, "cpu_s": _cpu_seconds() - cpu0,
                "units_ran": sum(d.result.ran for d in done), "finished": len(done) == len(typed)}
        with (out / COST_FILE).open("a", encoding="utf-8") as log:
            log.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **cost}) + "\n")
    return write_report(config, done, out, {**cost, "history": read_costs(out)})


def read_costs(out: Path) -> list[dict]:
    """Every invocation's cost in this audit folder (`cost.jsonl`), oldest first."""
    path = out / COST_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def audit_identity(config: AuditConfig, typed: Sequence[tuple[SubRun, Any]]) -> dict:
    """What identifies an audit (audit.json): its settings and every sub-run's typed config."""
    from ctrlsim.experiments.config import config_to_dict

    return {"boxes": list(config.boxes), "size": config.size, "llm": config.llm, "dataset": config.dataset,
            "slate_size": config.slate_size,
            "subruns": {s.name: {"protocol": s.protocol, "config": config_to_dict(c)} for s, c in typed}}


def write_report(config: AuditConfig, done: Sequence[SubRunResult], out: Path, cost: dict) -> dict:
    """summary.json first (the numbers), then report.html rendered from it and its figures."""
    from ctrlsim.experiments.audit_figures import render_figures
    from ctrlsim.experiments.audit_render import render_report
    from ctrlsim.experiments.audit_summary import build_summary

    summary = build_summary(config, done, out, cost)
    figures = render_figures(summary)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n")
    (out / REPORT).write_text(render_report(summary, figures), encoding="utf-8")
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctrlsim audit", description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Sub-runs: ctrlbench, calibrate-ctrlbench (any box); steereval, calibrate-steereval "
               "(embedding, llm:SPEC); promptshift, calibrate-promptshift (llm:SPEC). docs/audit.md.")
    parser.add_argument("box", help="any make_recommender name (popularity, narm, dial:0.5, "
                                    "http://host:8000, ...), or llm:SPEC for an LLM list generator")
    parser.add_argument("--compare", nargs="+", default=[], metavar="BOX",
                        help="more boxes audited side by side, with paired comparisons against BOX")
    parser.add_argument("--size", choices=SIZES, default="small",
                        help="small (default; minutes on a 2-core CPU), medium, or paper (the papers' sizes)")
    parser.add_argument("--llm", default="qwen2.5-0.5b", help="the probes' LLM (a load_llm spec) "
                                                              "[default: qwen2.5-0.5b]")
    parser.add_argument("--dataset", default="ml-100k", help="dataset name or path [default: ml-100k]")
    parser.add_argument("--slate-size", type=int, default=3,
                        help="items per slate for every box (one scale for the placement) [default: 3]")
    parser.add_argument("--set", nargs=2, action="append", metavar=("SUBRUN", "FLAGS"), dest="overrides",
                        help="flags of a sub-run's runner, e.g. "
                             '--set ctrlbench "--rounds 6 --seeds 0,1,2,3"')
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"audit folder [default: {DEFAULT_OUT}]")
    parser.add_argument("--overwrite", action="store_true", help="move earlier sub-run folders aside")
    parser.add_argument("--executor", default="local", choices=["local", "ray"], help="where units run")
    parser.add_argument("--ray-address", default=None, help="Ray cluster address (with --executor ray)")
    parser.add_argument("--replay", default=None, help="answer HTTP boxes from an earlier run's exchanges")
    parser.add_argument("--allow-code-change", action="store_true",
                        help="resume sub-runs written by other ctrlsim code")
    return parser


def audit_main(argv: Sequence[str] | None = None) -> int:
    """`ctrlsim audit ...`: exit 0 with a report, 1 when a sub-run failed (no report), 2 for a bad value."""
    args = build_parser().parse_args(argv)
    config = AuditConfig(boxes=(args.box, *args.compare), size=args.size, llm=args.llm, dataset=args.dataset,
                         slate_size=args.slate_size, overrides=parse_overrides(args.overrides))
    options = RunOptions(out=args.out, overwrite=args.overwrite, executor=args.executor,
                         ray_address=args.ray_address, replay=args.replay,
                         allow_code_change=args.allow_code_change)
    try:
        summary = run_audit(config, options)
    except AuditFailedError as exc:
        from ctrlsim.redact import redact_secrets

        print(f"ctrlsim audit: {redact_secrets(str(exc))}", file=sys.stderr)
        return 1
    for line in summary["headline_text"]:
        print(line)
    cost = summary["cost"]
    print(f"\nreport: {Path(args.out) / REPORT} (numbers: {Path(args.out) / SUMMARY}; this run "
          f"{cost['wall_s']:.0f} s wall, {cost['cpu_s']:.0f} s CPU; the audit in all "
          f"{cost['total_wall_s']:.0f} s wall, {cost['total_cpu_s']:.0f} s CPU)", file=sys.stderr)
    return 0
