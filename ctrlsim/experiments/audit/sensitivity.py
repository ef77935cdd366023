"""`ctrlsim audit BOX --llms A,B,...`: the audit once per probe model, and whether its findings depend
on which model played the user.

Each model's audit is an ordinary audit (`units.run_audit`) in `OUT/llm=<model>/` (its own
summary.json and report.html, resumable on its own). Once every one finished, `OUT/summary.json`
and `OUT/report.html` hold, per sub-run whose config differs between the models only in the probe
LLM, the probe-model sensitivity analysis of its scores (`ctrlsim.experiments.sensitivity`), and per
audited box and probe method its placement on the calibration scale under each model, with words
that say whether the placement depends on the model (`words.placement_agreement`). A failed
sub-run stops the audit as a single audit does: no top-level report is left behind.
"""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctrlsim.experiments.audit.config import (
    AUDIT_FILE,
    DEFAULT_OUT,
    REPORT,
    SUMMARY,
    AuditConfig,
    plan_subruns,
    subrun_config,
)
from ctrlsim.experiments.audit.folder import AuditFolder
from ctrlsim.experiments.audit.units import run_audit
from ctrlsim.experiments.audit.words import LABELS, SCRIPTED_PLACEMENT, placement_agreement, sensitivity_lines
from ctrlsim.experiments.config import RunOptions

# Sub-runs the probe-model analysis leaves out, and why: it compares one score per episode, and their
# numbers are not of that kind.
NOT_COMPARED = {"persistence": "its half-lives are right-censored times over episodes, not the one "
                               "score per episode that the probe-model analysis compares; each model's "
                               "report shows them",
                "responsiveness": "its scripted probes use no LLM, so every probe model gives the same "
                                  "numbers",
                "controls": "it asks the box for slates with no probe at all, so every probe model gives "
                            "the same numbers"}


def check_models(config: AuditConfig, llms: Sequence[str], given: Mapping[str, Any] | None = None
                 ) -> tuple[str, ...]:
    """The probe models, each checked (spec and every sub-run config) before anything loads or runs;
    specs `given` as loaded LLMs are not checked as paths."""
    from ctrlsim.backends.spec_check import check_llm_spec
    from ctrlsim.experiments.sensitivity.run import check_llm_list

    specs = check_llm_list(llms)
    for spec in specs:
        if spec not in (given or {}):
            check_llm_spec(spec, name="--llms")
        for subrun in plan_subruns(replace(config, llm=spec)):
            subrun_config(subrun)
    return specs


def run_audit_across_llms(config: AuditConfig, llms: Sequence[str], options: RunOptions | None = None, *,
                          show_progress: bool = True, resources: dict | None = None) -> dict:
    """Run (or resume) the audit of `config` once per probe model, then write the top-level summary.json
    and report.html; returns that summary. Raises `AuditFailedError` when a sub-run failed (no report)."""
    from ctrlsim.experiments.audit.render import render_llms_report
    from ctrlsim.experiments.sensitivity.run import model_folder

    options = options or RunOptions()
    out = Path(options.out or DEFAULT_OUT)
    specs = check_models(config, llms, resources)
    with AuditFolder(out, overwrite=options.overwrite) as top:  # the audits' folder is an audit folder
        if top.previous is not None and show_progress:
            print(f"--overwrite: the previous contents of {out} are now in {top.previous}", file=sys.stderr)
        folders = {spec: top.file(model_folder(out, spec).name) for spec in specs}  # links refused now
        top.remove_report()  # never leave a report beside audits that may now fail
        top.write_json(AUDIT_FILE, {"boxes": list(config.boxes), "size": config.size, "llms": list(specs),
                                    "dataset": config.dataset, "slate_size": config.slate_size})
        summaries: dict[str, dict] = {}
        for spec in specs:
            folder = folders[spec]
            if show_progress:
                print(f"audit --llms: {spec} -> {folder}", file=sys.stderr)
            summaries[spec] = run_audit(replace(config, llm=spec), replace(options, out=str(folder)),
                                        show_progress=show_progress, resources=resources)
        summary = build_summary(config, summaries, out)
        top.write_json(SUMMARY, summary)
        top.write_text(REPORT, render_llms_report(summary))
    return summary


def subrun_sensitivity(name: str, folders: Mapping[str, str]) -> dict | None:
    """The sensitivity analysis of one sub-run across the models' audits (`folders[model]`), or None
    where its configs differ in more than the probe LLM, or not in it (the sub-run does not use it)."""
    from ctrlsim.experiments.config import config_to_dict
    from ctrlsim.experiments.report import read_run
    from ctrlsim.experiments.sensitivity.run import analyse_runs

    read = {spec: read_run(folder) for spec, folder in folders.items()}
    runner = next(iter(read.values()))[0]
    field = runner.scores.probe_llm_field if runner.scores is not None else None
    if not field:
        return None
    configs = {spec: config for spec, (_, config, _) in read.items()}
    plain = [{k: v for k, v in config_to_dict(c).items() if k != field} for c in configs.values()]
    varied = len({getattr(c, field) for c in configs.values()}) == len(configs)
    if not varied or any(p != plain[0] for p in plain):
        return None
    records = {spec: found for spec, (_, _, found) in read.items()}
    analysis, blocks = analyse_runs(runner, configs, records, dict(folders))
    from ctrlsim.experiments.tables import tables_json

    return {"protocol": runner.name, "probe_llm_field": field, "analysis": analysis,
            "tables": [t for t in tables_json(blocks) if "title" in t],
            "lines": sensitivity_lines(name, analysis)}


