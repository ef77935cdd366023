"""`ctrlsim controls`' tables, verdicts and summary, from its unit records."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.metrics.stats import format_estimate, mean_ci, paired_t_test, spearman_ci, step_test

ALPHA = 0.05
ARTICLE_CONTROLS = "DSA Art. 27 (options to modify the main parameters)"
ARTICLE_NON_PROFILED = "DSA Art. 38 (an option not based on profiling)"


def control_verdicts(config, records: Mapping[str, dict]) -> list[dict]:
    """Per declared control: values, the property's mean per value, rho with its interval over
    personas, adjacent steps told apart, and PASS/FAIL against the claimed direction."""
    from ctrlsim.experiments.context import UnitContext
    from ctrlsim.experiments.controls.units import declared

    controls = declared(config, UnitContext())
    out = []
    for control in controls.controls:
        recs = sorted((r for r in records.values() if r.get("control") == control.name),
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


def non_profiled_verdict(records: Mapping[str, dict]) -> dict | None:
    """Extreme-pair minus random-pair slate distance in both modes, and PASS / FAIL / INCONCLUSIVE."""
    recs = [r for r in records.values() if r.get("kind") == "non_profiled"]
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
    head = Text(f"# Declared controls of {config.box}: {len(records)} units\n"
                f"dataset {config.dataset}; {config.users} personas per seed (their first {config.history} "
                f"liked items), seeds {', '.join(map(str, config.seeds))}; slates of {config.slate_size}.")
    verdicts = control_verdicts(config, records)
    blocks: list[Block] = [head]
    if verdicts:
        rows = [[v["control"], v["claim"], f"{v['property']} {v['direction']}",
                 " → ".join(format_estimate(m, digits=2) for m in v["means"]), _rho_cell(v["rho"]),
                 f"{v['steps_told_apart']}/{v['steps']}", v["verdict"], ARTICLE_CONTROLS] for v in verdicts]
        blocks.append(Table.of("Declared controls: does each do what it claims?", rows,
                               ["Control", "claim", "property", "property at each value (mean ± 95% CI)",
                                "Spearman rho [95% CI]", "steps told apart", "verdict", "speaks to"],
                               after="rho: between the control's value and the claimed property of each "
                                     "persona's slate, with a bootstrap interval resampling personas. "
                                     "PASS: the interval excludes 0 on the claimed side; FAIL otherwise (a "
                                     "control that changes nothing has no rho). Steps: adjacent values whose "
                                     f"paired difference over personas is told apart at p < {ALPHA} "
                                     "(docs/controls.md)."))
    else:
        blocks.append(Text(f"{config.box} declares no controls (or none has finished)."))
    np_verdict = non_profiled_verdict(records)
    if np_verdict is not None:
        rows = [[mode.replace("_", "-"), f"{np_verdict[mode]['extreme']:.3f}",
                 f"{np_verdict[mode]['random']:.3f}", format_estimate(np_verdict[mode]["excess"], digits=3),
                 f"{np_verdict[mode]['test'].p:.3g}"] for mode in ("non_profiled", "profiled")]
        blocks.append(Table.of("Non-profiled mode: do slates still follow the persona?", rows,
                               ["mode", "distance to the most different persona",
                                "distance to a random persona", "excess (mean ± 95% CI)", "p (excess > 0)"],
                               after=f"Verdict: {np_verdict['verdict']} ({ARTICLE_NON_PROFILED}; settings "
                                     f"{np_verdict['settings']}). Distance = 1 - Jaccard overlap of two "
                                     "personas' slates. A feed not based on profiling gives the most "
                                     "different personas slates no more different than random pairs get "
                                     "(no excess); the profiled mode must show an excess, or the check has "
                                     "no power (INCONCLUSIVE)."))
    return blocks


def report(ctx, records) -> list[Block]:
    return render_tables(ctx.config, dict(records))


def summary(ctx, records) -> dict:
    """The verdicts as data (the audit's section reads them)."""
    records = dict(records)
    controls = [{**{k: v for k, v in c.items() if k not in ("means", "rho")},
                 "means": [m.to_dict() for m in c["means"]],
                 "rho": {"value": c["rho"].rho, "low": c["rho"].low, "high": c["rho"].high},
                 "article": ARTICLE_CONTROLS} for c in control_verdicts(ctx.config, records)]
    np_verdict = non_profiled_verdict(records)
    non_profiled = None if np_verdict is None else {
        "verdict": np_verdict["verdict"], "settings": np_verdict["settings"], "article": ARTICLE_NON_PROFILED,
        **{mode: {"excess": np_verdict[mode]["excess"].to_dict(), "p": np_verdict[mode]["test"].p}
           for mode in ("non_profiled", "profiled")}}
    return {"box": ctx.config.box, "controls": controls, "non_profiled": non_profiled}
