"""`ctrlsim calibrate --task persistence`: does the measured half-life follow the dial's memory?

The reference boxes are `dial:1:window=W`, which follow only the last W liked items they showed,
for each W of `--windows`, and the unbounded `dial:1`, which follows every one (all with a random
base ranking unless `--dial-options` names one). A box that forgets sooner must show a shorter
half-life; one that never forgets must keep the steering through the release. Each unit plays
ctrlbench's steer-then-release episodes (one per target: the observation `seed=N/<target>`) and
stores each episode's s0, s*, and, where steering moved the box (s* - s0 > 0.05), its half-life
(with whether it was observed or censored at the last release round R), retention area and relapse.

Per method and box, over the steered episodes:

* the Kaplan-Meier median half-life with its 95% log-log interval, and events/n
  (`ctrlsim.metrics.persistence.km_half_life`); the mean retention area and relapse share, and the
  levels s0 and s* over every measured episode, each with its 95% Student t interval;
* Spearman's rho between W and the half-life over every (window, steered episode) of the windowed
  boxes, with a 95% cluster-bootstrap interval (an episode's half-lives at every window resampled
  together). A censored half-life counts as R + 1: every one is censored at the same R, so they tie
  with each other and rank above every observed half-life;
* between two boxes a two-sided log-rank test of their half-lives (the episodes are paired by id,
  the test treats the boxes as independent samples); a pair of windows is *told apart* at
  p < 0.05, and the resolution is the smallest W step d such that every pair of windows d or more
  apart is told apart;
* the known answer: the unbounded box is censored in every steered episode (R(tau) stays above
  1/2 through the release). It holds while the release is short beside the steering: the box
  follows every steering like for ever, but a long release adds enough new likes to outweigh them.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Mapping

import numpy as np

from ctrlsim.experiments.calibrate.common import ALPHA, _name, cost_table, validity
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.metrics import persistence as P
from ctrlsim.metrics.stats import Estimate, format_estimate, mean_ci, spearman_ci

KM_HEADER = "half-life KM [95% CI] (events/n)"
KNOWN_HEADER = ["Method", "Box", "Known answer", "Observed", "Holds"]
NO_HALF_LIFE = P.HalfLife(None, None, None, 0, 0)


def window_label(window: int | None) -> str:
    return "none" if window is None else f"{window}"


# ----------------------------------------------------------------------------- collecting

def episodes(records: Mapping[str, dict]) -> dict[tuple[str, str], dict[str, dict]]:
    """(method, box) -> observation id -> its figures: s0 and s_star (every measured episode), and
    half_life, observed, area, relapse (the episodes steering moved)."""
    out: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for record in records.values():
        cell = out[(record["method"], record["box"])]
        for metric, values in record["values"].items():
            for obs_id, value in values.items():
                cell.setdefault(obs_id, {})[metric] = value
        for obs_id, flag in (record.get("observed") or {}).get("half_life", {}).items():
            cell.setdefault(obs_id, {})["observed"] = bool(flag)
    return out


def steered(eps: Mapping[str, dict]) -> dict[str, dict]:
    """The episodes with a half-life (steering moved the box), by observation id."""
    return {o: e for o, e in eps.items() if "half_life" in e}


def km(eps: Mapping[str, dict]) -> P.HalfLife:
    moved = list(steered(eps).values())
    if not moved:
        return NO_HALF_LIFE
    return P.km_half_life([e["half_life"] for e in moved], [e["observed"] for e in moved])


def mean_of(eps: Mapping[str, dict], metric: str) -> Estimate:
    return mean_ci([e[metric] for e in eps.values() if metric in e])


def ranked_half_life(episode: dict, release: int) -> float:
    """The half-life as ranked: observed ones as they are, censored ones at release + 1."""
    return float(episode["half_life"]) if episode["observed"] else float(release + 1)


def boxes(config) -> list[tuple[int | None, str]]:
    """(window, box) of every reference box, windows smallest first, the unbounded box last."""
    return [(w, config.window_box(w)) for w in config.window_grid]


# ----------------------------------------------------------------------------- statistics

def rho(config, eps_of: Mapping[tuple[str, str], dict], method: str):
    """Spearman's rho between W and the half-life over the windowed boxes' steered episodes."""
    xs, ys, ids = [], [], []
    for window, box in boxes(config):
        if window is None:
            continue
        for obs_id, episode in steered(eps_of.get((method, box), {})).items():
            xs.append(float(window))
            ys.append(ranked_half_life(episode, config.release_rounds))
            ids.append(obs_id)
    return spearman_ci(xs, ys, ids)


def log_rank(a: Mapping[str, dict], b: Mapping[str, dict]) -> tuple[float, float]:
    """(z, p) of the two-sided log-rank test between two boxes' steered episodes (NaN: undefined)."""
    first, second = list(steered(a).values()), list(steered(b).values())
    if not first or not second:
        return math.nan, math.nan
    return P.log_rank([e["half_life"] for e in first], [e["observed"] for e in first],
                      [e["half_life"] for e in second], [e["observed"] for e in second])


