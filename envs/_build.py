"""Resolve the constructor arguments shared by `ProbeEnv` and `PopulationEnv` into one engine."""
from __future__ import annotations

from typing import Mapping, Sequence

from ctrlsim.data import Dataset, load_dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders import Recommender, make_recommender

from ctrlsim.backends import TokenMeter

from .engine import InteractionEngine
from .tasks import Task, make_task

DEFAULT_RECOMMENDER = "embedding"  # MiniLM item/profile embeddings: runs offline, no LLM


def build_parts(recommender: Recommender | str, dataset: Dataset | str, task: Task | str,
                target: str | Sequence[str] | Mapping[str, float] | None, recommender_options: Mapping | None,
                task_options: Mapping | None, mask_shown: bool) -> tuple[Recommender, Task]:
    if isinstance(recommender, Recommender):
        rec = recommender
        if recommender_options:
            raise ConfigError("recommender_options only apply when the recommender is given by name")
    else:
        ds = load_dataset(dataset) if isinstance(dataset, str) else dataset
        rec = make_recommender(recommender, ds, mask_shown=mask_shown, **dict(recommender_options or {}))
    if isinstance(task, Task):
        if task.dataset is not rec.dataset:
            raise ConfigError("the task and the recommender must use the same Dataset object")
        return rec, task
    options = dict(task_options or {})
    if target is not None:
        options["target"] = target
    return rec, make_task(task, rec.dataset, **options)


def build_engine(recommender: Recommender | str, dataset: Dataset | str, task: Task | str,
                 target: str | Sequence[str] | Mapping[str, float] | None, recommender_options: Mapping | None,
                 task_options: Mapping | None, mask_shown: bool, *, slate_size: int, budget: int,
                 token_meter: TokenMeter | None) -> InteractionEngine:
    rec, task_obj = build_parts(recommender, dataset, task, target, recommender_options, task_options, mask_shown)
    return InteractionEngine(rec, task_obj, slate_size=slate_size, budget=budget, token_meter=token_meter)
