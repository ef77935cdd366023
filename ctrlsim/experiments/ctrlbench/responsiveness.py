"""Do the buttons work? `ctrlsim ctrlbench --task responsiveness`: counterfactual arms of one episode.

Each (method, box, target, seed) episode is played with negative feedback enabled and forked at
`--fork-round` F: in the skip arm every probe plays its policy as usual; in the arm of each
feedback action (`--feedback-actions`: not_interested, dislike, block) every probe additionally
marks the first item of its round-F slate it did not like (not interested, disliked, or its first
tag blocked). Every arm then goes on for `--rounds` H rounds. The fork is a replay: each arm is
the same seeded episode played again with the feedback added at round F, and its rounds 1..F are
checked equal to the skip arm's (a difference is an error, never a result), so the response
cache makes the shared prefix free.

responsiveness = 1 - S_fb / S_skip (`ctrlsim.metrics.responsiveness`), S the items similar to the
dismissed one (sharing a tag with it; for a block, carrying the blocked tag) on the recommender's
slates in rounds F+1..F+H, pooled over dismissed items and seeds with a delta-method interval.
The record is the skip arm's episode record plus `responsiveness`: per probe the dismissed item,
its tags, the blocked tag and the similar counts of each arm, and each arm's post-fork slates.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig, Episode
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.metrics.responsiveness import implied_strength, responsiveness, similar_count
from ctrlsim.metrics.stats import format_estimate

SKIP = "skip"
CODES = {"not_interested": 1, "dislike": 2}
# Live figures for comparison (Mozilla's YouTube study, 2022): the share of unwanted
# recommendations each button prevented.
LIVE = {"dislike": "~12% (YouTube dislike)", "not_interested": "~11% (YouTube not interested)",
        "block": "~43% (YouTube don't recommend channel)"}


class Dismiss:
    """`play_population`'s hook for one arm: at the fork round each probe picks the first slate
    position it did not like on a recommender slate and applies `action` to that item (SKIP: only
    remembers the pick)."""

    def __init__(self, action: str, fork_round: int, item_tags: Mapping[str, tuple[str, ...]]):
        self.action, self.fork_round, self.item_tags = action, fork_round, item_tags
        self.picked: dict[str, dict[str, Any]] = {}  # agent -> {"item", "position", "block"}

    def __call__(self, round_no: int, actions: dict, infos: dict) -> dict:
        if round_no != self.fork_round:
            return actions
        out = dict(actions)
        for agent, action in actions.items():
            info = infos[agent]
            likes = np.asarray(action["likes"]).astype(int)
            free = [p for p, item in enumerate(info["slate_item_ids"]) if not likes[p]]
            if not free or info.get("slate_source") != "recommender":
                continue
            position, item = free[0], info["slate_item_ids"][free[0]]
            tags = self.item_tags[item]
            self.picked[agent] = {"item": item, "position": position, "block": tags[0] if tags else None}
            if self.action in CODES:
                feedback = [0] * len(likes)
                feedback[position] = CODES[self.action]
                out[agent] = {**action, "feedback": feedback}
            elif self.action == "block" and tags:
                out[agent] = {**action, "block": tags[0]}
        return out


def run_responsiveness(config: CtrlBenchConfig, unit: UnitContext, episode: Episode, play) -> dict:
    """The skip arm's record with every arm's post-fork slates and similar counts; `play(config,
    unit, episode, bars=..., intervene=...)` plays one arm (`units.run_episode`)."""
    from ctrlsim.errors import CtrlsimError
    from ctrlsim.experiments.ctrlbench.inputs import run_box

    dataset = unit.dataset(config.dataset)
    item_tags = {str(i): tuple(t) for i, t in zip(dataset.item_ids, dataset.items["tags"])}
    fork, horizon = config.fork_round, config.rounds
    arms: dict[str, tuple[dict, Dismiss]] = {}
    for action in (SKIP, *config.feedback_actions):
        hook = Dismiss(action, fork, item_tags)
        arms[action] = (play(config, unit, episode, bars=action == SKIP, intervene=hook), hook)
    record, skip_hook = arms[SKIP]
    before = [[r["slate"] for r in p["rounds"][:fork]] for p in record["probes"]]
    for action, (arm, hook) in arms.items():
        if [[r["slate"] for r in p["rounds"][:fork]] for p in arm["probes"]] != before \
                or hook.picked != skip_hook.picked:
            raise CtrlsimError(f"responsiveness arm {action!r} differs from the skip arm before the fork "
                               f"(rounds 1..{fork}): the episode is not reproducible, so no arm is a "
                               "counterfactual of the other (sampling without a seed? a stateful box?)")
    probes = []
    for agent, pick in sorted(skip_hook.picked.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[-1])):
        n = int(agent.rsplit("_", 1)[-1])  # the population env's agent probe_<n> is the record's n-th probe
        item_tag_set = item_tags[pick["item"]]
        counts = {}
        slates = {}
        for action, (arm, _) in arms.items():
            after = [r["slate"] for r in arm["probes"][n]["rounds"][fork:fork + horizon]
                     if r["source"] == "recommender"]
            slates[action] = after
            counts[action] = {"similar": similar_count(after, item_tags, item_tag_set),
                              "block_similar": similar_count(after, item_tags, [pick["block"]])
                              if pick["block"] else 0,
                              "shown": sum(len(s) for s in after)}
        probes.append({"probe_id": record["probes"][n]["probe_id"], "item": pick["item"],
                       "position": pick["position"], "tags": list(item_tag_set), "block": pick["block"],
                       "counts": counts, "slates_after": slates})
    record["responsiveness"] = {"fork_round": fork, "horizon": horizon,
                                "actions": list(config.feedback_actions), "probes": probes}
    record["negative_feedback"] = run_box(unit, config, episode.box).negative_feedback
    return record


def feedback_counts(records, action: str) -> tuple[list[int], list[int], list[int]]:
    """(S_fb, S_skip, items shown in the skip arm) per dismissed item over `records` for `action`
    (a block counts the items carrying the blocked tag)."""
    key = "block_similar" if action == "block" else "similar"
    fb, skip, shown = [], [], []
    for record in records:
        for probe in record["responsiveness"]["probes"]:
            if action in probe["counts"] and (action != "block" or probe["block"]):
                fb.append(probe["counts"][action][key])
                skip.append(probe["counts"][SKIP][key])
                shown.append(probe["counts"][SKIP]["shown"])
    return fb, skip, shown


def _strength(est, skip: list[int], shown: list[int]) -> str:
    """The implied strength with its interval (the map from R is increasing, so bounds map to bounds)."""
    if not sum(shown) or np.isnan(est.value):
        return "-"
    density = sum(skip) / sum(shown)
    value, low, high = (implied_strength(x, density) for x in (est.value, est.low, est.high))
    if np.isnan(value):
        return "n/a (every item shown is similar)"
    bounds = "" if np.isnan(low) or np.isnan(high) else f" [{low:.2f}, {high:.2f}]"
    return f"{value:.2f}{bounds} (p = {density:.2f})"


def responsiveness_table(config, records: Mapping[str, dict]) -> Table:
    """Button effectiveness per box, method and action: 1 - S_fb / S_skip with its 95% interval."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for record in records.values():
        if "responsiveness" in record:
            cells.setdefault((record["recommender"], record["method"]), []).append(record)
    header = ["Black-Box", "Method", "Action", "episodes", "items dismissed", "similar shown: skip arm",
              "with feedback", "responsiveness [95% CI]", "implied strength [95% CI]",
              "what the box does with it", "live figure"]
    rows = []
    for box in config.recommenders:
        for method in config.all_methods:
            recs = cells.get((box, method))
            if not recs:
                continue
            for action in config.feedback_actions:
                fb, skip, shown = feedback_counts(recs, action)
                est = responsiveness(fb, skip)
                cell = "n/a (nothing similar in the skip arm)" if not sum(skip) else \
                    format_estimate(est, 100, 1, bounds=True) + "%"
                rows.append([box, recs[0].get("label", method), action, len(recs), len(fb), sum(skip),
                             sum(fb), cell, _strength(est, skip, shown),
                             recs[0].get("negative_feedback", "?"), LIVE[action]])
    after = (f"Each episode forks at round {config.fork_round}: each probe marks the first item of its slate "
             "it did not like (not interested, dislike, or blocks its first tag) in one arm and skips it in "
             f"the skip arm; both go on for {config.rounds} rounds with the same seeds. Similar = sharing a "
             "tag with the dismissed item (for block: carrying the blocked tag), on recommender slates "
             "after the fork. Responsiveness = 1 - (similar shown with feedback) / (similar shown in the "
             "skip arm), pooled over the dismissed items of every episode, with the ratio estimator's "
             "95% interval: 1 = every similar item prevented, 0 = no effect. Implied strength = R / (1 - p "
             "+ p R), p the share of similar items among those the skip arm showed: the share of similar "
             "items the button removed from what the box would show next (R understates it where similar "
             "items are common; a dial box with neg=mu has strength mu). A box whose 'what it does' "
             "says ignored treats the buttons as no-ops: its interval should contain 0. The live figures "
             "are Mozilla's YouTube study (2022), the same form measured on real accounts "
             "(docs/responsiveness.md).")
    return Table.of("Do the buttons work? Responsiveness to negative feedback", rows, header, after=after)


