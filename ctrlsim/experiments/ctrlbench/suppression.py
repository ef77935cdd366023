"""Steering away: the suppression task's tables and figure (`ctrlsim ctrlbench --task suppression`).

A suppression run plays every (method, box, target, seed) twice with the same phases (baseline,
steering, release): "away", probes who start from histories rich in the target and want to see
less of it, and "toward", probes with ordinary histories who want to see more of it (persistence's
episode). Each direction gets persistence's retention table (`persistence.retention_table`; away
episodes read on the complement), and the asymmetry table pairs the two directions on the same
box, target and seed: the toward gain s* - s0 against the away reduction s0 - s*, in share points
and as a share of the room each direction had (1 - s0 toward, s0 away).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ctrlsim.experiments.ctrlbench.persistence import (
    episode_persistence,
    log_rank_table,
    persistence_cells,
    retention_table,
    steers_away,
)
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.metrics.stats import format_estimate, mean_ci, paired_comparison


def direction_effects(record: dict) -> dict | None:
    """One episode's levels and its effect in its own direction: the gain s* - s0 toward, the
    reduction s0 - s* away, and that effect over the room it had (None where there was none)."""
    levels = episode_persistence(record)
    s0, s_star = levels["s0"], levels["s_star"]
    if s0 is None:  # a round without a recommender slate
        return None
    away = steers_away(record)
    effect, room = (s0 - s_star, s0) if away else (s_star - s0, 1.0 - s0)
    return {"s0": s0, "s_star": s_star, "effect": effect, "room": room,
            "relative": effect / room if room > 0 else None}


def paired_directions(records: Mapping[str, dict]) -> dict[tuple[str, str, str], list[tuple[dict, dict]]]:
    """(box, method, target) -> the (toward, away) effects of each seed both directions finished."""
    sides: dict[tuple[str, str, str, int], dict[str, dict]] = {}
    for record in records.values():
        if "phases" not in record or "direction" not in record:
            continue
        effects = direction_effects(record)
        if effects is not None:
            key = (record["recommender"], record["method"], record["target"], int(record["seed"]))
            sides.setdefault(key, {})[record["direction"]] = effects
    out: dict[tuple[str, str, str], list[tuple[dict, dict]]] = {}
    for (box, method, target, _), both in sorted(sides.items(), key=lambda kv: kv[0][3]):
        if "toward" in both and "away" in both:
            out.setdefault((box, method, target), []).append((both["toward"], both["away"]))
    return out


def steering_likes(records, targets: Mapping[str, frozenset[str]]) -> tuple[int, int, int, int]:
    """Over `records`' steering rounds on recommender slates: (target items shown, of them liked,
    other items shown, of them liked), `targets` the items of each target: whether probes told to
    see less of the target act on it."""
    counts = [0, 0, 0, 0]
    for record in records:
        target = targets[record["target"]]
        for probe in record["probes"]:
            for r in probe["rounds"]:
                if r.get("phase") != "steer" or r["source"] != "recommender":
                    continue
                liked = set(r["liked"])
                for item in r["slate"]:
                    kind = 0 if item in target else 2
                    counts[kind] += 1
                    counts[kind + 1] += item in liked
    return counts[0], counts[1], counts[2], counts[3]


def _rate(liked: int, shown: int) -> str:
    return f"{100 * liked / shown:.0f} ({liked}/{shown})" if shown else "-"


def _levels(effects: list[dict]) -> str:
    s0, s_star = mean_ci([e["s0"] for e in effects]), mean_ci([e["s_star"] for e in effects])
    return f"{100 * s0.value:.1f} → {100 * s_star.value:.1f}"


def asymmetry_table(config, records: Mapping[str, dict], targets: Mapping[str, frozenset[str]]) -> Table:
    """Toward against away on the same box, target and seed: effects, their paired difference with
    its 95% CI and Wilcoxon p, and the same for the effects relative to the room each had; and how
    often probes steering away liked targets and other items (`targets`: each target's items)."""
    labels = {r["method"]: r.get("label", r["method"]) for r in records.values()}
    pairs = paired_directions(records)
    header = ["Black-Box", "Method", "Target", "pairs", "toward s0 → s* (%)", "toward gain (pp)",
              "away s0 → s* (%)", "away reduction (pp)", "toward - away (pp) ± 95% CI", "Wilcoxon p",
              "gain / room", "reduction / room", "toward - away (room) ± 95% CI",
              "away: targets liked (%)", "away: others liked (%)"]
    rows = []
    for box in config.recommenders:
        for method in config.all_methods:
            for target in config.targets:
                got = pairs.get((box, method, target))
                if not got:
                    continue
                toward, away = [t for t, _ in got], [a for _, a in got]
                cmp = paired_comparison([t["effect"] for t in toward], [a["effect"] for a in away])
                p = "-" if cmp.p_wilcoxon != cmp.p_wilcoxon else f"{cmp.p_wilcoxon:.3g}"
                both = [(t["relative"], a["relative"]) for t, a in got
                        if t["relative"] is not None and a["relative"] is not None]
                room = paired_comparison([t for t, _ in both], [a for _, a in both]) if both else None
                rows.append([box, labels.get(method, method), target, len(got), _levels(toward),
                             format_estimate(mean_ci([t["effect"] for t in toward]), 100),
                             _levels(away), format_estimate(mean_ci([a["effect"] for a in away]), 100),
                             format_estimate(cmp.difference, 100), p,
                             format_estimate(mean_ci([t["relative"] for t in toward])),
                             format_estimate(mean_ci([a["relative"] for a in away])),
                             "-" if room is None else format_estimate(room.difference)])
                away_records = [r for r in records.values() if r.get("direction") == "away"
                                and (r["recommender"], r["method"], r["target"]) == (box, method, target)]
                shown_t, liked_t, shown_o, liked_o = steering_likes(away_records, targets)
                rows[-1] += [_rate(liked_t, shown_t), _rate(liked_o, shown_o)]
    after = ("Each pair: the same box, target and seed steered toward the target from ordinary histories "
             "and away from it from histories rich in it (at least half of the seed items carry it). Gain "
             "= s* - s0 toward, reduction = s0 - s* away (target shares of the recommender slates, s0 the "
             "baseline mean, s* the mean of the last steering rounds); toward - away > 0: the box follows "
             "steering toward the target more than away from it. Room: 1 - s0 toward, s0 away (the most "
             "either could move). Mean ± 95% t half-width over pairs; Wilcoxon signed-rank p, two-sided "
             "('-': no non-zero difference). Away: targets / others liked = the share of the target (other) "
             "items shown while steering away that the probes liked: a probe acting on the away goal likes "
             "far fewer targets than others (the oracle none).")
    return Table.of("Toward or away: the asymmetry of steering", rows, header, after=after)


def suppression_blocks(config, records: Mapping[str, dict]) -> list[Block]:
    if not any("direction" in r for r in records.values()):
        return [Text("No suppression episode finished yet.")]
    toward, away = persistence_cells(config, records), persistence_cells(config, records, away=True)
    from ctrlsim.experiments.context import UnitContext
    from ctrlsim.experiments.ctrlbench.inputs import target_items

    dataset = UnitContext().dataset(config.dataset)
    targets = {t: target_items(dataset, t) for t in config.targets}
    blocks: list[Block] = [asymmetry_table(config, records, targets),
                           retention_table(config, away, away=True), retention_table(config, toward)]
    ranks = (log_rank_table(away, "Half-lives of the suppression between boxes (log-rank)"),
             log_rank_table(toward, "Half-lives of steering toward between boxes (log-rank)"))
    return blocks + [t for t in ranks if t is not None]


def share_figure(config, records: Mapping[str, dict]):
    """The target share per round (mean over episodes), toward and away, one panel per box, with
    the phase boundaries marked."""
    from matplotlib.figure import Figure

    plan = config.phase_plan()
    boxes = list(config.recommenders)
    fig = Figure(figsize=(4.4 * len(boxes), 3.3))
    series: dict[tuple[str, str, str], list[list[float]]] = {}
    labels: dict[str, str] = {}
    for record in records.values():
        shares = (record.get("persistence") or {}).get("target_share")
        if shares and "direction" in record and None not in shares:
            key = (record["recommender"], record["method"], record["direction"])
            series.setdefault(key, []).append(shares)
            labels[record["method"]] = record.get("label", record["method"])
    for n, box in enumerate(boxes):
        ax = fig.add_subplot(1, len(boxes), n + 1)
        for method in config.all_methods:
            for direction, style in (("toward", "-"), ("away", "--")):
                curves = series.get((box, method, direction))
                if curves:
                    mean = 100 * np.mean(np.asarray(curves, dtype=float), axis=0)
                    ax.plot(np.arange(1, len(mean) + 1), mean, style, marker="o", markersize=3,
                            label=f"{labels[method]} {direction}")
        for edge in (plan.baseline + 0.5, plan.baseline + plan.steer + 0.5):
            ax.axvline(edge, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(box)
        ax.set_xlabel("round (baseline | steering | release)")
        ax.set_ylabel("target share of the slate (%)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("Steering toward and away: the target's share of the slates (mean over episodes)")
    fig.tight_layout()
    return fig
