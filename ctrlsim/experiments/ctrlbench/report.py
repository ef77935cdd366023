"""`ctrlsim ctrlbench`'s tables.md and figures from its episode records.

The tables and how each cell aggregates its episodes are in `ctrlbench.tables`; this module puts
them in order for the chosen task and draws the figures, each with its 95% confidence band.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ctrlsim.agents.episode import CURVES, round_curves  # noqa: F401 - re-exported for callers
from ctrlsim.experiments.ctrlbench import tables as T
from ctrlsim.experiments.ctrlbench.reliability import pass_k_table
from ctrlsim.experiments.tables import Block, Text
from ctrlsim.metrics.bounded import share_ci
from ctrlsim.metrics.stats import mean_ci

TASK_TITLES = {"target-discovery": "Task 1 (target content discovery)",
               "profile-shaping": "Task 2 (profile shaping)", "popularity": "Task 3 (popularity bias)",
               "persistence": "persistence (steer, then release)",
               "suppression": "suppression (steer away and toward, then release)",
               "responsiveness": "responsiveness (counterfactual arms with negative feedback)"}


def render_tables(config, records: Mapping[str, dict], sizes: Mapping[str, int]) -> list[Block]:
    from ctrlsim.experiments import validity_card as VC

    found = VC.cards(records.values())
    records = VC.marked_records(records, found)
    n, total = len(records), len(config.keys())
    search = "on (search likes shape histories, never count)" if config.allow_search else \
        "off (Appendix B: a_t in L_t or a skip)"
    head = "\n".join([
        f"# CtrlBench-Rec {TASK_TITLES[config.task]}: {n}/{total} episodes",
        f"dataset {config.dataset}; probes' LLM {config.llm}; K_large,K_small = {config.agents[0]},"
        f"{config.agents[1]}; t = {config.rounds}; seeds {', '.join(map(str, config.seeds))}; "
        f"target visible to probes: {config.target_visible}; search {search}; "
        f"Base-Small users: {config.small_users}.",
        "Only likes on recommender slates count. Each cell: the mean over the cell's episodes (targets x "
        "seeds) with its 95% confidence interval: Coverage, a share, as [low, high] bounds of a bootstrap "
        "interval that stays in [0, 100]%; other cells as mean ± half-width ('n/a' with one episode); "
        "docs/statistics.md says which interval each figure uses. Eff. = total "
        "target likes / total distinct targets found over the episodes (lower is better); 'found' = "
        "episodes that found any target.",
    ])
    blocks: list[Block] = [Text(head), VC.validity_table(found)]
    if config.task == "persistence":  # Table 1's rounds would mix the three phases
        from ctrlsim.experiments.ctrlbench.persistence import persistence_blocks

        return blocks + persistence_blocks(config, records) + [T.substitution_table(config, records)]
    if config.task == "responsiveness":
        from ctrlsim.experiments.ctrlbench.responsiveness import responsiveness_blocks

        return blocks + responsiveness_blocks(config, records) + [T.substitution_table(config, records)]
    if config.task == "suppression":
        from ctrlsim.experiments.ctrlbench.suppression import suppression_blocks

        return blocks + suppression_blocks(config, records) + [T.substitution_table(config, records)]
    if config.task == "profile-shaping":
        blocks.append(T.profile_table(config, records))
    elif config.task == "popularity":
        blocks.append(T.popularity_table(config, records))
    return blocks + [T.table1(config, records), T.table7(config, records), T.paired_table(config, records),
                     pass_k_table(config, records), T.target_table(config, records, sizes),
                     T.substitution_table(config, records)]


# ----------------------------------------------------------------------------- figures

def band(values_per_episode: list[list], scale: float = 1.0, *,
         share: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) per round over episodes; the band collapses to the mean where n < 2. A
    `share` (Coverage) gets the bootstrap interval that stays in [0, 1], as its table cells do."""
    width = max((len(v) for v in values_per_episode), default=0)
    estimate = share_ci if share else mean_ci
    out = [estimate([v[t] if t < len(v) else None for v in values_per_episode]) for t in range(width)]
    mean = np.array([e.value for e in out]) * scale
    low = np.array([e.low if e.n > 1 else e.value for e in out]) * scale
    high = np.array([e.high if e.n > 1 else e.value for e in out]) * scale
    return mean, low, high


