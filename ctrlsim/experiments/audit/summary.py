"""The numbers of an audit (`summary.json`): computed from the sub-runs' finished records only.

Every statistic reuses the runners' own helpers (`ctrlsim.metrics.stats`: Student t intervals,
the pooled ratio interval, paired Wilcoxon comparisons; `calibrate.report`: the dial curves, the
resolution and the placement of a box on the lambda scale), so the report says what the runners'
tables say. Figures are drawn from this summary alone (`audit.figures`), so every number a figure
shows is in `summary.json`.
"""
from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctrlsim.backends.bundled import BUNDLED_LLMS
from ctrlsim.experiments.audit.buttons import (
    CONTROLS,
    RESPONSIVENESS,
    button_lines,
    controls_section,
    responsiveness_section,
)
from ctrlsim.experiments.audit.config import AuditConfig, is_llm_box
from ctrlsim.experiments.audit.persistence import (
    persistence_caveats,
    persistence_headline,
    persistence_section,
)
from ctrlsim.experiments.audit.words import caveats, headline, headline_lines, placement_words
from ctrlsim.experiments.usage import total_tokens
from ctrlsim.metrics.bounded import share_ci
from ctrlsim.metrics.stats import Estimate, mean_ci, paired_comparison, ratio_ci

SMALL_LLMS = tuple(BUNDLED_LLMS)  # every bundled model has 1.5B parameters or fewer


def est(e: Estimate, scale: float = 1.0) -> dict:
    """An estimate as JSON: value, 95% interval, n (undefined parts are null)."""
    return e.to_dict(scale)


def clean(value: Any) -> Any:
    """NaN and infinities become null (summary.json is strict JSON)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def subrun_tables(report: Sequence) -> list[dict]:
    """A sub-run's tables (its report as data, `RunResult.report`) as [{title, header, rows}] of
    cell text, the tables that have rows."""
    from ctrlsim.experiments.tables import Table

    return [{"title": t.title, "header": t.header, "rows": [[_cell(v) for v in row] for row in t.rows]}
            for t in report if isinstance(t, Table) and len(t.frame)]


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _provenance(folder: Path) -> dict:
    """The sub-run's last provenance entry (a torn last line, from a kill, is skipped)."""
    from ctrlsim.experiments.provenance import PROVENANCE, read_entries

    entries = read_entries(folder / PROVENANCE)
    return entries[-1] if entries else {}


# ----------------------------------------------------------------------------- ctrlbench

def ctrlbench_section(result, config: AuditConfig) -> dict:
    records = result.records_by_key
    rounds = int(result.config["rounds"])
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records.values():
        cells[(record["recommender"], record["method"])].append(record)
    coverage: dict[str, dict] = {}
    by_round: dict[str, dict] = {}
    efficiency: dict[str, dict] = {}
    popularity: dict[str, dict] = {}
    accuracy: dict[str, dict] = {}
    cost: dict[str, dict] = {}
    for (box, method), recs in sorted(cells.items()):
        recs = sorted(recs, key=lambda r: (r["target"], r["seed"]))
        # Coverage is a share: its bootstrap interval stays in [0, 100]% (docs/statistics.md)
        coverage.setdefault(box, {})[method] = est(share_ci([r["curves"]["coverage"][-1] for r in recs]), 100)
        by_round.setdefault(box, {})[method] = [est(share_ci([r["curves"]["coverage"][t] for r in recs]), 100)
                                                for t in range(rounds)]
        efficiency.setdefault(box, {})[method] = est(ratio_ci(
            [r["efficiency_counts"]["target_likes"][-1] for r in recs],
            [r["efficiency_counts"]["found"][-1] for r in recs]))
        popularity.setdefault(box, {})[method] = {
            "interaction": est(mean_ci([r["popularity_curves"]["interaction_popularity"] for r in recs])),
            "catalogue": recs[0]["popularity_curves"]["catalogue_popularity"]}
        if "profile_curves" in recs[0]:
            accuracy.setdefault(box, {})[method] = {
                "t0": est(mean_ci([r["profile_curves"]["accuracy"][0] for r in recs])),
                "t": est(mean_ci([r["profile_curves"]["accuracy"][-1] for r in recs]))}
        probes = sum(len(r["probes"]) for r in recs)
        cost.setdefault(box, {})[method] = {
            "episodes": len(recs), "probes": probes,
            "tokens": total_tokens(recs).total,
            "decisions": sum(int(r["decisions"] or 0) for r in recs),
            "parse_failures": sum(int(r["parse_failures"] or 0) for r in recs),
            "template_fallbacks": sum(int(r["template_fallbacks"] or 0) for r in recs),
            "dropped_probes": sum(len(r["dropped"] or {}) for r in recs),
            "search_likes": sum(int(r["search_likes"] or 0) for r in recs),
            "seconds": round(sum(float(r["timing"]["seconds"]) for r in recs), 2)}
    from ctrlsim.experiments import validity_card as VC

    validity = {m: c.to_dict() for m, c in VC.cards(records.values()).items()}
    return {"pass_k": pass_k_section(result), "rounds": rounds, "seeds": list(result.config["seeds"]),
            "validity": validity,
            "targets": list(result.config["targets"]),
            "agents": list(result.config["agents"]), "allow_search": bool(result.config["allow_search"]),
            "methods": list(result.config["methods"]), "boxes": list(result.config["recommenders"]),
            "coverage": coverage, "coverage_by_round": by_round, "efficiency": efficiency,
            "popularity": popularity, "profile_accuracy": accuracy, "cost": cost,
            "box_comparison": box_comparison(cells, config)}


