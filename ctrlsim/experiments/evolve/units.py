"""evolve's evaluation units (the super probes' Task 1 rounds, Task 2 levels) and what they share
with the loop: the dataset, the box and the decision settings."""
from __future__ import annotations

from dataclasses import dataclass

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.evolve.config import EvolveConfig
from ctrlsim.experiments.runner import RunContext


def run_dataset(config: EvolveConfig):
    """The dataset, once per process: the loop's task and the black box must share one object."""
    from ctrlsim.experiments.units import cached_dataset

    return cached_dataset(config.dataset)


def run_box(config: EvolveConfig):
    from ctrlsim.experiments.executor import worker_cache
    from ctrlsim.recommenders import make_recommender

    return worker_cache(f"evolve-box:{config.dataset}:{config.recommender}",
                        lambda: make_recommender(config.recommender, run_dataset(config), mask_shown=True))


def decision_settings(config: EvolveConfig, *, evaluation: bool = False):
    """How probes decide in the loop's interaction phases, or (`evaluation`) in the evaluation
    rounds, under the same setting `ctrlsim ctrlbench` uses, so one roster gets one score."""
    from ctrlsim.agents import DecisionSettings

    shared = dict(target_visible=config.target_visible, allow_search=config.allow_search,
                  decision=config.decision, threshold=config.decision_threshold)
    if evaluation:
        return DecisionSettings(memory_rounds=config.eval_memory_rounds, temperature=config.eval_temperature,
                                conversation=config.eval_conversation, **shared)
    return DecisionSettings(memory_rounds=config.memory_rounds, temperature=config.temperature,
                            conversation=config.conversation, **shared)

@dataclass(frozen=True)
class EvaluationUnit:
    """What an evaluation unit needs: the config, the super probes (as dicts) and the LLM cache."""

    config: EvolveConfig
    final: tuple[dict, ...]
    cache: str
    target_items: frozenset
    show_progress: bool


def evaluation_unit(unit: EvaluationUnit, key: str) -> dict:
    """Unit "evaluate" (Task 1 rounds of the super probes) or "level/<name>" (a Task 2 level)."""
    from ctrlsim.agents.persona import Persona
    from ctrlsim.experiments.evolve.evaluation import evaluate_level, evaluate_roster
    from ctrlsim.experiments.units import cached_llm

    config = unit.config
    personas = [Persona.from_dict(p) for p in unit.final]
    llm = cached_llm(config.llm, unit.cache)
    recommender, decisions = run_box(config), decision_settings(config, evaluation=True)
    if key == "evaluate":
        return evaluate_roster(config, personas, recommender, llm, decisions, set(unit.target_items),
                               show_progress=unit.show_progress)
    if key.startswith("level/"):
        return evaluate_level(config, key.removeprefix("level/"), personas, recommender, llm, decisions)
    raise ConfigError(f"unknown evolve unit {key!r}")


def payload(ctx: RunContext) -> EvaluationUnit:
    assert ctx.folder is not None
    return EvaluationUnit(ctx.config, tuple(p.to_dict() for p in ctx.state["result"].final),
                          str(ctx.folder.file("llm-cache.sqlite").resolve()),
                          frozenset(ctx.state["target_items"]), ctx.show_progress)


def plan(ctx: RunContext, finished) -> list[str]:
    result = ctx.state.get("result")
    if result is None or result.stopped_after is not None:
        return []
    return (["evaluate"] if ctx.config.eval_rounds > 0 else []) + [f"level/{n}" for n in ctx.config.levels]
