"""The audit report's figures, drawn from `summary.json`'s numbers alone, as base64 PNG data URIs.

Every figure has a 95% band or error bars; matplotlib loads on the first call (object API, no
pyplot state), and each figure's numbers are named in its `numbers` entry (a path into the summary).
"""
from __future__ import annotations

import base64
import io
from typing import Any, Mapping

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _nan(x):
    return float("nan") if x is None else x


def _band(ax, xs, estimates, colour, label):
    mean = [_nan(e["value"]) for e in estimates]
    low = [_nan(e["low"]) if e["low"] is not None else _nan(e["value"]) for e in estimates]
    high = [_nan(e["high"]) if e["high"] is not None else _nan(e["value"]) for e in estimates]
    ax.plot(xs, mean, marker="o", color=colour, label=label)
    ax.fill_between(xs, low, high, color=colour, alpha=0.18, linewidth=0)


def coverage_figure(cb: Mapping[str, Any]):
    from matplotlib.figure import Figure

    boxes = cb["boxes"]
    fig = Figure(figsize=(4.2 * len(boxes), 3.2))
    axes = fig.subplots(1, len(boxes), squeeze=False)[0]
    rounds = list(range(1, cb["rounds"] + 1))
    for ax, box in zip(axes, boxes):
        for i, method in enumerate(cb["methods"]):
            series = cb["coverage_by_round"].get(box, {}).get(method)
            if series:
                _band(ax, rounds, series, COLOURS[i % len(COLOURS)], method)
        ax.set_title(box)
        ax.set_xlabel("round t")
        ax.set_ylabel("Coverage (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("CtrlBench-Rec: Coverage by round, mean and 95% band over episodes", fontsize=10)
    return fig


def calibration_figure(cal: Mapping[str, Any]):
    from matplotlib.figure import Figure

    metrics = cal["metrics"]
    fig = Figure(figsize=(4.4 * len(metrics), 3.4))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        for i, method in enumerate(cal["methods"]):
            colour = COLOURS[i % len(COLOURS)]
            curve = cal["curves"][method][metric]
            _band(ax, curve["lambda"], curve["estimates"], colour, f"{method} on dial")
            for box, per in cal["placement"].items():
                place = per.get(method)
                if place is None or place["metric"] != metric or place["box"]["value"] is None:
                    continue
                b = place["box"]
                ax.axhline(b["value"], color=colour, linestyle=":", linewidth=1.5)
                if b["low"] is not None:
                    ax.axhspan(b["low"], b["high"], color=colour, alpha=0.07)
                ax.annotate(box, (cal["grid"][-1], b["value"]), fontsize=7, color=colour, ha="right",
                            va="bottom")
        ax.set_xlabel("lambda (0 ignores the user, 1 follows the likes)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Calibration ({cal['protocol']}): dial boxes (lines, 95% bands); audited boxes dotted",
                 fontsize=10)
    return fig


def steereval_figure(se: Mapping[str, Any]):
    from matplotlib.figure import Figure

    conds = list(se["conditions"])
    fig = Figure(figsize=(1.8 + 1.6 * len(conds), 3.0))
    ax = fig.subplots()
    for i, cond in enumerate(conds):
        for j, direction in enumerate(("increase", "decrease")):
            e = se["conditions"][cond][direction]["delta_auc"]
            if e["value"] is None:
                continue
            err = [[e["value"] - e["low"]], [e["high"] - e["value"]]] if e["low"] is not None else None
            ax.bar(i + (j - 0.5) * 0.38, e["value"], width=0.36, yerr=err, capsize=4,
                   color=COLOURS[j], label=direction if i == 0 else None)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(conds)), conds)
    ax.set_ylabel("ΔAUC_t (mean, 95% CI)")
    ax.legend(fontsize=8)
    ax.set_title("SteerEval: ΔAUC_t of the edited tag", fontsize=10)
    return fig


def comparison_figure(rows: list[dict]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 0.6 + 0.45 * len(rows)))
    ax = fig.subplots()
    for i, row in enumerate(rows):
        e = row["difference"]
        if e["value"] is None:
            continue
        if e["low"] is not None:
            ax.plot([e["low"], e["high"]], [i, i], color=COLOURS[0])
        ax.plot([e["value"]], [i], "o", color=COLOURS[0])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"{r['box']} - {r['reference']} ({r['method']})" for r in rows])
    ax.set_xlabel("Coverage difference (points), 95% CI")
    ax.set_title("Paired comparison of boxes (same targets and seeds)", fontsize=10)
    return fig


def retention_figure(ps: Mapping[str, Any]):
    """Does control last? R(tau) per box (a panel each), one line per method, with its 95% band."""
    from matplotlib.figure import Figure

    boxes = ps["boxes"]
    fig = Figure(figsize=(4.2 * len(boxes), 3.2))
    axes = fig.subplots(1, len(boxes), squeeze=False)[0]
    for ax, box in zip(axes, boxes):
        for i, method in enumerate(ps["methods"]):
            band = ps["cells"].get(box, {}).get(method, {}).get("retention")
            if not band or not band["n"]:  # steering moved no episode: no retention to draw
                continue
            estimates = [{"value": m, "low": lo, "high": hi} for m, lo, hi in zip(band["mean"], band["low"],
                                                                                   band["high"])]
            _band(ax, band["tau"], estimates, COLOURS[i % len(COLOURS)], f"{method} (n = {band['n']})")
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_title(box)
        ax.set_xlabel("rounds after steering stopped (tau)")
        ax.set_ylabel("retention R(tau)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "steering moved no episode:\nnothing to retain", transform=ax.transAxes,
                    ha="center", va="center", fontsize=9, color="#555")
    fig.suptitle("Does control last? Retention after release, mean and 95% band over steered episodes "
                 "(1 = gain kept, 0 = back to baseline)", fontsize=10, y=1.03)
    return fig


def render_figures(summary: Mapping[str, Any]) -> dict[str, dict]:
    """name -> {title, src (a data: URI), numbers (where in summary.json its numbers are)}."""
    figures: dict[str, dict] = {}
    subruns = summary["subruns"]

    def add(name: str, title: str, fig, numbers: str) -> None:
        figures[name] = {"title": title, "src": _png(fig), "numbers": numbers}

    cb = (subruns.get("ctrlbench") or {}).get("numbers")
    if cb:
        add("coverage_by_round", "Coverage by round", coverage_figure(cb),
            "subruns.ctrlbench.numbers.coverage_by_round")
        if cb["box_comparison"]:
            add("box_comparison", "Paired comparison of boxes", comparison_figure(cb["box_comparison"]),
                "subruns.ctrlbench.numbers.box_comparison")
    for name in ("calibrate-ctrlbench", "calibrate-steereval", "calibrate-promptshift"):
        cal = (subruns.get(name) or {}).get("numbers")
        if cal:
            add(name, f"Calibration: {cal['protocol']}", calibration_figure(cal),
                f"subruns.{name}.numbers.curves and .placement")
    ps = (subruns.get("persistence") or {}).get("numbers")
    if ps and any(c["steered"] for per in ps["cells"].values() for c in per.values()):
        add("persistence", "Does control last?", retention_figure(ps),
            "subruns.persistence.numbers.cells.*.*.retention")
    se = (subruns.get("steereval") or {}).get("numbers")
    if se:
        add("steereval", "SteerEval ΔAUC_t", steereval_figure(se), "subruns.steereval.numbers.conditions")
    return figures
