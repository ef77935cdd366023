"""PromptShift's observation function: one (method, box, seed) of PromptShift as calibration data.

A method is one of PromptShift's rerankers (B0-B3, the paper's parameters) and a box an LLM list
generator (an LLM spec) or the reference generator (`dial:<lambda>`); `observe` returns RBO Drift
and SliceShift per `seed=N/<user>/<scenario>`. `ctrlsim calibrate` and the audit reach it through
`RUNNER.observation`.
"""
from __future__ import annotations

from typing import Any

from ctrlsim.experiments.config import check_known_methods
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.promptshift.config import PromptShiftConfig
from ctrlsim.experiments.promptshift.units import build_data, make_engine
from ctrlsim.experiments.runner import Observation
from ctrlsim.recommenders.dial import is_dial

METHODS = ("b0", "b1", "b2", "b3")


def config_for(cal: Any, method: str, box: str, seed: int) -> PromptShiftConfig:
    llm = cal.llm if is_dial(box) else box
    return PromptShiftConfig(llms=(llm,), dataset=cal.dataset, users=cal.users, seed=seed,
                             scenarios=cal.scenarios, n_candidates=cal.n_candidates, k=cal.k)


def check_methods(methods: tuple[str, ...]) -> None:
    check_known_methods("promptshift", methods, METHODS)


def check_compare(box: str) -> None:
    from ctrlsim.backends.spec_check import check_llm_spec

    if not is_dial(box):  # an LLM list generator: checked now, not in every unit
        check_llm_spec(box, name="compare")


def check(cal: Any, method: str, box: str, unit: UnitContext) -> None:
    """Every seed's user sample can be drawn: no model loads."""
    from ctrlsim.recommenders.promptshift.data import sample_users

    for seed in cal.seeds:
        cfg = config_for(cal, method, box, seed)
        sample_users(build_data(cfg, unit), cfg.users, seed)


def llms(cal: Any, methods: tuple[str, ...], boxes: list[str]) -> list[str]:
    """Every box that is not a dial is an LLM (its replies go to the calibration's caches)."""
    return [b for b in boxes if not is_dial(b)]


def observe(cal: Any, method: str, box: str, seed: int, unit: UnitContext) -> dict:
    """Drift and SliceShift of the method's reranking of every sampled user's cued lists."""
    from ctrlsim.recommenders.promptshift.data import sample_users
    from ctrlsim.recommenders.promptshift.rerankers import PAPER_PARAMS
    from ctrlsim.recommenders.promptshift.selection import reranker_set

    cfg = config_for(cal, method, box, seed)
    data = build_data(cfg, unit)
    users = sample_users(data, cfg.users, seed)
    # The runner's own engine: a dial spec gets the dial generator, an LLM spec the LLM's lists.
    engine = make_engine(cfg, data, box if is_dial(box) else unit.llm(box), users=users)
    reranker = reranker_set(engine, PAPER_PARAMS)[method.upper()]
    values: dict[str, dict[str, float]] = {"drift": {}, "slice_shift": {}}
    unmatched = parse_errors = 0
    for user in users:
        history = engine.history_slots(user)
        for scenario in cfg.scenarios:
            episode = engine.episode(user, scenario)
            order = reranker.order(engine.candidate_slots(episode), episode.slice_id, history)
            metrics = engine.evaluate(episode, order)
            obs = f"seed={seed}/{user}/{scenario}"
            values["drift"][obs] = float(metrics["drift"])
            values["slice_shift"][obs] = float(metrics["slice_shift"])
            counts = episode.cue.counts()
            unmatched += counts["unmatched"]
            parse_errors += counts["parse_error"]
    details = {"users": len(users), "unmatched_titles": unmatched, "parse_errors": parse_errors,
               **engine.generated_usage}
    about = engine.config
    return {"values": values, "known": {}, "details": details,
            "box_identity": about.get("generator") or about.get("llm"),
            "llm": None if is_dial(box) else about.get("llm")}


OBSERVATION = Observation(
    config_for=config_for, observe=observe, check=check, cache_uses=lambda cal, m, b: {}, llms=llms,
    check_methods=check_methods, check_compare=check_compare, metrics=("drift", "slice_shift"),
    share_metrics=("drift",),
    default_methods=("b0", "b3"), dial_kind="dial")