def _panels(config, records, series, ylabel: str, title: str, scale: float = 1.0, share: bool = False):
    """One panel per black box, one line with its 95% band per method; series(record) -> per-round list."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    boxes = list(config.recommenders)
    cols = min(3, len(boxes))
    rows = int(np.ceil(len(boxes) / cols))
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows))
    for n, box in enumerate(boxes):
        ax = fig.add_subplot(rows, cols, n + 1)
        for b, _, label, recs in T._cells(config, records):
            if b != box:
                continue
            mean, low, high = band([series(r) for r in recs], scale, share=share)
            x = np.arange(1, len(mean) + 1)
            (line,) = ax.plot(x, mean, marker="o", markersize=3, label=label)
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_title(box)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round t")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if n == 0:
            ax.legend(fontsize=7)
    fig.suptitle(f"{title} ({config.dataset}; mean and 95% CI over targets and seeds)")
    fig.tight_layout()
    return fig


def coverage_figure(config, records: Mapping[str, dict]):
    """Coverage (%) vs round, one panel per black box (Figures 10, 11)."""
    return _panels(config, records, lambda r: r["curves"]["coverage"], "coverage (%)", "Coverage by round",
                   scale=100, share=True)


def target_figure(config, records: Mapping[str, dict], sizes: Mapping[str, int]):
    """Coverage (%) at t = rounds per target, and per tag of a union target (Figure 3), with 95% CIs."""
    from matplotlib.figure import Figure

    groups = T.grouped(records, "target", "method")
    labels = T.method_labels(records)
    bars = [(target, None) for target in config.targets]
    bars += [(target, tag) for target in config.targets if "+" in target for tag in target.split("+")]
    methods = list(config.all_methods)
    fig = Figure(figsize=(max(5.0, 0.9 * len(bars) * max(1, len(methods)) / 2), 3.8))
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(methods))
    x = np.arange(len(bars))
    for n, method in enumerate(methods):
        means, errs = [], []
        for target, tag in bars:
            est = share_ci(T.coverage_values(groups.get((target, method), []), config.rounds, tag))
            mean = est.value if est.n else 0.0
            means.append(100 * mean)
            errs.append((100 * (mean - est.low), 100 * (est.high - mean)) if est.n > 1 else (0.0, 0.0))
        ax.bar(x + (n - (len(methods) - 1) / 2) * width, means, width, yerr=np.array(errs).T, capsize=2,
               label=labels.get(method, method))
    ax.set_xticks(x)
    ax.set_xticklabels([f"{tag or target}\n({sizes.get(tag or target, '?')} items)" for target, tag in bars],
                       fontsize=7)
    ax.set_ylabel(f"coverage (%) at t = {config.rounds}")
    ax.set_title("Coverage per target and tag (mean and 95% CI over boxes and seeds)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def save_figures(folder, config, records: Mapping[str, dict], sizes: Mapping[str, int] | None = None) -> list:
    if not records:
        return []
    sizes = sizes or {r["target"]: r["target_size"] for r in records.values()}
    saved = [folder.save_figure(coverage_figure(config, records), "coverage_by_round"),
             folder.save_figure(target_figure(config, records, sizes), "coverage_by_target")]
    if config.task == "popularity":
        saved.append(folder.save_figure(_panels(
            config, records, lambda r: r["popularity_curves"]["new_discoveries"], "new target items",
            "New target discoveries per round (Figure 8)"), "new_discoveries_by_round"))
        saved.append(folder.save_figure(_panels(
            config, records, lambda r: r["popularity_curves"]["popularity"], "mean popularity (eq. 3)",
            "Popularity of the items interacted with (Figure 9)"), "popularity_by_round"))
    if config.task in ("persistence", "suppression"):
        from ctrlsim.experiments.ctrlbench.persistence import effort_figure, retention_figure

        saved.append(folder.save_figure(retention_figure(config, records), "retention_by_round"))
        saved.append(folder.save_figure(effort_figure(config, records), "effort_curves"))
    if config.task == "suppression":
        from ctrlsim.experiments.ctrlbench.suppression import share_figure

        saved.append(folder.save_figure(share_figure(config, records), "share_by_round"))
    if config.task == "profile-shaping":
        saved.append(folder.save_figure(_panels(
            config, records, lambda r: r["profile_curves"]["accuracy"][1:], "cos(V_t, V_target)",
            "Target similarity by round (Table 2's Acc.)"), "accuracy_by_round"))
    return saved


# ----------------------------------------------------------------------------- driver hooks

def write_roster(ctx, key: str, record: dict) -> None:
    """The episode's roster file, from its record (on resume only where it is missing: files are
    written atomically, so one that exists is whole)."""
    name = key.replace("|", "_").replace("=", "").replace(":", "-").replace("/", "-")
    path = f"rosters/{name}.json"
    if not ctx.folder.file(path).exists():
        ctx.folder.write_json(path, record["personas"])


def report(ctx, records) -> list[Block]:
    from ctrlsim.experiments.ctrlbench.inputs import sizes

    return render_tables(ctx.config, dict(records), sizes(ctx.config))


def figures(ctx, records) -> None:
    from ctrlsim.experiments.ctrlbench.inputs import sizes

    save_figures(ctx.folder, ctx.config, dict(records), sizes(ctx.config))


def run_summary(ctx, records) -> dict:
    """The run's numbers as data (`RunResult.summary`) for the tasks the audit reads: persistence and
    responsiveness; {} for the others."""
    if ctx.config.task == "responsiveness":
        from ctrlsim.experiments.ctrlbench.responsiveness import run_summary as responsiveness_summary

        return responsiveness_summary(ctx.config, dict(records))
    from ctrlsim.experiments.ctrlbench.persistence import run_summary as persistence_summary

    return persistence_summary(ctx, records)
