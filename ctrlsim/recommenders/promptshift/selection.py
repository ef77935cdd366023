"""PromptShift's validation-then-test protocol over stored lists (Gan & Dong, section 5.1).

Everything here works on lists the engine already holds (no LLM call once they
are generated or preloaded): the rerankers B0-B3 reorder each cued pool and the
engine scores it with `ctrlsim.metrics.promptshift.evaluate_ranking`. The fuzzy
matching threshold and B3's parameters are chosen on the validation positives
and frozen before the test positives are read once (`validate_then_test`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ctrlsim.recommenders.promptshift.defaults import MATCH_THRESHOLDS
from ctrlsim.recommenders.promptshift.engine import PromptShiftEngine
from ctrlsim.recommenders.promptshift.rerankers import (
    PAPER_PARAMS,
    PARAM_GRID,
    VARIANTS,
    RerankParams,
    make_reranker,
    select_params,
)


def metric_names(k: int) -> list[str]:
    """The per-user metrics of one reranked list, in table order."""
    return ["drift", "slice_shift", f"difficulty@{k}", f"hit_rate@{k}", f"mrr@{k}", f"ndcg@{k}"]


def select_match_threshold(engine: PromptShiftEngine, users: Sequence[str],
                           thresholds: Sequence[float] = MATCH_THRESHOLDS) -> tuple[float, list[dict]]:
    """The fuzzy threshold whose matched lists hit the most validation positives; ties: the strictest.

    A looser threshold matches more titles, but a wrong match almost never is
    one of the user's held-out validation items, so it is chosen only when its
    extra matches hit validation positives. The engine is left on the choice.
    """
    rows = []
    for t in thresholds:
        engine.set_match_threshold(t)
        hits = matched = total = 0
        for user in users:
            relevant = engine.profile(user).positives("valid")
            lists, _ = engine.lists_for(user, engine.user_conditions(user))
            for cand in lists:
                ids = {i for i in cand.item_ids if i is not None}
                hits += len(ids & relevant)
                matched += len(ids)
                total += len(cand.item_ids)
        rows.append({"threshold": float(t), "validation_hits": hits, "matched": matched, "titles": total})
    best = max(rows, key=lambda r: (r["validation_hits"], r["threshold"]))
    engine.set_match_threshold(best["threshold"])
    return best["threshold"], rows


def reranker_set(engine: PromptShiftEngine, params: RerankParams,
                 b3_params: RerankParams | None = None) -> dict:
    """B0-B3; `b3_params` (validation-selected) replace `params` for B3 only."""
    kw = {"slice_names": engine.slice_names, "slice_means": engine.slice_means}
    return {v: make_reranker(v, engine.slice_table, params=b3_params if v == "B3" and b3_params else params,
                             **kw) for v in VARIANTS}


def evaluate_users(engine: PromptShiftEngine, users: Sequence[str], rerankers: Mapping,
                   part: str) -> list[dict]:
    """One record per (user, scenario): B0-B3 metrics against `part`'s positives, and the prompt effect."""
    out = []
    for user in users:
        history = engine.history_slots(user)
        for scenario in engine.data.scenarios:
            ep = engine.episode(user, scenario)
            cands = engine.candidate_slots(ep)
            metrics = {v: engine.evaluate(ep, r.order(cands, ep.slice_id, history), part=part)
                       for v, r in rerankers.items()}
            out.append({"user": user, "scenario": scenario, "slice": ep.slice_id,
                        "mainstreamness": ep.mainstreamness, "metrics": metrics,
                        "prompt_effect": engine.prompt_effect(ep),
                        "matches": {c.condition: c.counts() for c in ep.lists}})
    return out


def select_b3_params(engine: PromptShiftEngine, users: Sequence[str], params: RerankParams,
                     k: int) -> tuple[RerankParams, dict]:
    """B3's parameters chosen on validation positives over `PARAM_GRID` (see `select_params`)."""
    names = metric_names(k)
    base = evaluate_users(engine, users, reranker_set(engine, params), "valid")
    baseline = {m: float(np.mean([r["metrics"]["B0"][m] for r in base])) for m in names}

    def evaluate(point: RerankParams) -> dict:
        recs = evaluate_users(engine, users, {"B3": make_reranker("B3", engine.slice_table, params=point,
                                                                  slice_names=engine.slice_names,
                                                                  slice_means=engine.slice_means)}, "valid")
        return {m: float(np.mean([r["metrics"]["B3"][m] for r in recs])) for m in names}

    chosen, grid = select_params(evaluate, baseline, grid=PARAM_GRID, k=k, base=params)
    return chosen, {"chosen": chosen.to_dict(), "paper": PAPER_PARAMS.to_dict(), "grid": grid,
                    "validation_baseline": baseline}


def validate_then_test(engine: PromptShiftEngine, users: Sequence[str], *, match_threshold: float | None,
                       select_b3: bool, params: RerankParams = PAPER_PARAMS) -> tuple[list[dict], dict]:
    """Freeze the matching threshold and B3's parameters on validation, then score the test part once.

    `match_threshold` fixes the threshold (None: `select_match_threshold`);
    `select_b3=False` keeps `params` for B3. Returns the test records of
    `evaluate_users` and what was selected.
    """
    selection: dict = {}
    if match_threshold is None:
        threshold, grid = select_match_threshold(engine, users)
        selection["match_threshold"], selection["match_grid"] = threshold, grid
    else:
        engine.set_match_threshold(match_threshold)
        selection["match_threshold"] = match_threshold
    b3 = None
    if select_b3:
        b3, selection["b3"] = select_b3_params(engine, users, params, engine.k)
    return evaluate_users(engine, users, reranker_set(engine, params, b3), "test"), selection


__all__ = ["evaluate_users", "metric_names", "reranker_set", "select_b3_params", "select_match_threshold",
           "validate_then_test"]
