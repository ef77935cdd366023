"""How much a run's box comparison moves with the probe model: the analysis of `--llms` runs.

Input: one score frame per probe model (`ctrlsim.experiments.scores.score_frame` of runs that differ
only in the probe LLM), and the headline metric. Per method:

* a method whose every shared score is identical under every probe model (a scripted method such
  as oracle or random, or models that made the same choices) is reported apart: identical scores
  show no model effect by construction, so they are no evidence that a box comparison is robust;
* the others get a balanced box x probe model design: the boxes every model ran, the observations
  (targets x seeds, scenarios, users) every (box, model) cell holds, the rest counted and left out;
* per (box, model) the mean with its 95% interval (bounded bootstrap for a share, Student t else);
* with two boxes or more: the variance components (two-way random effects, observations as
  replicates), E rho^2 of the box ranking, Kendall's W across models and the flipped box pairs
  (`ctrlsim.metrics.generalizability`); with one box: paired comparisons between the models over
  the same observations (there is no box ranking to generalise).

docs/statistics.md ("Probe-model sensitivity: --llms") says how to read each number.
"""
from __future__ import annotations

import json
import math
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.tables import Block, Table, Text, render_markdown, tables_json

if TYPE_CHECKING:
    import pandas as pd

SENSITIVITY_MD, SENSITIVITY_JSON = "sensitivity.md", "sensitivity.json"
DOCS = "docs/statistics.md, \"Probe-model sensitivity: --llms\""
COMPONENTS = ("box", "probe model", "box x probe model", "residual")


def _json_safe(value: Any) -> Any:
    """NaN and infinities as null (sensitivity.json is strict JSON), tuples as lists."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else float(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _cells(frame: pd.DataFrame, method: str, metric: str) -> dict[str, dict[str, float]]:
    """box -> observation -> value of one method and metric in one model's frame."""
    rows = frame[(frame["method"] == method) & (frame["metric"] == metric)]
    doubled = rows[rows.duplicated(["box", "observation"], keep=False)]
    if len(doubled):
        first = doubled.iloc[0]
        raise ConfigError(f"score rows of {method} on {first['box']} repeat the observation "
                          f"{first['observation']!r}: a sensitivity analysis needs one value per observation")
    out: dict[str, dict[str, float]] = {}
    for box, obs, value in zip(rows["box"], rows["observation"], rows["value"]):
        out.setdefault(str(box), {})[str(obs)] = float(value)
    return out


def _estimate(values: Sequence[float], share: bool):
    from ctrlsim.metrics.bounded import share_ci
    from ctrlsim.metrics.stats import mean_ci

    return share_ci(list(values)) if share else mean_ci(list(values))


def depends_on_model(cells: Mapping[str, Mapping[str, Mapping[str, float]]]) -> bool | None:
    """Whether any score of a method differs between probe models, over the (box, observation)
    pairs every model holds (`cells[model][box][observation]`); None when no pair is shared."""
    models = list(cells)
    shared = set.intersection(*({(b, o) for b, obs in cells[m].items() for o in obs} for m in models))
    if not shared:
        return None
    return any(len({cells[m][b][o] for m in models}) > 1 for b, o in shared)


def balanced(cells: Mapping[str, Mapping[str, Mapping[str, float]]]) -> tuple[list[str], list[str], dict]:
    """(boxes every model ran, observations every (box, model) cell holds, how many each cell lost)."""
    models = list(cells)
    boxes = sorted(set.intersection(*(set(cells[m]) for m in models)))
    common = sorted(set.intersection(*(set(cells[m][b]) for m in models for b in boxes))) if boxes else []
    left_out: dict[str, dict[str, int]] = {}
    for m in models:
        lost = {b: len(set(obs) - set(common)) if b in boxes else len(obs) for b, obs in cells[m].items()}
        if any(lost.values()):
            left_out[m] = {b: n for b, n in lost.items() if n}
    return boxes, common, left_out


def flips(means: Mapping[str, Mapping[str, float]], models: Sequence[str]) -> list[dict]:
    """The box pairs (a, b) whose order under one model's means is the reverse of another's, with each
    model's order (a tie is no order)."""
    out = []
    for a, b in combinations(list(means), 2):
        signs = {m: (means[a][m] > means[b][m]) - (means[a][m] < means[b][m]) for m in models}
        if {-1, 1} <= set(signs.values()):
            out.append({"boxes": [a, b], "order": {m: f"{a} > {b}" if s > 0 else f"{a} < {b}" if s < 0
                                                   else f"{a} = {b}" for m, s in signs.items()}})
    return out