def pair_tests(config, eps_of, method: str) -> list[dict]:
    """Every pair of reference boxes (windows, then the unbounded one): the log-rank test."""
    grid = boxes(config)
    out = []
    for i, (wa, a) in enumerate(grid):
        for wb, b in grid[i + 1:]:
            ea, eb = eps_of.get((method, a), {}), eps_of.get((method, b), {})
            z, p = log_rank(ea, eb)
            out.append({"a": wa, "b": wb, "n_a": len(steered(ea)), "n_b": len(steered(eb)),
                        "z": None if math.isnan(z) else z, "p": None if math.isnan(p) else p})
    return out


def resolution(tests: list[dict], alpha: float = ALPHA) -> dict:
    """{"value": the smallest W step d such that every pair of windows d or more apart is told apart
    (None: not even the grid's ends are), "steps": per step d, the pairs exactly d apart told apart,
    those pairs, and their largest p (an undefined p counts as 1)}."""
    steps: dict[int, dict] = {}
    for test in tests:
        if test["a"] is None or test["b"] is None:
            continue
        step = steps.setdefault(abs(test["b"] - test["a"]), {"told_apart": 0, "pairs": 0, "max_p": 0.0})
        p = 1.0 if test["p"] is None else test["p"]
        step["pairs"] += 1
        step["told_apart"] += int(p < alpha)
        step["max_p"] = max(step["max_p"], p)
    rows = [{"delta": d, **steps[d]} for d in sorted(steps)]
    # Every larger step must hold too: a grid whose ends are not told apart resolves nothing.
    value = next((s["delta"] for n, s in enumerate(rows)
                  if all(t["told_apart"] == t["pairs"] for t in rows[n:])), None)
    return {"value": value, "steps": rows}


def known_answer(config, eps_of, method: str) -> list[str]:
    """The unbounded box's row: censored in every steered episode."""
    box = config.window_box(None)
    moved = list(steered(eps_of.get((method, box), {})).values())
    fell = sum(e["observed"] for e in moved)
    observed = f"{fell} of {len(moved)} steered episodes fell to half" if moved else "no steered episode"
    holds = "-" if not moved else ("yes" if fell == 0 else "NO")
    return [method, box, "censored in every steered episode (R(tau) > 0.5 through the release)", observed,
            holds]


# ----------------------------------------------------------------------------- tables

def _km_cell(est: P.HalfLife) -> str:
    def bound(x):
        return "censored" if x is None else f"{x:g}"

    if not est.n:
        return "-"
    return f"{bound(est.median)} [{bound(est.low)}, {bound(est.high)}] ({est.events}/{est.n})"


def _rows_of(config, eps_of, names) -> list[list]:
    rows = []
    shown = [*boxes(config), *((None, box) for box in config.compare)]
    for method in config.all_methods:
        for n, (window, box) in enumerate(shown):
            if (method, box) not in eps_of:
                continue
            eps = eps_of[(method, box)]
            measured = [e for e in eps.values() if "s0" in e]
            label = window_label(window) if n < len(config.window_grid) else "compared"
            rows.append([_name(names, method), box, label, len(measured),
                         f"{len(steered(eps))}/{len(measured)}", format_estimate(mean_of(eps, "s0"), 100),
                         format_estimate(mean_of(eps, "s_star"), 100), _km_cell(km(eps)),
                         format_estimate(mean_of(eps, "area")), format_estimate(mean_of(eps, "relapse"))])
    return rows


