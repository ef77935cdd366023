"""The audit's "Do the buttons work?" and "Declared controls" sections (issue 48).

Numbers come from the sub-runs' own summaries (`RunResult.summary`): the `responsiveness` sub-run
(ctrlbench `--task responsiveness`, `ctrlbench.responsiveness.run_summary`) and the `controls`
sub-run (`ctrlsim controls`, `controls.report.summary`). This module adds the plain reading and
the summary-screen lines; pure functions of results and the summary (no I/O).
"""
from __future__ import annotations

from typing import Any, Mapping

RESPONSIVENESS, CONTROLS = "responsiveness", "controls"
ACTION_WORDS = {"not_interested": '"not interested"', "dislike": "a dislike",
                "block": "blocking the item's first tag"}


def _pct(e: Mapping[str, Any] | None) -> str:
    if not e or e.get("value") is None:
        return "n/a"
    bounds = "" if e.get("low") is None else f" [{100 * e['low']:.0f}, {100 * e['high']:.0f}]"
    return f"{100 * e['value']:.0f}%{bounds}"


def responsiveness_section(result) -> dict:
    """The sub-run's numbers with one plain sentence per box, method and action."""
    section = dict(result.summary)
    lines = []
    for box, per_method in section.get("cells", {}).items():
        for method, cell in per_method.items():
            for action, a in cell["actions"].items():
                if not a["skip"]:
                    lines.append(f"{box}, {ACTION_WORDS[action]} ({method} probes): the box would have shown "
                                 "nothing similar anyway, so nothing can be read")
                    continue
                lines.append(f"{box}, {ACTION_WORDS[action]} ({method} probes, {a['items']} items "
                             f"dismissed): {a['skip']} similar items in the next {section['horizon']} rounds "
                             f"without it, {a['feedback']} with it: responsiveness "
                             f"{_pct(a['responsiveness'])} (live: {a['live']})")
    section["reading"] = lines
    return section


def controls_section(result) -> dict:
    """The controls sub-run's verdicts per box, with one line per verdict."""
    section = dict(result.summary)
    lines = []
    for box, found in section.get("boxes", {}).items():
        if not found["controls"] and not found["non_profiled"]:
            lines.append(f"{box} declares no user-settable control and no non-profiled mode: nothing to "
                         "check (DSA Art. 27 and 38 ask platforms to offer them)")
        for c in found["controls"]:
            rho = c["rho"]
            rho_text = "the property never moved" if rho["value"] is None else \
                f"Spearman rho {rho['value']:+.2f}" + ("" if rho["low"] is None else
                                                       f" [{rho['low']:+.2f}, {rho['high']:+.2f}]")
            lines.append(f"{box}: control '{c['control']}' claims \"{c['claim']}\" ({c['property']} "
                         f"{c['direction']}): {c['verdict']}, {rho_text} ({c['article']})")
        np_ = found["non_profiled"]
        if np_:
            lines.append(f"{box}: non-profiled mode {np_['settings']}: {np_['verdict']} ({np_['article']})")
    section["reading"] = lines
    return section


def button_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary screen's lines: each box's responsiveness per action, and each declared verdict."""
    lines = []
    rs = (summary["subruns"].get(RESPONSIVENESS) or {}).get("numbers") or {}
    for box, per_method in rs.get("cells", {}).items():
        for method, cell in per_method.items():
            parts = [f"{action} {_pct(a['responsiveness'])}" for action, a in cell["actions"].items()]
            lines.append(f"Do the buttons work on {box}? Similar items prevented ({method} probes): "
                         + "; ".join(parts) + ".")
    cs = (summary["subruns"].get(CONTROLS) or {}).get("numbers") or {}
    for box, found in cs.get("boxes", {}).items():
        verdicts = [f"{c['control']} {c['verdict']}" for c in found["controls"]]
        if found["non_profiled"]:
            verdicts.append(f"non-profiled mode {found['non_profiled']['verdict']}")
        if verdicts:
            lines.append(f"Declared controls of {box} (DSA Art. 27, 38): " + "; ".join(verdicts) + ".")
    return lines
