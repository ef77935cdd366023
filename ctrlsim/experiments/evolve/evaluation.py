"""The evolved super probes' evaluation units: Task 1 rounds and the Task 2 levels (`ctrlsim evolve`)."""
from __future__ import annotations

import time

from ctrlsim.agents.episode import round_curves


def evaluate_roster(
    config,
    personas,
    recommender,
    llm,
    decisions,
    target_items: set[str],
    *,
    show_progress: bool = True,
) -> dict:
    """The super probes' t evaluation rounds: Task 1 curves, discoveries per round, popularity (eq. 3)."""
    from ctrlsim.agents import Population, play_population
    from ctrlsim.backends import TokenMeter
    from ctrlsim.envs import PopulationEnv
    from ctrlsim.metrics import controllability as M
    from ctrlsim.seeding import derive_seed

    meter = TokenMeter()
    env = PopulationEnv(
        recommender,
        n_agents=len(personas),
        task="target-discovery",
        target=list(config.target),
        slate_size=config.slate,
        budget=config.eval_rounds,
        token_meter=meter,
        allow_search=config.allow_search,
    )
    from ctrlsim.agents.episode import validity_record
    from ctrlsim.agents.validity import run_checks

    population = Population(tuple(personas), "llm", prompt_variant=config.prompt_variant)
    started, cpu_started = time.perf_counter(), time.process_time()
    seed = derive_seed(config.seed, "evaluate")
    checks = run_checks(population, recommender.dataset, target_items=frozenset(target_items),
                        target_name="+".join(config.target), target_tags=tuple(config.target), seed=seed,
                        slate_size=config.slate, budget=config.eval_rounds, llm=llm, settings=decisions)
    trace = play_population(
        env,
        population,
        seed=seed,
        target=config.target,
        llm=llm,
        settings=decisions,
        meter=meter,
    )
    dataset = recommender.dataset
    popularity = dataset.items["popularity"].to_numpy(dtype=float)
    counted = [p.recommender_likes_per_round for p in trace.probes]  # search finds never count
    per_round = [[list(dataset.indices(r)) for r in p] for p in counted]
    return {
        "rounds": config.eval_rounds,
        "probes": len(personas),
        "prompt_variant": config.prompt_variant,
        "curves": round_curves(trace, target_items, config.eval_rounds),
        "new_discoveries": M.new_discoveries_per_round(
            counted, target_items, config.eval_rounds
        ),
        "interaction_popularity": M.interaction_popularity(
            popularity, [i for p in per_round for r in p for i in r]
        ),
        "popularity_per_round": M.popularity_per_round(popularity, per_round, config.eval_rounds),
        "catalogue_popularity": float(popularity.mean()),
        "trace": trace.to_dict(),
        "validity": validity_record(population, trace, frozenset(target_items), dataset, checks, seed=seed),
        "seconds": round(time.perf_counter() - started, 2),
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "tokens": meter.total.to_dict(),
    }


def evaluate_level(config, name: str, personas, recommender, llm, decisions) -> dict:
    """Task 2 (Appendix D.7): the super probes, seeded with a level's history, steer for t rounds.

    Per round: the target similarity cos(V_t, V_target) (Acc.), the old-interest similarity
    cos(V_t, V_old) with V_old the centred centroid of the seed tags' items (Figure 7), and the
    smoothness per interval t0-t3 ... t18-t20 (Table 2); means over the probes.
    """
    import numpy as np

    from ctrlsim.agents import Population, play_population
    from ctrlsim.agents.evolution.levels import get_level, level_persona
    from ctrlsim.backends import TokenMeter
    from ctrlsim.envs import PopulationEnv, make_task
    from ctrlsim.metrics import controllability as M
    from ctrlsim.seeding import derive_rng, derive_seed

    preset = get_level(name)
    dataset = recommender.dataset
    rng = derive_rng(config.seed, "level", name)
    probes = [level_persona(p, dataset, preset, rng) for p in personas]
    task = make_task("profile-shaping", dataset, target=list(preset.target), item_vectors=config.encoder)
    meter = TokenMeter()
    env = PopulationEnv(
        recommender,
        n_agents=len(probes),
        task=task,
        slate_size=config.slate,
        budget=config.eval_rounds,
        token_meter=meter,
        allow_search=config.allow_search,
    )
    play_population(
        env,
        Population(tuple(probes), "llm", prompt_variant=config.prompt_variant),
        seed=derive_seed(config.seed, "level", name),
        target=preset.target,
        llm=llm,
        settings=decisions,
        meter=meter,
    )
    old_items = sorted({i for tag in preset.interests for i in dataset.items_with_tag(tag)})
    old = M.centred_profile_vector(task.vectors[dataset.indices(old_items)], task.global_mean)
    trajectories = [task.trajectory(env.probes[agent].record) for agent in env.possible_agents[: len(probes)]]

    def mean_curve(curves):
        width = max(len(c) for c in curves)
        return [float(np.mean([c[t] for c in curves if t < len(c)])) for t in range(width)]

    return {
        "level": name,
        "target": list(preset.target),
        "l_init": preset.l_init,
        "probes": len(probes),
        "accuracy": mean_curve([M.similarity_curve(t, task.target_vector) for t in trajectories]),
        "old_interest": mean_curve([M.similarity_curve(t, old) for t in trajectories]),
        "smoothness": mean_curve([M.interval_smoothness(t) for t in trajectories]),
        "intervals": [
            f"t{a}-t{b}"
            for a, b in zip(M.SMOOTHNESS_EDGES[:-1], M.SMOOTHNESS_EDGES[1:])
            if b <= config.eval_rounds
        ],
        "tokens": meter.total.to_dict(),
    }
