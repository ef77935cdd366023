"""evolve's evaluation units (the super probes' Task 1 rounds, Task 2 levels) and what they share
with the loop: the dataset, the box and the decision settings."""
from __future__ import annotations

from dataclasses import dataclass

from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.evolve.config import EvolveConfig
from ctrlsim.experiments.runner import RunContext


def run_box(unit: UnitContext, config: EvolveConfig):
    """The black box (shown items masked) over the run's dataset: the loop's task and the box share
    the one dataset object of the process (`unit.dataset`)."""
    return unit.box(config.recommender, config.dataset, mask_shown=True)


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
class Evaluation:
    """One evaluation unit: the super probes' Task 1 rounds (`level` None, key "evaluate") or one
    Task 2 level (key "level/<name>"); the spec travels with its key to the unit."""

    level: str | None = None

    @property
    def key(self) -> str:
        return "evaluate" if self.level is None else f"level/{self.level}"


@dataclass(frozen=True)
class EvaluationPayload:
    """What every evaluation unit needs: the config, the super probes (as dicts), the target items."""

    config: EvolveConfig
    final: tuple[dict, ...]
    target_items: frozenset


def evaluation_unit(payload: EvaluationPayload, unit: UnitContext) -> dict:
    """One `Evaluation`: the Task 1 rounds of the super probes, or a Task 2 level."""
    from ctrlsim.agents.persona import Persona
    from ctrlsim.experiments.evolve.evaluation import evaluate_level, evaluate_roster

    config, evaluation = payload.config, unit.spec
    personas = [Persona.from_dict(p) for p in payload.final]
    llm = unit.llm(config.llm)
    recommender, decisions = run_box(unit, config), decision_settings(config, evaluation=True)
    if evaluation.level is None:
        return evaluate_roster(config, personas, recommender, llm, decisions, set(payload.target_items),
                               show_progress=unit.show_progress)
    return evaluate_level(config, evaluation.level, personas, recommender, llm, decisions)


def payload(ctx: RunContext) -> EvaluationPayload:
    return EvaluationPayload(ctx.config, tuple(p.to_dict() for p in ctx.state["result"].final),
                             frozenset(ctx.state["target_items"]))


def plan(ctx: RunContext, finished) -> list[Evaluation]:
    result = ctx.state.get("result")
    if result is None or result.stopped_after is not None:
        return []
    return ([Evaluation()] if ctx.config.eval_rounds > 0 else []) + [Evaluation(n) for n in ctx.config.levels]


DECISION = ("one probe's choice on one slate (interaction and evaluation rounds; the debates and merges "
            "make none, their cost and tokens still count)")


def decisions(config, key: str, record: dict) -> int:
    """Probe decisions of a stored phase or evaluation (`probes` x rounds)."""
    probes = int(record.get("probes") or 0)
    if key.startswith("phase/interact"):
        return probes * config.rounds_per_merge
    if key.startswith("phase/"):
        return 0
    return probes * int(record.get("rounds") or config.eval_rounds)