def responsiveness_blocks(config, records: Mapping[str, dict]) -> list[Block]:
    if not any("responsiveness" in r for r in records.values()):
        return [Text("No responsiveness episode finished yet.")]
    return [responsiveness_table(config, records)]


def run_summary(config, records: Mapping[str, dict]) -> dict:
    """A responsiveness run's numbers as data (`RunResult.summary`; the audit's "Do the buttons work?"
    reads them): per box, method and action the items dismissed, the similar items shown in each arm,
    the responsiveness and the implied strength with their intervals, and the box's own statement."""
    cells: dict[str, dict[str, dict]] = {}
    for record in records.values():
        if "responsiveness" in record:
            cells.setdefault(record["recommender"], {}).setdefault(record["method"], {"records": []})[
                "records"].append(record)
    out: dict[str, dict[str, dict]] = {}
    for box, per_method in cells.items():
        for method, cell in per_method.items():
            recs = cell["records"]
            actions = {}
            for action in config.feedback_actions:
                fb, skip, shown = feedback_counts(recs, action)
                est = responsiveness(fb, skip)
                density = sum(skip) / sum(shown) if sum(shown) else float("nan")
                strength = {k: implied_strength(getattr(est, k), density) for k in ("value", "low", "high")}
                actions[action] = {"items": len(fb), "skip": sum(skip), "feedback": sum(fb),
                                   "responsiveness": est.to_dict(), "density": density,
                                   "strength": {k: None if np.isnan(v) else v for k, v in strength.items()},
                                   "live": LIVE[action]}
            out.setdefault(box, {})[method] = {"episodes": len(recs), "actions": actions,
                                               "negative_feedback": recs[0].get("negative_feedback")}
    return {"task": "responsiveness", "fork_round": config.fork_round, "horizon": config.rounds,
            "actions": list(config.feedback_actions), "boxes": list(config.recommenders),
            "methods": list(config.all_methods), "cells": out}