def limits(models: int, boxes: int, observations: int) -> list[str]:
    """What the analysis of this design cannot show, in words."""
    out = []
    if boxes >= 2 and models <= 3:
        out.append(f"{models} probe models: the probe-model component rests on {models - 1} degree(s) of "
                   f"freedom and the box x probe model one on {(boxes - 1) * (models - 1)}; read them as a "
                   "warning sign, not a measurement.")
    if boxes >= 2 and observations == 1:
        out.append("One observation per cell: the box x probe model interaction and the residual cannot be "
                   "told apart (the interaction holds both, the residual is n/a).")
    if boxes < 2:
        out.append("One box: E rho^2, Kendall's W and flipped pairs describe a box ranking and need two "
                   "boxes or more; what is shown is how far this box's score moves with the probe model.")
    out.append("The probe models were chosen, not drawn: the figures speak for models like these, not for "
               "every LLM that could play the user.")
    return out


def analyse(frames: Mapping[str, pd.DataFrame], metric: str) -> dict:
    """The sensitivity analysis of `metric` (see the module docstring) from one score frame per probe
    model (`frames[model]`, every model's run otherwise identical); JSON-able, NaN as null."""
    from ctrlsim.metrics.generalizability import model_sensitivity
    from ctrlsim.metrics.stats import paired_comparison

    models = list(frames)
    if len(models) < 2:
        raise ConfigError(f"a probe-model sensitivity analysis needs two models or more, got {models}")
    rows = [f[f["metric"] == metric] for f in frames.values() if len(f)]
    share = bool(any(bool(r["share"].any()) for r in rows))
    methods = sorted({str(m) for r in rows for m in r["method"]})
    out: dict[str, Any] = {"metric": metric, "share": share, "models": models, "methods": {}, "scripted": {}}
    for method in methods:
        cells = {m: _cells(frames[m], method, metric) if len(frames[m]) else {} for m in models}
        depends = depends_on_model(cells)
        boxes, common, left_out = balanced(cells)
        entry: dict[str, Any] = {"depends_on_model": depends, "boxes": boxes, "observations": common,
                                 "left_out": left_out}
        if depends is False:
            shared = sum(len(obs) for obs in cells[models[0]].values())
            out["scripted"][method] = {**entry, "shared_scores": shared}
            continue
        out["methods"][method] = entry
        if not common:
            entry["limits"] = ["No observation is held by every (box, probe model) cell: nothing to compare."]
            continue
        scores = {b: {m: [cells[m][b][o] for o in common] for m in models} for b in boxes}
        entry["means"] = {b: {m: _estimate(scores[b][m], share).to_dict() for m in models} for b in boxes}
        if len(boxes) >= 2:
            found = model_sensitivity(scores)
            comp = found["components"]
            entry.update({"components": dict(zip(COMPONENTS, (comp.box, comp.model, comp.box_x_model,
                                                              comp.residual))),
                          "shares": found["shares"], "g_coefficient": found["g_coefficient"],
                          "kendalls_w": found["kendalls_w"], "flipped_pairs": found["flipped_pairs"],
                          "flips": flips({b: {m: float(sum(v) / len(v)) for m, v in scores[b].items()}
                                          for b in boxes}, models)})
        else:
            entry["paired"] = []
            for reference, model in combinations(models, 2):
                for b in boxes:
                    comp = paired_comparison(scores[b][model], scores[b][reference])
                    entry["paired"].append({"box": b, "model": model, "reference": reference,
                                            "difference": comp.difference.to_dict(),
                                            "p_wilcoxon": comp.p_wilcoxon, "n": comp.n, "wins": comp.wins,
                                            "losses": comp.losses})
        entry["limits"] = limits(len(models), len(boxes), len(common))
    return _json_safe(out)


# ----------------------------------------------------------------------------- the report as blocks

def _value(x: float | None, share: bool, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.{digits}f}" if share else f"{x:.{digits + 2}f}"


def _est(e: Mapping[str, Any], share: bool) -> str:
    from ctrlsim.metrics.stats import Estimate, format_estimate

    return format_estimate(Estimate.from_dict(e), 100 if share else 1.0, 2 if share else 4, bounds=True,
                           missing="n/a")


def _flip(found: Mapping[str, Any]) -> str:
    orders = ", ".join(f"{m}: {o}" for m, o in found["order"].items())
    return f"{' vs '.join(found['boxes'])} ({orders})"


