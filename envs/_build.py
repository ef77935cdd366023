"""Resolve the constructor arguments shared by `ProbeEnv` and `PopulationEnv` into one engine."""
from __future__ import annotations

from typing import Mapping, Sequence

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset, load_dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders import Recommender, make_recommender

from .engine import InteractionEngine
from .phases import PhasePlan, as_phase_plan, plan_budget
from .tasks import Task, make_task

DEFAULT_RECOMMENDER = "embedding"  # MiniLM item/profile embeddings: runs offline, no LLM
DEFAULT_BUDGET = 20  # rounds per episode when neither a budget nor a phase plan is given


def build_parts(recommender: Recommender | str, dataset: Dataset | str, task: Task | str,
                target: str | Sequence[str] | Mapping[str, float] | None, recommender_options: Mapping | None,
                task_options: Mapping | None, mask_shown: bool) -> tuple[Recommender, Task]:
    """The black box and the task. The task is built first: an unknown target or task name is
    reported before a named black box loads or trains (minutes for the RecBole models)."""
    if isinstance(recommender, Recommender):
        if recommender_options:
            raise ConfigError("recommender_options only apply when the recommender is given by name")
        ds = recommender.dataset
    elif isinstance(recommender, str):
        ds = load_dataset(dataset) if isinstance(dataset, str) else dataset
    else:
        raise ConfigError(f"recommender must be a name (e.g. 'narm') or a Recommender, got {recommender!r}")
    if isinstance(task, Task):
        if task.dataset is not ds:
            raise ConfigError("the task and the recommender must use the same Dataset object")
        task_obj = task
    else:
        options = dict(task_options or {})
        if target is not None:
            options["target"] = target
        task_obj = make_task(task, ds, **options)
    if isinstance(recommender, Recommender):
        return recommender, task_obj
    options = dict(recommender_options or {})
    return make_recommender(recommender, ds, mask_shown=mask_shown, **options), task_obj


def build_engine(recommender: Recommender | str, dataset: Dataset | str, task: Task | str,
                 target: str | Sequence[str] | Mapping[str, float] | None,
                 recommender_options: Mapping | None, task_options: Mapping | None, mask_shown: bool, *,
                 slate_size: int, budget: int | None, token_meter: TokenMeter | None,
                 allow_search: bool = True, phases: PhasePlan | Mapping | None = None,
                 negative_feedback: bool = False) -> InteractionEngine:
    """The engine; with `phases` its budget is the plan's total (a given `budget` must agree)."""
    plan = as_phase_plan(phases)
    budget = plan_budget(budget, plan, DEFAULT_BUDGET)
    rec, task_obj = build_parts(recommender, dataset, task, target, recommender_options, task_options,
                                mask_shown)
    return InteractionEngine(rec, task_obj, slate_size=slate_size, budget=budget, token_meter=token_meter,
                             allow_search=allow_search, phases=plan, negative_feedback=negative_feedback)