def pass_k_section(result) -> dict:
    """Per box and method, ctrlbench's pass^k of control (its success rule and threshold: Coverage
    at the last round): pass^k for k = 1..n with bootstrap bounds over targets, and the cliff."""
    from ctrlsim.metrics.passk import pass_k_curve, success_flags

    threshold = result.context.config.success_threshold
    tries = ((((r["recommender"], r["method"]), r["target"]), r["seed"],
              r["curves"]["coverage"][-1] if r["curves"]["coverage"] else 0.0)
             for r in result.records_by_key.values())
    flags = success_flags(tries, threshold)
    cells: dict[tuple[str, str], dict[str, list[bool]]] = defaultdict(dict)
    for (cell, target), seen in flags.items():
        cells[cell][target] = seen
    out: dict[str, dict] = {}
    for (box, method), tasks in sorted(cells.items()):
        curve = pass_k_curve(tasks)
        out.setdefault(box, {})[method] = {
            "threshold": threshold, "tasks": curve.tasks, "tries": curve.trials,
            "values": {str(k): v for k, v in curve.values.items()},
            "low": {str(k): v for k, v in curve.low.items()},
            "high": {str(k): v for k, v in curve.high.items()},
            "cliff": curve.cliff}
    return out


def box_comparison(cells: Mapping[tuple[str, str], list[dict]], config: AuditConfig) -> list[dict]:
    """Each compared box against the first, per method: paired over the same (target, seed)."""
    primary, rows = config.primary, []
    for box in config.boxes[1:]:
        for (b, method), recs in sorted(cells.items()):
            if b != box or (primary, method) not in cells:
                continue
            ref = {(r["target"], r["seed"]): r["curves"]["coverage"][-1] for r in cells[(primary, method)]}
            mine = {(r["target"], r["seed"]): r["curves"]["coverage"][-1] for r in recs}
            keys = sorted(set(ref) & set(mine))
            comp = paired_comparison([mine[k] * 100 for k in keys], [ref[k] * 100 for k in keys])
            rows.append({"protocol": "ctrlbench", "metric": "Coverage (%)", "box": box, "reference": primary,
                         "method": method, "difference": est(comp.difference), "p_wilcoxon": comp.p_wilcoxon,
                         "n": comp.n, "wins": comp.wins, "losses": comp.losses,
                         "mde": None if comp.n < 2 else comp.mde})
    return rows


# ----------------------------------------------------------------------------- calibration

def shown_box(name: str, boxes: Sequence[str]) -> str:
    """The audited box a sub-run's box name stands for (calibrate compares `llm` or an LLM spec)."""
    if name in boxes:
        return name
    llm_boxes = [b for b in boxes if is_llm_box(b)]
    if f"llm:{name}" in boxes:
        return f"llm:{name}"
    return llm_boxes[0] if name in ("llm", "default") and llm_boxes else name


def calibration_section(result, boxes: Sequence[str] = ()) -> dict:
    """The calibration's own numbers (`RunResult.summary`, from its report as data), with each
    placement named by the audited box it stands for and said in words."""
    section = dict(result.summary)
    placement: dict[str, dict] = defaultdict(dict)
    for box, by_method in section["placement"].items():
        shown = shown_box(box, boxes)
        for method, cell in by_method.items():
            words = placement_words(section["protocol"], shown, method, cell["text"], cell["lambda"],
                                    seeds=len(section.get("seeds") or ()) or None)
            placement[shown][method] = {**cell, "words": words}
    section["placement"] = dict(placement)
    return section


# ----------------------------------------------------------------------------- steereval

