"""SteerEval's observation function: one (method, box, seed) of SteerEval as calibration data.

A method is the intervention of one of SteerEval's conditions (`METHODS`), applied on the unit's
ranker (`box`: SteerEval's `llm` or `embedding` ranker, or a `dial-profile` box); `observe` runs
every feasible scenario once and returns Delta-AUC_t per `seed=N/<user>/<tag>/<direction>`.
`ctrlsim calibrate` and the audit reach it through `RUNNER.observation`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import check_known_methods
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.runner import Observation
from ctrlsim.experiments.steereval.config import SteerEvalConfig
from ctrlsim.experiments.steereval.units import (
    CONDITIONS,
    intervention_policy,
    make_env,
    prepare_dataset,
    scenarios_for,
)
from ctrlsim.recommenders.dial import is_dial

# Each method is the intervention of one of SteerEval's conditions, on the unit's ranker.
METHODS = {"template": "default", "stronger": "stronger", "weaker": "weaker",
           "llm-append": "llm-append", "llm-rewrite": "llm-rewrite"}
RANKERS = ("llm", "embedding")  # the real boxes a calibration can place: SteerEval's two rankers


def config_for(cal: Any, method: str, box: str, seed: int) -> SteerEvalConfig:
    return SteerEvalConfig(llm=cal.llm, dataset=cal.dataset, tags=cal.tags, users=cal.users,
                           pool_size=cal.pool_size, seed=seed, conditions=("default",))


def check_methods(methods: tuple[str, ...]) -> None:
    check_known_methods("steereval", methods, METHODS)


def check_compare(box: str) -> None:
    if box not in RANKERS and not is_dial(box):
        raise ConfigError(f"compare: steereval compares its rankers {RANKERS} or a dial spec, not {box!r}")


def _scenarios(cfg: SteerEvalConfig, unit: UnitContext) -> tuple[tuple, list]:
    """(data, scenarios) of a SteerEval config, once per process (they need no model)."""
    def build():
        data = prepare_dataset(cfg, unit)
        return data, scenarios_for(cfg, data)[0]
    return unit.once(f"calibrate-steereval:{cfg!r}", build)


def check(cal: Any, method: str, box: str, unit: UnitContext) -> None:
    for seed in cal.seeds:
        if not _scenarios(config_for(cal, method, box, seed), unit)[1]:
            raise ConfigError(f"steereval: no feasible scenario for tags {list(cal.tags)} at "
                              f"pool_size={cal.pool_size} (seed {seed})")


def needs_llm(method: str, box: str) -> bool:
    intervention = CONDITIONS[METHODS[method]].intervention
    return intervention in ("llm-append", "llm-rewrite") or box == "llm"


def llms(cal: Any, methods: tuple[str, ...], boxes: list[str]) -> list[str]:
    """The LLMs the units load (their replies go to the calibration's caches)."""
    return [cal.llm] if any(needs_llm(m, b) for m in methods for b in boxes) else []


def observe(cal: Any, method: str, box: str, seed: int, unit: UnitContext) -> dict:
    """Delta-AUC_t of every feasible scenario, with the edits refused or unchanged and the tokens."""
    from ctrlsim.envs.steereval_env import to_observation_text

    cfg = config_for(cal, method, box, seed)
    data, scenarios = _scenarios(cfg, unit)
    cond = dataclasses.replace(CONDITIONS[METHODS[method]], ranker=box)
    uses_llm = needs_llm(method, box)
    model: Any = unit.llm(cal.llm) if uses_llm else cal.llm
    policy = intervention_policy(cond, model)
    env = make_env(cfg, data, cond, model)
    start = model.meter.total if uses_llm else None
    values: dict[str, float] = {}
    problems = 0
    for sc in scenarios:
        obs, info = env.reset(options={"scenario": sc})
        steered = to_observation_text(policy.act(obs, info))
        _, reward, _, _, figures = env.step(steered)
        values[f"seed={seed}/{sc.user_id}/{sc.tag}/{sc.direction}"] = float(reward)
        problems += bool(set(figures.get("edit_problems", ())) & {"empty", "refusal", "unchanged"})
    details: dict[str, Any] = {"scenarios": len(scenarios), "edits_refused_or_unchanged": problems}
    if start is not None:
        total = model.meter.total
        details["tokens"] = {"prompt": total.prompt_tokens - start.prompt_tokens,
                             "completion": total.completion_tokens - start.completion_tokens}
        if total.unknown_calls - start.unknown_calls:  # calls whose server sent no counts
            details["tokens"]["unknown_calls"] = total.unknown_calls - start.unknown_calls
    engine = env.engine
    return {"values": {"delta_auc": values}, "known": {}, "details": details,
            "box_identity": engine.recommender().identity,
            "llm": model.identity if uses_llm else None}


OBSERVATION = Observation(
    config_for=config_for, observe=observe, check=check, cache_uses=lambda cal, m, b: {}, llms=llms,
    check_methods=check_methods, check_compare=check_compare, metrics=("delta_auc",),
    default_methods=("template", "stronger", "weaker"), dial_kind="dial-profile")