def placements(summaries: Mapping[str, Mapping[str, Any]],
               scripted: Mapping[str, Sequence[str]]) -> list[dict]:
    """Per calibration sub-run, audited box and probe method: each model's placement and the words on
    whether it depends on the model (`scripted[sub-run]`: methods whose scores no model changed)."""
    out = []
    models = list(summaries)
    names = [n for n in next(iter(summaries.values()))["subruns"] if n.startswith("calibrate-")]
    for name in names:
        cells: dict[tuple[str, str], dict[str, dict]] = {}
        for spec in models:
            numbers = (summaries[spec]["subruns"].get(name) or {}).get("numbers") or {}
            for box, per_method in (numbers.get("placement") or {}).items():
                for method, place in per_method.items():
                    cells.setdefault((box, method), {})[spec] = {
                        "text": place["text"], "lambda": place["lambda"], "box": place["box"]}
        for (box, method), by_model in cells.items():
            for spec in models:
                by_model.setdefault(spec, {"text": "not placed", "lambda": None, "box": None})
            found = placement_agreement(box, method, by_model)
            if method in scripted.get(name, ()):
                who = LABELS.get(method, method)
                found = {"verdict": "scripted",
                         "words": f"Placement of {box} by {who}: the method {SCRIPTED_PLACEMENT}"}
            out.append({"subrun": name, "box": box, "method": method, "by_model": by_model, **found})
    return out


def build_summary(config: AuditConfig, summaries: Mapping[str, Mapping[str, Any]], out: Path) -> dict:
    """The multi-model audit's numbers and words (the top-level summary.json)."""
    from ctrlsim.experiments.audit.summary import SMALL_LLMS, clean
    from ctrlsim.experiments.sensitivity.run import model_folder

    models = list(summaries)
    first = summaries[models[0]]
    names = [n for n in first["subruns"] if all(n in s["subruns"] for s in summaries.values())]
    sensitivity: dict[str, dict] = {}
    unused: list[str] = []
    for name in names:
        if name in NOT_COMPARED:
            continue
        found = subrun_sensitivity(name, {m: summaries[m]["subruns"][name]["folder"] for m in models})
        if found is None:
            unused.append(name)
        else:
            sensitivity[name] = found
    placed = placements(summaries, {n: list(s["analysis"]["scripted"]) for n, s in sensitivity.items()})
    lines = [p["words"] + "." for p in placed]
    lines += [line for s in sensitivity.values() for line in s["lines"]]
    caveats = list(dict.fromkeys(line for s in sensitivity.values() for e in s["analysis"]["methods"].values()
                                 for line in e.get("limits", [])))
    if unused:
        caveats.append(f"Sub-runs that do not vary with the probe model ({', '.join(unused)}) ran once per "
                       "model and are not part of this comparison; each model's report shows them.")
    caveats += [f"{name} is not compared across probe models: {NOT_COMPARED[name]}." for name in names
                if name in NOT_COMPARED]
    small = [m for m in models if m in SMALL_LLMS]
    if small:
        caveats.append(f"{', '.join(small)} are small bundled models: the papers' probes are far larger API "
                       "models, and small models agreeing is no evidence that strong ones would.")
    return clean({
        "audit": {"boxes": list(config.boxes), "primary": config.primary, "size": config.size,
                  "dataset": config.dataset, "slate_size": config.slate_size, "llms": models,
                  "folder": str(out),
                  "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())},
        "models": {m: {"folder": model_folder(out, m).name, "headline_text": s["headline_text"]}
                   for m, s in summaries.items()},
        "placements": placed, "sensitivity": sensitivity, "headline_text": lines, "caveats": caveats})


def across_llms_main(config: AuditConfig, llms: str, options: RunOptions, llm: str) -> int:
    """`ctrlsim audit BOX --llms A,B`: the audit once per probe model, then the comparison (exit 0)."""
    from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM
    from ctrlsim.errors import ConfigError

    if llm != DEFAULT_PROBE_LLM:
        raise ConfigError("audit: --llms runs each of its models as --llm: give one of the two")
    summary = run_audit_across_llms(config, llms.split(","), options)
    for line in summary["headline_text"]:
        print(line)
    out = Path(options.out or DEFAULT_OUT)
    print(f"\nreport: {out / REPORT} (numbers: {out / SUMMARY}; each model's audit: "
          f"{', '.join(m['folder'] for m in summary['models'].values())})", file=sys.stderr)
    return 0
