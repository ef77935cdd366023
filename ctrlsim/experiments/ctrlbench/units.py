"""ctrlbench's units: one (method, box, target, seed) episode -> its record, and the plan."""
from __future__ import annotations

import time

from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig, parse_key
from ctrlsim.experiments.ctrlbench.inputs import (
    cache_file,
    method_label,
    method_population,
    run_box,
    run_dataset,
    run_llm,
    target_items,
    target_tags,
)
from ctrlsim.experiments.runner import ProgressPayload


def run_episode(config: CtrlBenchConfig, key: str, *, show_progress: bool = True) -> dict:
    """One (method, box, target, seed) episode -> its record (a pure function of config and key)."""
    from ctrlsim.agents import ProfileSettings
    from ctrlsim.agents.episode import EpisodeSpec, play_episode
    from ctrlsim.agents.methods import MethodContext

    started = time.perf_counter()
    method, box, target, seed = parse_key(key)
    dataset = run_dataset(config)
    recommender = run_box(config, box)
    targets = target_items(dataset, target)
    settings = config.decision_settings()
    slate_size = config.slate_for(box)
    context = MethodContext(
        dataset=dataset, recommender=recommender, target_tags=target_tags(target), target_items=targets,
        seed=seed, small_sample="large" if config.small_users == "nested" else "small",
        k_large=config.agents[0], k_small=config.agents[1], rounds=config.rounds, slate_size=slate_size,
        decision_settings=settings,
        profile_settings=ProfileSettings(l_init=tuple(config.l_init), temperature=config.temperature),
        llm_factory=lambda: run_llm(config),
        profile_store=cache_file("profiles.sqlite") if config.cache else None,
        options=dict(config.method_options.get(method, {})), show_progress=show_progress)
    population = method_population(method, config.roster, context)
    spec = EpisodeSpec(method, method_label(method), box, target, seed, config.rounds, slate_size,
                       config.target_visible, config.like_prob, target_tags(target), config.allow_search,
                       config.task)
    llm = run_llm(config) if population.policy == "llm" else None
    record = play_episode(spec, population, recommender, targets, llm=llm, settings=settings,
                          show_progress=show_progress)
    # The unit's wall time: loading the box and writing the personas count, not only the rounds.
    record["timing"] = {"seconds": round(time.perf_counter() - started, 2)}
    return record


def episode_unit(unit: ProgressPayload, key: str) -> dict:
    return run_episode(unit.config, key, show_progress=unit.show_progress)


def plan(ctx, finished) -> list[str]:
    return ctx.config.keys()
