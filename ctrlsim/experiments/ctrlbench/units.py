"""ctrlbench's units: one (method, box, target, seed) episode -> its record, and the plan."""
from __future__ import annotations

import time

from ctrlsim.envs.phases import TOWARD
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.ctrlbench.config import RESPONSIVENESS, CtrlBenchConfig, Episode
from ctrlsim.experiments.ctrlbench.inputs import (
    method_label,
    method_population,
    run_box,
    run_llm,
    target_items,
    target_tags,
)


def run_episode(config: CtrlBenchConfig, unit: UnitContext, episode: Episode, *, bars: bool = True,
                intervene=None) -> dict:
    """One episode -> its record (a pure function of config and episode); everything it loads comes
    from `unit`. Progress bars where `unit` draws them (`bars=False` keeps this episode's off).
    `intervene`: a counterfactual arm's hook on each round's actions (`play_population`)."""
    from ctrlsim.agents import ProfileSettings
    from ctrlsim.agents.episode import EpisodeSpec, play_episode
    from ctrlsim.agents.methods import MethodContext

    started = time.perf_counter()
    method, box, target, seed = episode.method, episode.box, episode.target, episode.seed
    bars = bars and unit.show_progress
    dataset = unit.dataset(config.dataset)
    recommender = run_box(unit, config, box)
    targets = target_items(dataset, target)
    settings = config.decision_settings()
    slate_size = config.slate_for(box)
    context = MethodContext(
        dataset=dataset, recommender=recommender, target_tags=target_tags(target), target_items=targets,
        seed=seed, small_sample="large" if config.small_users == "nested" else "small",
        k_large=config.agents[0], k_small=config.agents[1], rounds=config.episode_rounds,
        slate_size=slate_size,
        decision_settings=settings,
        profile_settings=ProfileSettings(l_init=tuple(config.l_init), temperature=config.temperature),
        llm_factory=lambda: run_llm(unit, config),
        profile_store=unit.profile_store(cached=config.cache),
        options=dict(config.method_options.get(method, {})), show_progress=bars,
        rich_in=target_tags(target) if episode.steers_away else ())
    population = method_population(method, config.roster, context)
    spec = EpisodeSpec(method, method_label(method), box, target, seed, config.episode_rounds, slate_size,
                       config.target_visible, config.like_prob, target_tags(target), config.allow_search,
                       config.task, config.phase_plan(episode.direction or TOWARD),
                       negative_feedback=config.task == RESPONSIVENESS or config.negative_feedback,
                       intervene=intervene)
    llm = run_llm(unit, config) if population.policy == "llm" else None
    record = play_episode(spec, population, recommender, targets, llm=llm, settings=settings,
                          show_progress=bars)
    # The unit's wall time: loading the box and writing the personas count, not only the rounds.
    record["timing"] = {"seconds": round(time.perf_counter() - started, 2)}
    return record


def episode_unit(config: CtrlBenchConfig, unit: UnitContext) -> dict:
    if config.task == RESPONSIVENESS:
        from ctrlsim.experiments.ctrlbench.responsiveness import run_responsiveness

        return run_responsiveness(config, unit, unit.spec, run_episode)
    return run_episode(config, unit, unit.spec)


def plan(ctx, finished) -> list[Episode]:
    return ctx.config.episodes()


DECISION = "one probe's choice on one slate (one round of one probe)"


def decisions(config, key: str, record: dict) -> int:
    """Rounds the episode's probes played, whatever their policy (LLM, scripted, random)."""
    return sum(len(p.get("rounds") or ()) for p in record.get("probes") or ())
