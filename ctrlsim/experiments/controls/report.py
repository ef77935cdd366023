"""`ctrlsim controls`' tables, verdicts and summary, from its unit records."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.metrics.stats import format_estimate, mean_ci, paired_t_test, spearman_ci, step_test

ALPHA = 0.05
ARTICLE_CONTROLS = "DSA Art. 27 (options to modify the main parameters)"
ARTICLE_NON_PROFILED = "DSA Art. 38 (an option not based on profiling)"


def control_verdicts(config, records: Mapping[str, dict], box: str) -> list[dict]:
    """Per control `box` declares: values, the property's mean per value, rho with its interval over
    personas, adjacent steps told apart, and PASS/FAIL against the claimed direction."""
    from ctrlsim.experiments.context import UnitContext
    from ctrlsim.experiments.controls.units import declared

    controls = declared(config, UnitContext(), box)
    out = []
    for control in controls.controls:
        recs = sorted((r for r in records.values()
                       if r.get("recommender") == box and r.get("control") == control.name),
                      key=lambda r: (r["seed"], control.sweep(config.points).index(r["value"])
                                     if r["value"] in control.sweep(config.points) else 0))
        if not recs:
            continue
        grid = [v for v in control.sweep(config.points) if any(r["value"] == v for r in recs)]
        rank = {v: n for n, v in enumerate(grid)}  # choices are ordered as declared
        xs, ys, who = [], [], []
        per_value: dict = {v: {} for v in grid}
        for r in recs:
            for user, value in zip(r["users"], r["values"]):
                xs.append(rank[r["value"]])
                ys.append(value)
                who.append(f"seed={r['seed']}/{user}")
                per_value[r["value"]][f"seed={r['seed']}/{user}"] = value
        rho = spearman_ci(xs, ys, who)
        steps = []
        for a, b in zip(grid, grid[1:]):
            shared = sorted(set(per_value[a]) & set(per_value[b]))
            test = step_test([per_value[b][k] for k in shared], [per_value[a][k] for k in shared])
            steps.append(bool(test.defined or test.n) and test.p < ALPHA)
        sign = 1 if control.direction == "increases" else -1
        lower = rho.low if sign > 0 else -rho.high
        verdict = "PASS" if not np.isnan(lower) and lower > 0 else "FAIL"
        out.append({"control": control.name, "claim": control.claim, "property": control.property,
                    "direction": control.direction, "values": grid,
                    "means": [mean_ci(list(per_value[v].values())) for v in grid],
                    "rho": rho, "steps_told_apart": sum(steps), "steps": len(steps), "verdict": verdict})
    return out


def non_profiled_verdict(records: Mapping[str, dict], box: str) -> dict | None:
    """Extreme-pair minus random-pair slate distance in both modes, and PASS / FAIL / INCONCLUSIVE."""
    recs = [r for r in records.values() if r.get("kind") == "non_profiled" and r.get("recommender") == box]
    if not recs:
        return None
    out: dict = {"units": len(recs)}
    for mode in ("non_profiled", "profiled"):
        excess = [e - r for rec in recs for e, r in zip(rec[mode]["extreme"], rec[mode]["random"])]
        out[mode] = {"excess": mean_ci(excess), "test": paired_t_test(excess, alternative="greater"),
                     "extreme": float(np.mean([e for rec in recs for e in rec[mode]["extreme"]])),
                     "random": float(np.mean([x for rec in recs for x in rec[mode]["random"]]))}
    shown = out["non_profiled"]["test"]
    profiled = out["profiled"]["test"]
    if shown.defined and shown.p < ALPHA:
        out["verdict"] = "FAIL"  # its slates still follow who the persona is
    elif profiled.defined and profiled.p < ALPHA:
        out["verdict"] = "PASS"
    else:
        out["verdict"] = "INCONCLUSIVE"  # even the profiled mode shows no excess: the check has no power
    out["settings"] = recs[0]["non_profiled"]["settings"]
    return out


def _rho_cell(rho) -> str:
    if np.isnan(rho.rho):
        return "undefined (the property did not change)"
    bounds = "" if np.isnan(rho.low) else f" [{rho.low:+.2f}, {rho.high:+.2f}]"
    return f"{rho.rho:+.2f}{bounds}"


def render_tables(config, records: Mapping[str, dict]) -> list[Block]:
    blocks: list[Block] = [Text(f"# Declared controls of {', '.join(config.boxes)}: {len(records)} units\n"
                                f"dataset {config.dataset}; {config.users} personas per seed (their first "
                                f"{config.history} liked items), seeds {', '.join(map(str, config.seeds))}; "
                                f"slates of {config.slate_size}.")]
    rows = [[box, v["control"], v["claim"], f"{v['property']} {v['direction']}",
             " → ".join(format_estimate(m, digits=2) for m in v["means"]), _rho_cell(v["rho"]),
             f"{v['steps_told_apart']}/{v['steps']}", v["verdict"], ARTICLE_CONTROLS]
            for box in config.boxes for v in control_verdicts(config, records, box)]
    silent = [box for box in config.boxes if not any(r[0] == box for r in rows)]
    if rows:
        blocks.append(Table.of("Declared controls: does each do what it claims?", rows,
                               ["Black-Box", "Control", "claim", "property",
                                "property at each value (mean ± 95% CI)", "Spearman rho [95% CI]",
                                "steps told apart", "verdict", "speaks to"],
                               after="rho: between the control's value and the claimed property of each "
                                     "persona's slate, with a bootstrap interval resampling personas. "
                                     "PASS: the interval excludes 0 on the claimed side; FAIL otherwise (a "
                                     "control that changes nothing has no rho). Steps: adjacent values whose "
                                     f"paired difference over personas is told apart at p < {ALPHA} "
                                     "(docs/controls.md)."))
    if silent:
        blocks.append(Text(f"{', '.join(silent)}: no declared control (or none has finished)."))
    np_rows = []
    for box in config.boxes:
        found = non_profiled_verdict(records, box)
        if found is None:
            continue
        for mode in ("non_profiled", "profiled"):
            mine = found[mode]
            np_rows.append([box, mode.replace("_", "-"), f"{mine['extreme']:.3f}", f"{mine['random']:.3f}",
                            format_estimate(mine["excess"], digits=3), f"{mine['test'].p:.3g}",
                            found["verdict"] if mode == "non_profiled" else "",
                            str(found["settings"]) if mode == "non_profiled" else "default"])
    if np_rows:
        blocks.append(Table.of("Non-profiled mode: do slates still follow the persona?", np_rows,
                               ["Black-Box", "mode", "distance to the most different persona",
                                "distance to a random persona", "excess (mean ± 95% CI)", "p (excess > 0)",
                                "verdict", "settings"],
                               after=f"Verdicts speak to {ARTICLE_NON_PROFILED}. Distance = 1 - Jaccard "
                                     "overlap of two personas' slates. A feed not based on profiling gives "
                                     "the most different personas slates no more different than random "
                                     "pairs get (no excess): PASS; an excess: FAIL; the profiled mode must "
                                     "show an excess, or the check has no power (INCONCLUSIVE)."))
    return blocks


def report(ctx, records) -> list[Block]:
    return render_tables(ctx.config, dict(records))


def summary(ctx, records) -> dict:
    """The verdicts as data, per box (the audit's section reads them)."""
    records, config = dict(records), ctx.config
    out = {}
    for box in config.boxes:
        controls = [{**{k: v for k, v in c.items() if k not in ("means", "rho")},
                     "means": [m.to_dict() for m in c["means"]],
                     "rho": {"value": c["rho"].rho, "low": c["rho"].low, "high": c["rho"].high},
                     "article": ARTICLE_CONTROLS} for c in control_verdicts(config, records, box)]
        found = non_profiled_verdict(records, box)
        non_profiled = None if found is None else {
            "verdict": found["verdict"], "settings": found["settings"], "article": ARTICLE_NON_PROFILED,
            **{mode: {"excess": found[mode]["excess"].to_dict(), "p": found[mode]["test"].p}
               for mode in ("non_profiled", "profiled")}}
        out[box] = {"controls": controls, "non_profiled": non_profiled}
    return {"boxes": out}
