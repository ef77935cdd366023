"""Tables and figures of `ctrlsim ctrlbench` from its episode records.

Per episode, `round_curves` gives each metric after every round t (Table 5's definitions):
  coverage              |T ∩ ∪_j C_j| / |T|
  efficiency            Σ_j |C_j ∩ T| / |T ∩ ∪_j C_j|  (the paper's code; its tables use this)
  efficiency_all_likes  Σ_j |C_j| / |T ∩ ∪_j C_j|      (Table 5 as printed)
  len                   (1/K) Σ_j |C_j|
  tokens                (1/K) Σ_j Tokens_j (evaluation decisions only; setup tokens are apart)
where C_j are probe j's new likes so far. Efficiency is None while nothing was found.
Tables average an entry over the episodes (targets x seeds, and boxes for Table 7) where it
is defined, and say how many episodes that was.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

import numpy as np

from ctrlsim.agents.episode import CURVES, round_curves  # noqa: F401 - re-exported for callers


def _labels(records: Mapping[str, dict]) -> dict[str, str]:
    """Method -> its label, as every record stores it (a method without records shows its name)."""
    return {r["method"]: r.get("label", r["method"]) for r in records.values()}


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _fmt(value, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _at(record: Mapping, metric: str, t: int):
    curve = record["curves"][metric]
    return curve[min(t, len(curve)) - 1] if curve else None


def _grouped(records: Mapping[str, dict], *fields) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records.values():
        groups[tuple(record[f] for f in fields)].append(record)
    return groups


def table1(config, records: Mapping[str, dict]) -> str:
    """Table 1: Coverage (%) and Exploration Efficiency at the report rounds, per box x method."""
    from tabulate import tabulate

    cps = config.report_rounds()
    groups = _grouped(records, "recommender", "method")
    header = ["Black-Box", "Method", "n"] + [f"Cov% t={t}" for t in cps] + [f"Eff t={t}" for t in cps]
    rows = []
    for box in config.recommenders:
        for method in config.all_methods:
            recs = groups.get((box, method), [])
            if not recs:
                continue
            row = [box, recs[0].get("label", method), len(recs)]
            row += [_fmt(_mean(_at(r, "coverage", t) for r in recs), 100) for t in cps]
            row += [_fmt(_mean(_at(r, "efficiency", t) for r in recs)) for t in cps]
            rows.append(row)
    return tabulate(rows, headers=header, tablefmt="github", disable_numparse=True)


def table7(config, records: Mapping[str, dict]) -> str:
    """Table 7: Coverage, Efficiency, Len, Tokens at t = rounds per method (all boxes, targets, seeds)."""
    from tabulate import tabulate

    t = config.rounds
    groups = _grouped(records, "method")
    header = ["Method", "n", "K", "Cov.(%)", "Eff.", "Eff. (all likes)", "Len.", "Tokens",
              "Setup tokens/probe", "Parse failures (%)", "Dropped probes"]
    rows = []
    for method in config.all_methods:
        recs = groups.get((method,), [])
        if not recs:
            continue
        llm = recs[0]["policy"] == "llm"
        decisions = sum(r["decisions"] for r in recs)
        rows.append([
            recs[0].get("label", method), len(recs), _fmt(_mean(r["k"] for r in recs), digits=0),
            _fmt(_mean(_at(r, "coverage", t) for r in recs), 100),
            _fmt(_mean(_at(r, "efficiency", t) for r in recs)),
            _fmt(_mean(_at(r, "efficiency_all_likes", t) for r in recs)),
            _fmt(_mean(_at(r, "len", t) for r in recs)),
            _fmt(_mean(_at(r, "tokens", t) for r in recs), digits=0) if llm else "0 (no LLM)",
            _fmt(_mean(r["setup_tokens"] / r["k"] for r in recs), digits=0),
            _fmt(100 * sum(r["parse_failures"] for r in recs) / decisions, digits=1) if decisions else "-",
            sum(len(r["dropped"]) for r in recs),
        ])
    return tabulate(rows, headers=header, tablefmt="github", disable_numparse=True)


def target_table(config, records: Mapping[str, dict], sizes: Mapping[str, int]) -> str:
    """Per-target coverage (%) at t = rounds (Figure 3), averaged over boxes and seeds."""
    from tabulate import tabulate

    t = config.rounds
    groups = _grouped(records, "target", "method")
    labels = _labels(records)
    header = ["Target", "Items"] + [labels.get(m, m) for m in config.all_methods]
    rows = []
    for target in config.targets:
        rows.append([target, sizes.get(target, "-")]
                    + [_fmt(_mean(_at(r, "coverage", t) for r in groups.get((target, m), [])), 100)
                       for m in config.all_methods])
    return tabulate(rows, headers=header, tablefmt="github", disable_numparse=True)


def render_tables(config, records: Mapping[str, dict], sizes: Mapping[str, int]) -> str:
    n = len(records)
    total = len(config.keys())
    parts = [
        f"# CtrlBench-Rec Task 1 (target content discovery): {n}/{total} episodes",
        f"dataset {config.dataset}; probes' LLM {config.llm}; K_large,K_small = {config.agents[0]},"
        f"{config.agents[1]}; t = {config.rounds}; target visible to probes: {config.target_visible}.",
        "Eff. = target likes / distinct targets found (the paper's code; lower is better); "
        "Eff. (all likes) = Table 5's literal formula. '-' = no target found yet.",
        "", "## Table 1: Coverage (%) and Exploration Efficiency by round", "", table1(config, records),
        "", f"## Table 7: all methods at t = {config.rounds}", "", table7(config, records),
        "", f"## Coverage (%) per target at t = {config.rounds} (Figure 3)", "",
        target_table(config, records, sizes),
    ]
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- figures

def _mean_curve(recs: list[dict], metric: str) -> np.ndarray:
    curves = np.array([[np.nan if v is None else v for v in r["curves"][metric]] for r in recs], dtype=float)
    with np.errstate(all="ignore"):
        return np.nanmean(curves, axis=0) if len(curves) else np.array([])


def coverage_figure(config, records: Mapping[str, dict]):
    """Coverage (%) vs round, one panel per black box, one line per method (Figures 10, 11)."""
    from matplotlib.figure import Figure

    boxes = list(config.recommenders)
    cols = min(3, len(boxes))
    rows = int(np.ceil(len(boxes) / cols))
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows))
    groups = _grouped(records, "recommender", "method")
    rounds = np.arange(1, config.rounds + 1)
    for n, box in enumerate(boxes):
        ax = fig.add_subplot(rows, cols, n + 1)
        for method in config.all_methods:
            recs = groups.get((box, method), [])
            if recs:
                ax.plot(rounds, 100 * _mean_curve(recs, "coverage"), marker="o", markersize=3,
                        label=recs[0].get("label", method))
        ax.set_title(box)
        ax.set_xlabel("round t")
        ax.set_ylabel("coverage (%)")
        ax.grid(alpha=0.3)
        if n == 0:
            ax.legend(fontsize=7)
    fig.suptitle(f"Coverage by round ({config.dataset}; mean over targets and seeds)")
    fig.tight_layout()
    return fig


def target_figure(config, records: Mapping[str, dict], sizes: Mapping[str, int]):
    """Coverage (%) at t = rounds per target, one bar per method (Figure 3)."""
    from matplotlib.figure import Figure

    groups = _grouped(records, "target", "method")
    targets, methods = list(config.targets), list(config.all_methods)
    fig = Figure(figsize=(max(5.0, 1.3 * len(targets) * max(1, len(methods)) / 2), 3.6))
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(methods))
    x = np.arange(len(targets))
    for n, method in enumerate(methods):
        vals = [_mean(_at(r, "coverage", config.rounds) for r in groups.get((t, method), []))
                for t in targets]
        ax.bar(x + (n - (len(methods) - 1) / 2) * width, [100 * (v or 0.0) for v in vals], width,
               label=_labels(records).get(method, method))
    ax.set_xticks(x)
    ax.set_xticklabels([f"{t}\n({sizes.get(t, '?')} items)" for t in targets])
    ax.set_ylabel(f"coverage (%) at t = {config.rounds}")
    ax.set_title("Coverage per target (mean over boxes and seeds)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def save_figures(folder, config, records: Mapping[str, dict], sizes: Mapping[str, int] | None = None) -> list:
    if not records:
        return []
    sizes = sizes or {r["target"]: r["target_size"] for r in records.values()}
    return [folder.save_figure(coverage_figure(config, records), "coverage_by_round"),
            folder.save_figure(target_figure(config, records, sizes), "coverage_by_target")]