def half_life_table(config, eps_of, names=None) -> Table:
    header = ["Method", "Box", "W", "episodes", "steered", "s0 %", "s* %", KM_HEADER, "area", "relapse"]
    after = (f"W: the box's memory window in followed likes ('none': unbounded). Steered: episodes with s* - "
             f"s0 > {P.MIN_GAIN}; the others have no retention and count in 'episodes' only. Half-life: the "
             f"first release round with R(tau) <= 0.5, censored at R = {config.release_rounds}; the "
             "Kaplan-Meier median over steered episodes with its 95% interval ('censored': not reached). "
             "Area: mean R(tau) over the release; relapse: 1 - mean R over its last rounds; s0, s*, area "
             "and relapse: mean ± 95% t half-width over episodes (docs/persistence.md).")
    return Table.of("Half-life against the dial's memory window", _rows_of(config, eps_of, names), header,
                    after=after)


def rho_resolution_table(config, eps_of, names=None) -> Table:
    results = {m: resolution(pair_tests(config, eps_of, m)) for m in config.all_methods}
    deltas = sorted({s["delta"] for res in results.values() for s in res["steps"]})
    rows = []
    for method, res in results.items():
        corr = rho(config, eps_of, method)
        by_delta = {s["delta"]: s for s in res["steps"]}
        cells = [f"{by_delta[d]['told_apart']}/{by_delta[d]['pairs']} ({by_delta[d]['max_p']:.2g})"
                 if d in by_delta else "-" for d in deltas]
        shown = format_estimate(Estimate(corr.rho, corr.low, corr.high, corr.n), bounds=True, signed=True)
        value = "not resolved" if res["value"] is None else f"{res['value']}"
        rows.append([_name(names, method), shown, value, *cells])
    header = ["Method", "Spearman rho (W, half-life) [95% CI]", "Resolution (W step)",
              *(f"step {d}: told apart (max p)" for d in deltas)]
    after = ("rho over every (window, steered episode) of the windowed boxes; a censored half-life counts "
             f"as R + 1 = {config.release_rounds + 1}, above every observed one; 95% cluster-bootstrap "
             "interval (an episode's values at every window resampled together). Two windows are told "
             f"apart when a two-sided log-rank test of their half-lives gives p < {ALPHA}; the resolution is "
             "the smallest step d such that every pair of windows d or more apart is told apart ('not "
             "resolved': not even the grid's ends are).")
    return Table.of("Resolution: the smallest window step told apart", rows, header, after=after)


def log_rank_table(config, eps_of, names=None) -> Table:
    rows = [[_name(names, method), window_label(t["a"]), window_label(t["b"]), t["n_a"], t["n_b"],
             "-" if t["z"] is None else f"{t['z']:+.2f}", "-" if t["p"] is None else f"{t['p']:.3g}"]
            for method in config.all_methods for t in pair_tests(config, eps_of, method)]
    return Table.of("Half-lives between windows (log-rank)", rows,
                    ["Method", "W a", "W b", "n a", "n b", "z", "p"],
                    after="z > 0: window a's steering fades sooner than expected under equal half-lives; "
                          "two-sided p ('-': no steered episode, or none fell to half).")


def known_table(config, eps_of, names=None) -> Table:
    rows = [[_name(names, row[0]), *row[1:]]
            for row in (known_answer(config, eps_of, m) for m in config.all_methods)]
    return Table.of("Known answer: no window", rows, KNOWN_HEADER,
                    after="'NO' means the instrument or the box is broken, or the release is long enough to "
                          "outweigh the steering likes (docs/calibration.md); it is never a finding about a "
                          "recommender. '-': no steered episode to check.")


def persistence_tables(config, records: Mapping[str, dict]) -> list[Block]:
    eps_of = episodes(records)
    found, names = validity(records)
    options = ", ".join(config.dial_options) or "none"
    first = min(config.windows)
    windowed = config.window_box(first).replace(f"window={first}", "window=W")
    head = [f"# Calibration of ctrlbench --task persistence: {len(records)}/{len(config.keys())} units",
            f"dataset {config.dataset}; methods {', '.join(config.all_methods)}; boxes {windowed} for W = "
            f"{', '.join(map(str, sorted(config.windows)))}, and {config.window_box(None)} (no window); "
            f"dial options {options}; the lambda grid is not used. Targets {', '.join(config.targets)}; "
            f"seeds {', '.join(map(str, config.seeds))}; {config.baseline_rounds} baseline rounds (no goal), "
            f"{config.rounds} steering, {config.release_rounds} release; agents {config.agents[0]},"
            f"{config.agents[1]} (scripted methods run the second).",
            "Each observation is one episode (seed x target), paired by id across boxes."]
    blocks: list[Block] = [Text("\n".join(head)), half_life_table(config, eps_of, names),
                           rho_resolution_table(config, eps_of, names), log_rank_table(config, eps_of, names),
                           known_table(config, eps_of, names), cost_table(config, records, names)]
    if found:
        from ctrlsim.experiments.validity_card import validity_table

        blocks.append(validity_table(found))
    return blocks