def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def blocks(analysis: Mapping[str, Any], *, protocol: str, field: str,
           folders: Mapping[str, str] | None = None) -> list[Block]:
    """The analysis as report blocks (sensitivity.md renders them; the audit shows their tables)."""
    metric, share, models = analysis["metric"], analysis["share"], analysis["models"]
    unit = f"{metric} (%)" if share else metric
    where = "; ".join(f"{m} ({(folders or {}).get(m, '-')})" for m in models)
    out: list[Block] = [Text(
        f"# Probe-model sensitivity: {protocol}, {unit}\n\nThe same run with each probe model ({field} = "
        f"{where}): every other config value is the same, so each folder holds what `ctrlsim {protocol} "
        f"--{field.replace('_', '-')} MODEL` gives. Scores are each observation's {metric}; cells pair "
        f"observations held by every (box, probe model) cell ({DOCS}).")]
    analysed = analysis["methods"]
    means = [[method, b, *(_est(e["means"][b][m], share) for m in models), len(e["observations"])]
             for method, e in analysed.items() if e.get("means") for b in e["boxes"]]
    if means:
        out.append(Table.of(f"{unit} per box and probe model [95% CI]", means,
                            ["Method", "Box", *models, "observations"],
                            after="Mean over the shared observations with its 95% interval (a bounded "
                                  "bootstrap for a share, Student t otherwise)."))
    ranked = {m: e for m, e in analysed.items() if "components" in e}
    if ranked:
        rows = [[method, *(f"{e['components'][c]:.3g} ({_value(e['shares'][c], True, 0)}%)"
                           if e["components"][c] is not None else "n/a" for c in COMPONENTS),
                 len(e["boxes"]), len(models), len(e["observations"])] for method, e in ranked.items()]
        out.append(Table.of(f"Variance components of {metric}", rows,
                            ["Method", *COMPONENTS, "boxes", "models", "observations"],
                            after="Two-way random-effects ANOVA (expected mean squares, negative estimates "
                                  "set to 0), observations as replicates within each (box, probe model) "
                                  f"cell; in {metric}'s units squared{' (a share)' if share else ''}, "
                                  "with each component's share of their sum."))
        rows = [[method, _num(e["g_coefficient"]), _num(e["kendalls_w"]), _num(e["flipped_pairs"]),
                 "; ".join(_flip(f) for f in e["flips"]) or "none"] for method, e in ranked.items()]
        out.append(Table.of("The box ranking across probe models", rows,
                            ["Method", "E rho^2", "Kendall's W", "flipped pairs (share)", "flipped pairs"],
                            after="E rho^2: the share of the box means' variance that is the boxes' (1: "
                                  "the ranking would not move with other models like these). Kendall's W: "
                                  "agreement of the models' box rankings (1 full, 0 none). A pair flips when "
                                  "one model orders its means one way and another model the other way."))
    paired = [[method, p["box"], f"{p['model']} - {p['reference']}", _est(p["difference"], share),
               f"{p['wins']} / {p['losses']}", _num(p["p_wilcoxon"], 3), p["n"]]
              for method, e in analysed.items() for p in e.get("paired", [])]
    if paired:
        out.append(Table.of("Probe models compared on one box (paired over the same observations)", paired,
                            ["Method", "Box", "Difference", f"{unit} difference [95% CI]", "wins / losses",
                             "Wilcoxon p", "pairs"]))
    notes = []
    for method, e in analysis["scripted"].items():
        notes.append(f"- {method}: identical {metric} under every probe model on all {e['shared_scores']} "
                     "shared scores. It does not use the probe model (a scripted method such as oracle or "
                     "random) or the models made the same choices; identical scores show no model effect by "
                     "construction, so they are left out and are no evidence that the comparison is robust.")
    for method, e in analysed.items():
        for model, lost in e["left_out"].items():
            notes.append(f"- {method}, {model}: observations left out to balance the design: "
                         + ", ".join(f"{b} {n}" for b, n in lost.items()) + ".")
    limits_seen = list(dict.fromkeys(line for e in analysed.values() for line in e.get("limits", [])))
    notes += [f"- {line}" for line in limits_seen]
    if notes:
        out.append(Text("## What this cannot show, and what was left out\n\n" + "\n".join(notes)))
    return out


def write(out: Path, analysis: Mapping[str, Any], report: Sequence[Block], about: Mapping[str, Any]) -> str:
    """sensitivity.json (the analysis, its tables and `about`) and sensitivity.md in `out`; the markdown."""
    from ctrlsim.atomic import atomic_write_text
    from ctrlsim.experiments.runfolder import artefact_path
    from ctrlsim.redact import redact_secrets

    markdown = render_markdown(report)
    data = {**about, "analysis": analysis, "tables": tables_json(report)}
    # Atomic, never through a link in the folder, credentials cut: as every run-folder artefact.
    text = json.dumps(_json_safe(data), indent=2, allow_nan=False) + "\n"
    atomic_write_text(artefact_path(out, SENSITIVITY_JSON), redact_secrets(text))
    atomic_write_text(artefact_path(out, SENSITIVITY_MD), redact_secrets(markdown))
    return markdown
