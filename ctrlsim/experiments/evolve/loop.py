"""evolve's loop in the driver: the up-front checks, then the phases (interact, embed, cluster,
debate, merge, align), each writing its artefacts and its record before the next starts."""
from __future__ import annotations

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.context import run_settings
from ctrlsim.experiments.evolve.config import EXTENSIBLE, EvolveConfig
from ctrlsim.experiments.evolve.fusion import ExecutorFusion
from ctrlsim.experiments.evolve.units import decision_settings, run_box
from ctrlsim.experiments.runner import RunContext


def _check_inputs(config: EvolveConfig, dataset) -> set[str]:
    from ctrlsim.envs.roster import user_order

    unknown = [t for t in config.target if t not in dataset.tags]
    if unknown:
        raise ConfigError(
            f"unknown target tag(s) {unknown} in dataset {dataset.name!r}; known: {', '.join(dataset.tags)}"
        )
    users = len(user_order(dataset))
    if config.agents > users:
        raise ConfigError(f"agents={config.agents} exceeds the {users} users of {dataset.name!r}")
    return {i for t in config.target for i in dataset.items_with_tag(t)}


def _record_phases(folder, phases: dict) -> None:
    for name, entry in phases.items():
        key = f"phase/{name}"
        if key not in folder.store:
            folder.store.add(key, {"phase": name, **entry})


def check(ctx: RunContext) -> None:
    from ctrlsim.backends.bundled import check_cache_writable
    from ctrlsim.backends.spec_check import llm_cache_uses
    from ctrlsim.recommenders.registry import cache_uses

    ctx.state["target_items"] = _check_inputs(ctx.config, ctx.unit.dataset(ctx.config.dataset))
    # The LLM's replies live in the run folder; $CTRLSIM_CACHE holds a bundled LLM and a box's weights.
    uses = {} if ctx.given_llm(ctx.config.llm) is not None else llm_cache_uses(ctx.config.llm)
    check_cache_writable({**cache_uses(ctx.config.recommender), **uses})


def prepare(ctx: RunContext) -> None:
    """The loop's phases are one unit of work, "phases": a failure is reported, never stored."""
    from ctrlsim.experiments.driver import UnitsFailed
    from ctrlsim.experiments.executor import failure_record

    try:
        _evolve(ctx)
    except UnitsFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - a failed phase fails the run's unit, it does not crash it
        raise UnitsFailed({"phases": failure_record(exc)["error"]}) from exc


def _evolve(ctx: RunContext) -> None:
    """The evolution loop, phase by phase, in the driver (it writes the loop's artefacts); with
    --executor ray each cluster's debate and merge is a unit on the workers (`ExecutorFusion`)."""
    from ctrlsim.agents import MethodContext, ProfileSettings
    from ctrlsim.agents.evolution import EvolutionLoop, EvolutionSettings
    from ctrlsim.envs import make_task

    config, folder, unit = ctx.config, ctx.folder, ctx.unit
    assert folder is not None
    # The run's LLM (the evaluation units find the same object when they run in this process).
    llm = unit.llm(config.llm)
    dataset = unit.dataset(config.dataset)
    recommender = run_box(unit, config)
    task = make_task("target-discovery", dataset, target=list(config.target))
    decisions = decision_settings(config)
    context = MethodContext(
        dataset=dataset, recommender=recommender, target_tags=tuple(config.target),
        target_items=frozenset(ctx.state["target_items"]), seed=config.seed, k_large=config.agents,
        k_small=config.agents, rounds=config.eval_rounds, slate_size=config.slate,
        decision_settings=decisions,
        profile_settings=ProfileSettings(l_init=tuple(config.l_init)), llm_factory=lambda: llm,
        profile_store=unit.profile_store(), show_progress=unit.show_progress)
    settings = EvolutionSettings(
        merges=config.merges, rounds_per_merge=config.rounds_per_merge, k_rule=config.k_rule,
        alpha=config.alpha,
        fusion=config.fusion, temperature=config.temperature, debate_max_tokens=config.debate_max_tokens,
        merge_max_tokens=config.merge_max_tokens, align_min_behaviour=config.align_min_behaviour)
    # Debate and merge go cluster by cluster to the executor's workers; with the local executor
    # every cluster debates and merges together here (one batched call per round).
    fusion = None
    if ctx.options.executor != "local" and config.fusion == "debate-merge":
        fusion = ExecutorFusion(config, ctx.options, folder, run_settings(ctx, in_units=True),
                                show_progress=unit.show_progress)
    loop = EvolutionLoop(folder.path, dataset=dataset, recommender=recommender, task=task, llm=llm,
                         encoder=config.encoder, settings=settings, decision_settings=decisions,
                         seed=config.seed,
                         slate_size=config.slate, show_progress=unit.show_progress, fuse_elsewhere=fusion,
                         identity={k: v for k, v in folder.config.items() if k not in EXTENSIBLE})
    try:
        result = loop.run(lambda: context.base_personas(config.agents),
                          stop_after=ctx.resources.get("stop_after"))
    finally:
        if fusion is not None:
            fusion.close()
    _record_phases(folder, result.phases)
    folder.write_json("generations.json", result.generations)
    ctx.state.update(result=result, llm=llm)