def steereval_section(result, boxes: Sequence[str] = ()) -> dict:
    from ctrlsim.metrics.stats import paired_t_test

    by_cond: dict[str, list[dict]] = defaultdict(list)
    for record in result.records_by_key.values():
        by_cond[record["condition"]].append(record)
    out: dict[str, dict] = {}
    for cond, recs in sorted(by_cond.items()):
        cell: dict[str, Any] = {"signed": est(mean_ci([r["reward"] for r in recs])), "scenarios": len(recs),
                                "edit_problems": sum(1 for r in recs if r.get("edit_problems")),
                                "tokens": total_tokens(recs).total}
        for direction, alternative in (("increase", "greater"), ("decrease", "less")):
            sub = [r for r in recs if r["direction"] == direction]
            test = paired_t_test([r["auc_after"] for r in sub], [r["auc_before"] for r in sub],
                                 alternative=alternative)
            cell[direction] = {"delta_auc": est(mean_ci([r["delta_auc"] for r in sub])), "p": test.p,
                               "n": len(sub)}
        cell["box"] = shown_box(cond, boxes)
        out[cond] = cell
    return {"conditions": out, "tags": sorted({r["tag"] for r in result.records_by_key.values()}),
            "users": len({r["user"] for r in result.records_by_key.values()})}


# ----------------------------------------------------------------------------- the whole audit

def subrun_entry(done, section: dict | None) -> dict:
    result = done.result
    prov = _provenance(Path(result.out))
    llms = sorted({json.dumps(r["llm"], sort_keys=True) for r in result.records_by_key.values()
                   if isinstance(r.get("llm"), dict)})
    return {"protocol": done.subrun.protocol, "folder": str(result.out), "config": result.config,
            "units": len(result.records_by_key), "ran_now": result.ran,
            "wall_s": round(done.wall_s, 2), "cpu_s": round(done.cpu_s, 2),
            "unit_seconds": round(sum(float((r.get("timing") or {}).get("seconds", 0.0))
                                      for r in result.records_by_key.values()), 2),
            "llms": [json.loads(x) for x in llms], "code": prov.get("code", {}),
            "inputs": prov.get("inputs", {}),
            "tables": subrun_tables(result.report), "numbers": section,
            "tokens": total_tokens(result.records_by_key.values()).total
            if done.subrun.protocol == "promptshift" else None}


def build_summary(config: AuditConfig, done: Sequence, out: Path, cost: dict) -> dict:
    import platform

    import ctrlsim
    from ctrlsim.backends.specs import available_cpus

    sections = ("ctrlbench", "steereval")
    subruns: dict[str, dict] = {}
    for item in done:
        name, protocol = item.subrun.name, item.subrun.protocol
        if protocol == "calibrate":
            section = calibration_section(item.result, config.boxes)
        elif name == "persistence":  # the runner's own numbers (`RunResult.summary`), read in words
            section = persistence_section(item.result)
        elif name == RESPONSIVENESS:
            section = responsiveness_section(item.result)
        elif name == CONTROLS:
            section = controls_section(item.result)
        elif name in sections:
            section = ctrlbench_section(item.result, config) if name == "ctrlbench" else \
                steereval_section(item.result, config.boxes)
        else:
            section = None
        subruns[name] = subrun_entry(item, section)
    summary: dict[str, Any] = {
        "audit": {"boxes": list(config.boxes), "primary": config.primary, "size": config.size,
                  "llm": config.llm, "dataset": config.dataset, "slate_size": config.slate_size,
                  "folder": str(out), "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                  "ctrlsim": ctrlsim.__version__, "python": platform.python_version(),
                  "machine": f"{platform.machine()}, {available_cpus()} CPU(s)",
                  "llm_boxes": [b for b in config.boxes if is_llm_box(b)]},
        "subruns": subruns,
        "cost": {"wall_s": round(cost["wall_s"], 2), "cpu_s": round(cost["cpu_s"], 2),
                 "total_wall_s": round(sum(c["wall_s"] for c in cost.get("history", [cost])), 2),
                 "total_cpu_s": round(sum(c["cpu_s"] for c in cost.get("history", [cost])), 2),
                 "invocations": cost.get("history", [cost]), "tokens": _tokens(subruns)},
    }
    summary["audit"]["llms_ran"] = sorted({m.get("model", "?") for e in subruns.values() for m in e["llms"]})
    summary["headline"] = headline(summary) + persistence_headline(summary)
    summary["headline_text"] = headline_lines(summary, summary["headline"]) + button_lines(summary)
    summary["caveats"] = caveats(summary, SMALL_LLMS) + persistence_caveats(summary)
    return clean(summary)


def _tokens(subruns: Mapping[str, dict]) -> dict:
    """Tokens the probes and the LLM rankers spent, per sub-run where its records count them."""
    out: dict[str, int] = {}
    cb = (subruns.get("ctrlbench") or {}).get("numbers")
    if cb:
        out["ctrlbench"] = sum(c["tokens"] for box in cb["cost"].values() for c in box.values())
    lasting = (subruns.get("persistence") or {}).get("numbers")
    if lasting:
        out["persistence"] = lasting["tokens"]
    se = (subruns.get("steereval") or {}).get("numbers")
    if se:
        out["steereval"] = sum(c["tokens"] for c in se["conditions"].values())
    ps = subruns.get("promptshift")
    if ps:
        out["promptshift"] = ps["tokens"]
    return out
