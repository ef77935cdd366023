"""PromptShift's Tables 4-6 and figures from per-user test records (no LLM call, no selection).

The records come from `ctrlsim.recommenders.promptshift.selection.validate_then_test`
(validation selection, then the test positives read once); this module only
averages them the paper's way, adds our t-tests, and formats tables and figures.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ctrlsim.experiments.config import config_to_dict
from ctrlsim.experiments.promptshift.config import PromptShiftConfig
from ctrlsim.experiments.promptshift.units import build_data, check, generated_list, make_engine
from ctrlsim.experiments.runner import RunContext
from ctrlsim.experiments.scores import Scores
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.experiments.usage import total_tokens
from ctrlsim.metrics import paired_t_test
from ctrlsim.recommenders.promptshift.data import PromptShiftData
from ctrlsim.recommenders.promptshift.rerankers import VARIANTS
from ctrlsim.recommenders.promptshift.selection import metric_names, validate_then_test

VARIANT_LABELS = {"B0": "Original", "B1": "All-user-fixed", "B2": "Slice-fixed", "B3": "PromptShift"}
DATASET_LABELS = {"ml-100k": "MovieLens 100K", "ml-1m": "MovieLens 1M", "lastfm-1k": "Last.fm 1K"}


# ------------------------------------------------------------------- summaries
def scenario_macro(records: list[dict], variant: str, metric: str, scenarios: Sequence[str]) -> float:
    """Mean over scenarios of the per-scenario mean over users (the paper's averaging)."""
    means = [float(np.mean(vals)) for s in scenarios
             if (vals := [r["metrics"][variant][metric] for r in records if r["scenario"] == s])]
    return float(np.mean(means)) if means else float("nan")


def _per_user_paraphrase(records: list[dict]) -> dict[str, float]:
    return {r["user"]: r["prompt_effect"]["paraphrase_drift"] for r in records}


def summarise(dataset: str, model: str, identity: dict, records: list[dict], k: int,
              scenarios: Sequence[str], selection: dict, tokens: dict) -> dict:
    """Table 4-6 figures of one dataset-model setting, plus per-scenario means and our t-tests."""
    names = metric_names(k)
    variants = {v: {m: scenario_macro(records, v, m, scenarios) for m in names} for v in VARIANTS}
    para_by_user = _per_user_paraphrase(records)
    para = float(np.mean(list(para_by_user.values()))) if para_by_user else float("nan")
    per_scenario: dict[str, dict[str, float]] = {}
    for s in scenarios:
        rs = [r for r in records if r["scenario"] == s]
        per_scenario[s] = {"users": float(len(rs))}
        for v in VARIANTS:
            for m in ("drift", "slice_shift"):
                vals = [r["metrics"][v][m] for r in rs]
                per_scenario[s][f"{v}/{m}"] = float(np.mean(vals)) if vals else float("nan")
                per_scenario[s][f"{v}/{m}/se"] = (float(np.std(vals, ddof=1) / math.sqrt(len(vals)))
                                                   if len(vals) > 1 else float("nan"))
    users = sorted(para_by_user)
    cue_u = [float(np.mean([r["metrics"]["B0"]["drift"] for r in records if r["user"] == u])) for u in users]
    tests = {
        "delta_d>0": paired_t_test(cue_u, [para_by_user[u] for u in users], alternative="greater").__dict__,
        "slice_shift>0": paired_t_test([r["metrics"]["B0"]["slice_shift"] for r in records],
                                       alternative="greater").__dict__,
    }
    better = {"drift": "less", "slice_shift": "less", f"difficulty@{k}": "greater",
              f"hit_rate@{k}": "greater", f"mrr@{k}": "greater", f"ndcg@{k}": "greater"}
    for v in ("B1", "B2", "B3"):
        for m, alt in better.items():
            def value(r: dict, variant: str, metric: str = m) -> float:
                x = r["metrics"][variant][metric]
                return abs(x) if metric == "slice_shift" else x  # SliceShift: closer to zero is better
            name = f"{v} vs B0: {'|slice_shift|' if m == 'slice_shift' else m}"
            tests[name] = paired_t_test([value(r, v) for r in records], [value(r, "B0") for r in records],
                                        alternative=alt).__dict__
    match_total = {"matched": 0, "total": 0, "in_history": 0, "parse_error": 0}
    counted = set()
    for r in records:
        for condition, m in r["matches"].items():
            if (r["user"], condition) in counted:  # L^0 and P1-P3 appear in every scenario's record
                continue
            counted.add((r["user"], condition))
            for key in match_total:
                match_total[key] += m.get(key, 0)
    return {
        "dataset": dataset, "model": model, "llm": identity, "n_users": len(users), "n_records": len(records),
        "table4": {"paraphrase_drift": para, "cue_drift": variants["B0"]["drift"],
                   "delta_d": variants["B0"]["drift"] - para, "slice_shift": variants["B0"]["slice_shift"]},
        "per_scenario": per_scenario, "variants": variants, "significance": tests,
        "matching": {**match_total, "match_rate": match_total["matched"] / max(match_total["total"], 1)},
        "tokens": tokens, "selection": selection,
    }


def macro_table(settings: list[dict], k: int) -> dict:
    """Table 6: unweighted means over dataset-model settings."""
    return {v: {m: float(np.mean([s["variants"][v][m] for s in settings])) if settings else float("nan")
                for m in metric_names(k)} for v in VARIANTS}


# ------------------------------------------------------------------ formatting
def _f(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "undefined"
    return f"{x:.4f}"


def format_tables(result: Mapping) -> list[Block]:
    """Tables 4, 5 and 6 in the paper's layout, per-scenario means, our t-tests, selections and choices."""
    k = result["config"]["k"]
    names = metric_names(k)
    heads = ["Drift ↓", "SliceShift → 0", f"Difficulty@{k} ↑", f"HitRate@{k} ↑", f"MRR@{k} ↑",
             f"NDCG@{k} ↑"]
    label = lambda s: DATASET_LABELS.get(s["dataset"], s["dataset"])  # noqa: E731
    out: list[Block] = []
    rows4 = [[label(s), s["model"], _f(s["table4"]["paraphrase_drift"]), _f(s["table4"]["cue_drift"]),
              _f(s["table4"]["delta_d"]), _f(s["table4"]["slice_shift"]), s["n_users"],
              f"{s['matching']['match_rate']:.2f}"] for s in result["settings"]]
    out.append(Table.of("Table 4: Prompt-effect results (Cue Drift and SliceShift averaged across scenarios)",
                        rows4, ["Dataset", "Model", "Paraphrase Drift", "Cue Drift", "Δd", "SliceShift",
                                "Users", "Match rate"], level=0))
    rows_s = []
    for s in result["settings"]:
        for scen, v in s["per_scenario"].items():
            rows_s.append([label(s), s["model"], scen, int(v["users"])]
                          + [_f(v[f"{b}/{m}"]) for b in VARIANTS for m in ("drift", "slice_shift")])
    out.append(Table.of("Per scenario: Drift and SliceShift of B0-B3 (user means)", rows_s,
                        ["Dataset", "Model", "Scenario", "Users"]
                        + [f"{b} {m}" for b in VARIANTS for m in ("Drift", "SliceShift")], level=0))
    rows5 = [[label(s), s["model"], v] + [_f(s["variants"][v][m]) for m in names]
             for s in result["settings"] for v in ("B0", "B3")]
    out.append(Table.of("Table 5: B0 vs B3 per dataset-model (averaged across scenarios)", rows5,
                        ["Dataset", "Model", "Variant", *heads], level=0))
    rows6 = [[v, VARIANT_LABELS[v]] + [_f(result["table6"][v][m]) for m in names] for v in VARIANTS]
    out.append(Table.of(f"Table 6: Macro means across {len(result['settings'])} dataset-model setting(s)",
                        rows6, ["Method", "", *heads], level=0))
    sig = [[s["model"], name, _f(t["mean"]), _f(t["t"]), _f(t["p"]), t["n"],
            "undefined" if t["p"] != t["p"] else ("yes" if t["p"] < 0.05 else "no"), _f(t.get("mde"))]
           for s in result["settings"] for name, t in s["significance"].items()]
    out.append(Table.of("One-tailed paired t-tests (our addition; the paper reports none)", sig,
                        ["Model", "Test", "Mean diff", "t", "p", "n", "p < 0.05", "MDE (80% power)"], level=0,
                        after="MDE: the smallest true mean difference the one-tailed test would find 80% of "
                              "the time at p < 0.05, given the spread of these users' differences "
                              "(docs/statistics.md)."))
    for s in result["settings"]:
        sel = s["selection"]
        out.append(Text(f"Frozen on validation ({s['model']}): match threshold {sel['match_threshold']}, "
                        f"B3 parameters {sel['b3']['chosen'] if sel.get('b3') else 'paper (selection off)'}"))
    out.append(Text("Protocol choices (where the paper leaves them open)\n\n" + "\n".join(
        f"- {key}: {value}" for key, value in result["choices"].items())))
    if result.get("failed"):
        out.append(Text("Failed units (rerun to retry): "
                        + "; ".join(f"{key}: {err}" for key, err in result["failed"].items())))
    if not result.get("complete", True):
        out.append(Text("(partial run: rerun the same command to finish)"))
    return out


# --------------------------------------------------------------------- figures
def figures(result: Mapping) -> dict:
    """Matplotlib figures by name: Drift and SliceShift per scenario (one per setting) and B0-B3."""
    from ctrlsim.experiments.runfolder import new_figure

    out = {}
    for s in result["settings"]:
        scen = list(s["per_scenario"])
        fig, axes = new_figure((9, 3.4), 1, 2)
        x = np.arange(len(scen))
        panels = ((axes[0], "drift", "Cue Drift (B0)"), (axes[1], "slice_shift", "SliceShift (B0)"))
        for ax, metric, title in panels:
            vals = [s["per_scenario"][c][f"B0/{metric}"] for c in scen]
            errs = [s["per_scenario"][c][f"B0/{metric}/se"] for c in scen]
            ax.bar(x, vals, yerr=np.nan_to_num(errs), capsize=4, color="#4477aa")
            ax.set_xticks(x, scen)
            ax.set_title(title)
            ax.axhline(0, color="black", linewidth=0.6)
        axes[0].axhline(s["table4"]["paraphrase_drift"], color="#cc6677", linestyle="--",
                        label="Paraphrase Drift")
        axes[0].legend(loc="lower right")
        fig.suptitle(f"{s['dataset']} / {s['model']}: prompt effect per scenario (±1 s.e.)", y=1.04)
        out[f"scenarios_{s['model'].replace('/', '_')}"] = fig
    if result["settings"]:
        fig, axes = new_figure((9, 3.4), 1, 2)
        panels = ((axes[0], "drift", "Drift ↓"), (axes[1], "slice_shift", "SliceShift → 0"))
        for ax, metric, title in panels:
            width = 0.8 / len(result["settings"])
            for n, s in enumerate(result["settings"]):
                ax.bar(np.arange(len(VARIANTS)) + n * width, [s["variants"][v][metric] for v in VARIANTS],
                       width, label=s["model"])
            ax.set_xticks(np.arange(len(VARIANTS)) + 0.4 - width / 2, VARIANTS)
            ax.axhline(0, color="black", linewidth=0.6)
            ax.set_title(title)
        axes[1].legend()
        fig.suptitle("Reranking variants B0-B3 (means over scenarios)", y=1.04)
        out["variants"] = fig
    return out


__all__ = ["DATASET_LABELS", "VARIANT_LABELS", "figures", "format_tables", "macro_table", "scenario_macro",
           "summarise"]


def tested(cfg: PromptShiftConfig, data: PromptShiftData, users: Sequence[str], records: Mapping[str, dict]):
    """(LLM, its users with stored lists, test records, selection) per LLM with stored lists: the
    matching threshold and B3's parameters frozen on validation, then the test positives read once."""
    for name in cfg.llms:
        done = [u for u in users if f"{name}/{u}" in records]
        if not done:
            continue
        engine = make_engine(cfg, data, name, users=done)
        for u in done:
            for d in records[f"{name}/{u}"]["lists"]:
                engine.preload(u, generated_list(d))
        test, selection = validate_then_test(engine, done, match_threshold=cfg.match_threshold,
                                             select_b3=cfg.select_on_validation)
        yield name, done, test, selection


def score_rows(cfg: PromptShiftConfig, records: Mapping[str, dict]):
    """Drift (a share) and SliceShift of every reranking B0-B3 (methods `b0`-`b3`, as calibrate names
    them) per (LLM, user, scenario) on the test positives, as score rows (`ctrlsim.experiments.scores`);
    the box is the LLM, the observation `seed=N/<user>/<scenario>` (as calibrate names it)."""
    from ctrlsim.recommenders.promptshift.data import sample_users

    data = build_data(cfg)
    for name, _, test, _ in tested(cfg, data, sample_users(data, cfg.users, cfg.seed), records):
        for r in test:
            for variant in VARIANTS:
                for metric, share in (("drift", True), ("slice_shift", False)):
                    yield {"key": f"{name}/{r['user']}", "method": variant.lower(), "box": name,
                           "observation": f"seed={cfg.seed}/{r['user']}/{r['scenario']}", "seed": cfg.seed,
                           "metric": metric, "value": float(r["metrics"][variant][metric]), "share": share}


# The LLM is the box itself (its lists are what is measured): no separate probe model to vary.
SCORES = Scores(rows=score_rows, headline=lambda config: "drift", probe_llm_field=None,
                reference=lambda config: "b0")


def compute_summary(cfg: PromptShiftConfig, data: PromptShiftData, users: Sequence[str],
                    records: Mapping[str, dict], choices: dict) -> dict:
    """Selection on validation, then test metrics, for every LLM with stored lists."""
    settings = []
    for name, done, test, selection in tested(cfg, data, users, records):
        usage = total_tokens(records[f"{name}/{u}"] for u in done)  # a list whose counts are null: unknown
        tokens = {"prompt_tokens": usage.prompt, "completion_tokens": usage.completion,
                  **({"unknown_lists": usage.unknown_calls} if usage.unknown_calls else {})}
        identity = records[f"{name}/{done[0]}"].get("llm", {"spec": name})
        settings.append(summarise(data.dataset.name, name, identity, test, cfg.k, cfg.scenarios, selection,
                                  tokens))
    return {"config": config_to_dict(cfg), "users": list(users), "choices": choices, "settings": settings,
            "table6": macro_table(settings, cfg.k), "records": len(records)}


# ----------------------------------------------------------------------- driver hooks

def run_summary(ctx: RunContext, records: Mapping[str, dict]) -> dict:
    """The tables' numbers, computed once per set of records (the report and the figures share it)."""
    cached = ctx.state.get("summary")
    if cached is not None and cached[0] == sorted(records):
        return cached[1]
    if "data" not in ctx.state:
        check(ctx)
    users = ctx.state["users"]
    result = compute_summary(ctx.config, ctx.state["data"], users, records, ctx.state["choices"])
    expected = {f"{name}/{u}" for name in ctx.config.llms for u in users}
    assert ctx.folder is not None
    result.update(complete=expected <= set(records), out=str(ctx.folder.path))
    ctx.state["summary"] = (sorted(records), result)
    return result


def report(ctx: RunContext, records: Mapping[str, dict]) -> list[Block]:
    result = run_summary(ctx, records)
    assert ctx.folder is not None
    ctx.folder.write_json("summary.json", result)
    return format_tables(result)


def save_figures(ctx: RunContext, records: Mapping[str, dict]) -> None:
    assert ctx.folder is not None
    for name, fig in figures(run_summary(ctx, records)).items():
        ctx.folder.save_figure(fig, name)
