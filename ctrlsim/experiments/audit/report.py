"""The audit's report: summary.json (every number), then report.html rendered from it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ctrlsim.experiments.audit.config import COST_FILE, REPORT, SUMMARY, AuditConfig


def read_costs(out: Path) -> list[dict]:
    """Every invocation's cost in this audit folder (`cost.jsonl`), oldest first."""
    path = out / COST_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_report(config: AuditConfig, done: Sequence, out: Path, cost: dict) -> dict:
    """summary.json first (the numbers), then report.html rendered from it and its figures."""
    from ctrlsim.experiments.audit.figures import render_figures
    from ctrlsim.experiments.audit.render import render_report
    from ctrlsim.experiments.audit.summary import build_summary

    summary = build_summary(config, done, out, cost)
    figures = render_figures(summary)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n")
    (out / REPORT).write_text(render_report(summary, figures), encoding="utf-8")
    return summary
