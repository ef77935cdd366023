"""The audit's report: summary.json (every number), then report.html rendered from it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ctrlsim.experiments.audit.config import REPORT, SUMMARY, AuditConfig

if TYPE_CHECKING:
    from ctrlsim.experiments.audit.folder import AuditFolder


def write_report(config: AuditConfig, done: Sequence, folder: AuditFolder, cost: dict) -> dict:
    """summary.json first (the numbers), then report.html rendered from it and its figures; both
    through the audit folder's guarded writers (atomic, never through a link)."""
    from ctrlsim.experiments.audit.figures import render_figures
    from ctrlsim.experiments.audit.render import render_report
    from ctrlsim.experiments.audit.summary import build_summary

    summary = build_summary(config, done, folder.path, cost)
    figures = render_figures(summary)
    folder.write_json(SUMMARY, summary)
    folder.write_text(REPORT, render_report(summary, figures))
    return summary
