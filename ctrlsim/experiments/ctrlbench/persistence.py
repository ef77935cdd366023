"""Does control last? The persistence task's tables and figure, from steer-then-release episodes.

Each episode's record holds, per round, the mean share of target items on its probes' recommender
slates (`persistence.target_share`) and the phase plan (baseline B, steering S, release R rounds).
From them (`ctrlsim.metrics.persistence`): s0 = the baseline mean, s* = the mean of the last rounds of
steering, retention R(tau) = (s(tau) - s0) / (s* - s0) over the release rounds (defined where steering
moved the box by more than `MIN_GAIN`), the half-life (first tau with R <= 0.5, right-censored at R),
the relapse share and the retention area; across episodes, the Kaplan-Meier median half-life with its
interval and a log-rank test between boxes. Effort: the likes a probe spent in the steering phase
until the target share reached `EFFORT_SHARE` (censored when it never did), and the initial slope.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ctrlsim.envs.phases import AWAY
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.metrics import persistence as P
from ctrlsim.metrics.bounded import share_ci
from ctrlsim.metrics.stats import format_estimate, mean_ci

EFFORT_SHARE = 0.5  # the target share of a slate the effort columns count likes up to


def _phases(record: dict) -> tuple[list, list, list]:
    plan, share = record["phases"], record["persistence"]["target_share"]
    b, s, r = plan["baseline"], plan["steer"], plan["release"]
    return share[:b], share[b:b + s], share[b + s:b + s + r]


def steers_away(record: dict) -> bool:
    """Whether the episode steered away from its target (a suppression run's "away" episode)."""
    return record["phases"].get("direction") == AWAY


def episode_persistence(record: dict) -> dict:
    """One episode's s0, s*, retention curve (None: steering did not move the box), half-life,
    relapse, area, and steering effort.

    An episode that steered away is read on the complement (the share of slate items that are not
    targets), so its gain is the reduction s0 - s*, R(tau) the share of that reduction kept, and its
    effort the likes until the target share fell to half its baseline; s0 and s* stay target shares."""
    baseline, steering, release = _phases(record)
    if any(v is None for v in (*baseline, *steering, *release)):  # a round with no recommender slate
        return {"s0": None, "s_star": None, "curve": None}
    s0, s_star = P.steered_levels(baseline, steering)
    away = steers_away(record)
    if away:
        baseline, steering, release = ([1.0 - v for v in part] for part in (baseline, steering, release))
    curve = P.retention_curve(baseline, steering, release)
    steer_rounds = slice(len(baseline), len(baseline) + len(steering))
    likes = record["persistence"]["likes"][steer_rounds]
    threshold = 1.0 - s0 / 2 if away else EFFORT_SHARE
    effort, reached = P.effort_to_threshold(steering, likes, threshold)
    out = {"s0": s0, "s_star": s_star, "curve": curve, "effort": effort, "effort_reached": reached,
           "slope": P.initial_slope(steering, likes)}
    if record.get("allow_search") and "searches" in record["persistence"]:  # effort of its own kind
        searches = record["persistence"]["searches"][steer_rounds]
        out["search_effort"], out["search_reached"] = P.effort_to_threshold(steering, searches, threshold)
    if curve is not None:
        tau, observed = P.half_life(curve)
        out.update(half_life=tau, observed=observed, relapse=P.relapse_share(curve),
                   area=P.retention_area(curve))
    return out


def persistence_cells(config, records: Mapping[str, dict], *, away: bool = False
                      ) -> list[tuple[str, str, str, list[dict]]]:
    """(box, method, label, each episode's `episode_persistence`) per cell with phased records that
    steered toward their target (`away`: those that steered away)."""
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for record in records.values():
        if "phases" in record and steers_away(record) == away:
            by_cell.setdefault((record["recommender"], record["method"]), []).append(record)
    return [(box, method, recs[0].get("label", method), [episode_persistence(r) for r in recs])
            for box in config.recommenders for method in config.all_methods
            if (recs := by_cell.get((box, method)))]


def _interval(value) -> str:
    return "censored" if value is None else f"{value:g}"


def _km_cell(km: P.HalfLife) -> str:
    """median [low, high] (events/n): a median or bound beyond the release is "censored"; an upper
    bound the band leaves undefined although every episode fell to half is "open"."""
    if not km.n:
        return "-"
    high = "open" if km.high is None and km.events == km.n else _interval(km.high)
    return f"{_interval(km.median)} [{_interval(km.low)}, {high}] ({km.events}/{km.n})"


def retention_table(config, cells, *, away: bool = False) -> Table:
    """Per cell: levels, retention, half-life, relapse, area and effort (`away`: the cells' episodes
    steered away from the target, read on the complement, see `episode_persistence`)."""
    plan = config.phase_plan()
    effort_name = "likes to halve s0" if away else f"likes to {EFFORT_SHARE:.0%}"
    header = ["Black-Box", "Method", "n", "steered", "s0 %", "s* %", "R(1)", f"R({plan.release})",
              "half-life KM [95% CI] (events/n)", "relapse", "area", effort_name, "initial slope"]
    if config.allow_search:
        header.append(effort_name.replace("likes", "searches"))
    rows = []
    for box, _, label, eps in cells:
        steered = [e for e in eps if e.get("curve") is not None]
        ids = [e for e in eps if e["s0"] is not None]
        km = P.km_half_life([e["half_life"] for e in steered], [e["observed"] for e in steered]) \
            if steered else P.HalfLife(None, None, None, 0, 0)
        effort = P.km_half_life([e["effort"] for e in ids], [e["effort_reached"] for e in ids]) \
            if ids else P.HalfLife(None, None, None, 0, 0)
        rows.append([box, label, len(eps), f"{len(steered)}/{len(eps)}",
                     format_estimate(share_ci([e["s0"] for e in ids]), 100, bounds=True),
                     format_estimate(share_ci([e["s_star"] for e in ids]), 100, bounds=True),
                     format_estimate(mean_ci([e["curve"][0] for e in steered])),
                     format_estimate(mean_ci([e["curve"][-1] for e in steered])),
                     _km_cell(km), format_estimate(mean_ci([e["relapse"] for e in steered])),
                     format_estimate(mean_ci([e["area"] for e in steered])), _km_cell(effort),
                     format_estimate(mean_ci([e["slope"] for e in ids if e["slope"] is not None]), digits=3)])
        if config.allow_search:
            with_searches = [e for e in ids if "search_effort" in e]
            rows[-1].append(_km_cell(P.km_half_life([e["search_effort"] for e in with_searches],
                                                    [e["search_reached"] for e in with_searches]))
                            if with_searches else "-")
    levels = (f"Phases: {plan.baseline} baseline rounds (no goal), {plan.steer} steering, {plan.release} "
              f"release ({plan.release_mode}). s0 = the baseline's mean target share of the recommender "
              f"slates, s* = the mean of the last {min(P.LAST_K, plan.steer)} steering rounds; ")
    searched = (" Searches: the same effort counted in searches typed during steering (their own kind of "
                "action; search results never count toward the shares)." if config.allow_search else "")
    if away:
        after = (levels + "steering away, the gain is the reduction s0 - s*, read on the complement (the "
                 f"share of non-target items): 'steered' = episodes with s0 - s* > {P.MIN_GAIN}, R(tau) = "
                 "(s0 - s(tau)) / (s0 - s*) the share of the reduction kept tau rounds into release (1 = "
                 "kept, 0 = back to baseline); half-life, relapse and area as for steering toward. Likes to "
                 "halve s0: the likes a probe spent in steering until the target share fell to s0 / 2 "
                 "(Kaplan-Meier median, censored when it never did); initial slope: the reduction per like "
                 "over the first steering rounds. s0 and s*: [low, high] bootstrap intervals that stay in "
                 "[0, 100]%; the rest mean ± 95% t half-width over episodes "
                 "(docs/persistence.md).")
        return Table.of("Steering away: does the suppression last?", rows, header, after=after + searched)
    after = (levels + f"'steered' = episodes "
             f"with s* - s0 > {P.MIN_GAIN} (retention is defined only for them). R(tau) = (s(tau) - s0) / "
             "(s* - s0), tau rounds into release (1 = nothing forgotten, 0 = back to baseline); half-life = "
             "first tau with R <= 0.5, right-censored at the last release round: the Kaplan-Meier median "
             "over episodes with its 95% interval ('censored': not reached), events = episodes that fell to "
             "half. Relapse = 1 - mean R over the last release rounds; area = mean R over the release. "
             f"Likes to {EFFORT_SHARE:.0%}: the likes a probe spent in steering until the target share "
             "reached it (Kaplan-Meier median, censored when it never did); initial slope: target share per "
             "like over the first steering rounds. s0 and s*: [low, high] bootstrap intervals that stay in "
             "[0, 100]%; the rest mean ± 95% t half-width over episodes "
             "(docs/persistence.md).")
    return Table.of("Does control last? Retention after steering stops", rows, header, after=after + searched)


def log_rank_table(cells, title: str = "Half-lives between boxes (log-rank)") -> Table | None:
    """Half-lives of every pair of boxes, per method: a two-sided log-rank test."""
    by_method: dict[str, dict[str, list[dict]]] = {}
    for box, _, label, eps in cells:
        steered = [e for e in eps if e.get("curve") is not None]
        if steered:
            by_method.setdefault(label, {})[box] = steered
    rows = []
    for label, boxes in by_method.items():
        names = list(boxes)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                stat, p = P.log_rank([e["half_life"] for e in boxes[a]], [e["observed"] for e in boxes[a]],
                                     [e["half_life"] for e in boxes[b]], [e["observed"] for e in boxes[b]])
                rows.append([label, a, b, len(boxes[a]), len(boxes[b]),
                             "-" if not np.isfinite(stat) else f"{stat:+.2f}",
                             "-" if not np.isfinite(p) else f"{p:.3g}"])
    if not rows:
        return None
    return Table.of(title, rows,
                    ["Method", "Box A", "Box B", "n A", "n B", "z", "p"],
                    after="z > 0: box A's steering fades sooner than expected under equal half-lives; "
                          "two-sided p ('-': no episode fell to half).")


def persistence_blocks(config, records: Mapping[str, dict]) -> list[Block]:
    if not any("phases" in r for r in records.values()):
        return [Text("No steer-then-release episode finished yet.")]
    cells = persistence_cells(config, records)
    blocks: list[Block] = [retention_table(config, cells)]
    table = log_rank_table(cells)
    return blocks + ([table] if table is not None else [])


def effort_figure(config, records: Mapping[str, dict]):
    """Effort curves: the target share of each steering round against the actions spent so far in
    steering (likes; searches in a row of their own where search is on), mean over episodes, one
    panel per box, one line per method (dashed: steering away)."""
    from matplotlib.figure import Figure

    plan = config.phase_plan()
    kinds = ("likes", "searches") if config.allow_search else ("likes",)
    boxes = list(config.recommenders)
    fig = Figure(figsize=(4.2 * len(boxes), 3.2 * len(kinds)))
    curves: dict[tuple[str, str, bool], list[tuple[list, dict]]] = {}
    for record in records.values():
        series = record.get("persistence") or {}
        steering = series.get("target_share", [])[plan.baseline:plan.baseline + plan.steer]
        if "phases" in record and steering and None not in steering:
            key = (record["recommender"], record.get("label", record["method"]), steers_away(record))
            curves.setdefault(key, []).append((steering, series))
    for row, kind in enumerate(kinds):
        for n, box in enumerate(boxes):
            ax = fig.add_subplot(len(kinds), len(boxes), row * len(boxes) + n + 1)
            for (b, label, away), eps in curves.items():
                if b != box or any(kind not in series for _, series in eps):
                    continue
                spent = [P.effort_curve(steering, series[kind][plan.baseline:plan.baseline + plan.steer])[0]
                         for steering, series in eps]
                ax.plot(np.mean(spent, axis=0), 100 * np.mean([s for s, _ in eps], axis=0),
                        "--" if away else "-", marker="o", markersize=3, label=label + (" (away)" * away))
            ax.set_title(box)
            ax.set_xlabel(f"{kind} spent in steering (per probe)")
            ax.set_ylabel("target share of the slate (%)")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle("Effort: the target share against the actions spent (mean over episodes)")
    fig.tight_layout()
    return fig


def retention_figure(config, records: Mapping[str, dict]):
    """R(tau) with its 95% band, one panel per box, one line per method (dashed: steering away)."""
    from matplotlib.figure import Figure

    boxes = list(config.recommenders)
    fig = Figure(figsize=(4.2 * len(boxes), 3.2))
    axes = {box: fig.add_subplot(1, len(boxes), n + 1) for n, box in enumerate(boxes)}
    cells = [(cell, False) for cell in persistence_cells(config, records)] + \
        [(cell, True) for cell in persistence_cells(config, records, away=True)]
    for (box, _, label, eps), away in cells:
        curves = [e["curve"] for e in eps if e.get("curve") is not None]
        if not curves:
            continue
        mean, low, high = P.retention_band(curves)
        x = np.arange(1, len(mean) + 1)
        (line,) = axes[box].plot(x, mean, "--" if away else "-", marker="o", markersize=3,
                                 label=label + (" (away)" * away))
        low, high = np.where(np.isfinite(low), low, mean), np.where(np.isfinite(high), high, mean)
        axes[box].fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    for box, ax in axes.items():
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(box)
        ax.set_xlabel("rounds after steering stopped (tau)")
        ax.set_ylabel("retention R(tau)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a box where no episode was steered has no line
            ax.legend(fontsize=7)
    fig.suptitle("Does control last? Retention after release (mean and 95% CI over episodes)")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- RunResult.summary

def _none(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _release_likes(config, records: Mapping[str, dict]) -> dict[tuple[str, str], list[float]]:
    """(box, method) -> per episode, the likes a probe gave over the release rounds (mean over its
    probes; episodes with a round without a recommender slate are left out)."""
    plan = config.phase_plan()
    start = plan.baseline + plan.steer
    out: dict[tuple[str, str], list[float]] = {}
    for record in records.values():
        if "phases" not in record or steers_away(record):
            continue
        likes = record["persistence"]["likes"][start:start + plan.release]
        if None not in likes:
            out.setdefault((record["recommender"], record["method"]), []).append(float(sum(likes)))
    return out


def run_summary(ctx, records: Mapping[str, dict]) -> dict:
    """A persistence run's numbers as data (`RunResult.summary`; the audit's "Does control last?"
    reads them): per box and method the episodes, how many steering moved ('steered'), s0 and s* (shares:
    bounded bootstrap intervals), the gain s* - s0, the retention band per tau, the Kaplan-Meier
    half-life, relapse and area (t intervals over the steered episodes) and the likes a probe gave
    in release; per method, the log-rank test between every pair of boxes. Empty for other tasks."""
    from ctrlsim.experiments import validity_card as VC
    from ctrlsim.experiments.ctrlbench.config import PERSISTENCE
    from ctrlsim.metrics.bounded import share_ci

    config, records = ctx.config, dict(records)
    if config.task != PERSISTENCE:
        return {}
    plan = config.phase_plan()
    cells = persistence_cells(config, records)
    release_likes = _release_likes(config, records)
    boxes: dict[str, dict] = {}
    for box, method, label, eps in cells:
        ids = [e for e in eps if e["s0"] is not None]
        steered = [e for e in eps if e.get("curve") is not None]
        km = P.km_half_life([e["half_life"] for e in steered], [e["observed"] for e in steered]) \
            if steered else P.HalfLife(None, None, None, 0, 0)
        none = np.empty(0)
        band = P.retention_band([e["curve"] for e in steered]) if steered else (none, none, none)
        boxes.setdefault(box, {})[method] = {
            "label": label, "episodes": len(eps), "measured": len(ids), "steered": len(steered),
            "s0": share_ci([e["s0"] for e in ids]).to_dict(),
            "s_star": share_ci([e["s_star"] for e in ids]).to_dict(),
            "gain": mean_ci([e["s_star"] - e["s0"] for e in ids]).to_dict(),
            "retention": {"tau": list(range(1, plan.release + 1)), "n": len(steered),
                          **{k: [_none(v) for v in vs] for k, vs in zip(("mean", "low", "high"), band)}},
            "half_life": {"median": km.median, "low": km.low, "high": km.high, "events": km.events, "n": km.n,
                          "text": _km_cell(km)},
            "relapse": mean_ci([e["relapse"] for e in steered]).to_dict(),
            "area": mean_ci([e["area"] for e in steered]).to_dict(),
            "release_likes": mean_ci(release_likes.get((box, method), [])).to_dict()}
    log_rank: list[dict] = []
    for method in config.all_methods:
        steered_by_box = {box: [e for e in eps if e.get("curve") is not None]
                          for box, m, _, eps in cells if m == method}
        names = [b for b, eps in steered_by_box.items() if eps]
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ea, eb = steered_by_box[a], steered_by_box[b]
                z, p = P.log_rank([e["half_life"] for e in ea], [e["observed"] for e in ea],
                                  [e["half_life"] for e in eb], [e["observed"] for e in eb])
                log_rank.append({"method": method, "box_a": a, "box_b": b, "n_a": len(ea), "n_b": len(eb),
                                 "events_a": sum(e["observed"] for e in ea),
                                 "events_b": sum(e["observed"] for e in eb), "z": _none(z), "p": _none(p)})
    return {"task": PERSISTENCE, "targets": list(config.targets), "seeds": list(config.seeds),
            "boxes": list(config.recommenders), "methods": list(config.all_methods),
            "agents": list(config.agents),
            "slate_size": {b: config.slate_for(b) for b in config.recommenders},
            "phases": {"baseline": plan.baseline, "steer": plan.steer, "release": plan.release,
                       "release_mode": plan.release_mode},
            "min_gain": P.MIN_GAIN, "last_k": P.LAST_K,
            "validity": {m: c.to_dict() for m, c in VC.cards(records.values()).items()},
            "cells": boxes, "log_rank": log_rank}