# ----------------------------------------------------------------------------- figure and summary

def half_life_figure(config, records: Mapping[str, dict]):
    """Left: the KM median half-life with its 95% interval against W (an open interval drawn up to R
    and marked ^; a censored median drawn at R as ^); right: the mean retention area with its 95% CI."""
    from matplotlib.figure import Figure

    eps_of = episodes(records)
    grid = boxes(config)
    x = np.arange(len(grid))
    release = config.release_rounds
    fig = Figure(figsize=(9.2, 3.6))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for n, method in enumerate(config.all_methods):
        shift = (n - (len(config.all_methods) - 1) / 2) * 0.08
        est = [km(eps_of.get((method, box), {})) for _, box in grid]
        med = np.array([np.nan if not e.n else (e.median if e.median is not None else release) for e in est])
        (line,) = left.plot(x + shift, med, marker="o", markersize=4, label=method)
        for xi, e in zip(x + shift, est):
            if not e.n:
                continue
            low = e.low if e.low is not None else (e.median if e.median is not None else release)
            high = e.high if e.high is not None else release
            left.vlines(xi, low, high, color=line.get_color(), linewidth=1.5, alpha=0.6)
            if e.high is None or e.median is None:
                left.plot(xi, release, marker="^", color=line.get_color(), markersize=7)
        areas = [mean_of(eps_of.get((method, box), {}), "area") for _, box in grid]
        mean = np.array([a.value if a.n else np.nan for a in areas])
        right.errorbar(x + shift, mean, yerr=[[a.value - a.low if a.n > 1 else 0 for a in areas],
                                              [a.high - a.value if a.n > 1 else 0 for a in areas]],
                       marker="o", markersize=4, capsize=3, color=line.get_color(), label=method)
    left.axhline(release, color="grey", linestyle=":", linewidth=1, label=f"release ends (R = {release})")
    for ax, ylabel in ((left, "half-life (release rounds), KM median"), (right, "retention area (mean R)")):
        ax.set_xticks(x, [window_label(w) for w, _ in grid])
        ax.set_xlabel("memory window W of dial:1 (none = unbounded)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    fig.suptitle(f"Persistence calibration ({config.dataset}; 95% intervals; ^ = censored or open)")
    fig.tight_layout()
    return fig


def persistence_summary(config, records: Mapping[str, dict]) -> dict:
    """The persistence calibration as data (`RunResult.summary`): per method each box's episodes,
    steered episodes, KM half-life and mean area; rho with its interval; the log-rank tests and the
    resolution; the known answer; each method's validity card."""
    eps_of = episodes(records)
    found, _ = validity(records)
    cells: dict[str, list] = {}
    rhos: dict[str, dict] = {}
    tests: dict[str, list] = {}
    resolutions: dict[str, dict] = {}
    for method in config.all_methods:
        for window, box in [*boxes(config), *((None, b) for b in config.compare)]:
            if (method, box) not in eps_of:
                continue
            eps = eps_of[(method, box)]
            est = km(eps)
            cells.setdefault(method, []).append({
                "box": box, "window": window, "compared": box in config.compare,
                "episodes": sum("s0" in e for e in eps.values()), "steered": len(steered(eps)),
                "half_life": {"median": est.median, "low": est.low, "high": est.high, "events": est.events,
                              "n": est.n},
                **{m: mean_of(eps, m).to_dict() for m in ("area", "relapse", "s0", "s_star")}})
        corr = rho(config, eps_of, method)
        rhos[method] = Estimate(corr.rho, corr.low, corr.high, corr.n).to_dict()
        tests[method] = pair_tests(config, eps_of, method)
        resolutions[method] = resolution(tests[method])
    known = [known_answer(config, eps_of, m) for m in config.all_methods]
    return {"protocol": config.protocol, "task": config.task, "methods": list(config.all_methods),
            "windows": sorted(config.windows), "boxes": [box for _, box in boxes(config)],
            "release_rounds": config.release_rounds, "seeds": list(config.seeds),
            "compare": list(config.compare),
            "cells": cells, "rho": rhos, "log_rank": tests, "resolution": resolutions,
            "known_answers": {"title": "table", "header": KNOWN_HEADER, "rows": known},
            "validity": {m: c.to_dict() for m, c in found.items()}}
