"""`ctrlsim probe`'s two units: the population episode and the controllability ceiling."""
from __future__ import annotations

import time
from typing import Callable

from ctrlsim.envs import PopulationEnv, ProbeSpec
from ctrlsim.errors import PROBE_FAILURES, ConfigError
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.probe.config import UNITS, ProbeRunConfig

# ----------------------------------------------------------------------------- the episode

def run_population(env: PopulationEnv, policy_for: Callable, *, seed: int, checkpoints: tuple[int, ...],
                   unit: UnitContext | None = None, roster: list[ProbeSpec] | None = None) -> dict[int, dict]:
    """Run one episode; `policy_for(agent, rng)` builds each agent's policy. Returns metrics per checkpoint
    (a progress bar where `unit` draws them).

    A policy that raises is reported to the env with `env.drop(agent, reason)`: that probe
    ends, the others go on.
    """
    obs, infos = env.reset(seed=seed, options={"roster": roster} if roster is not None else None)
    policies = {a: policy_for(a, env.agent_rngs[a]) for a in env.agents}
    results: dict[int, dict] = {}
    bar = (unit or UnitContext()).progress(range(1, env.engine.budget + 1), desc="rounds")
    for t in bar:
        if not env.agents:
            break
        actions = {}
        for agent in env.agents:
            try:
                actions[agent] = policies[agent].act(obs[agent], infos[agent])
            except PROBE_FAILURES as exc:  # the probe's own failure drops it; anything else fails the unit
                env.drop(agent, f"{type(exc).__name__}: {exc}")
        obs, _, _, _, infos = env.step(actions)
        if t in checkpoints:
            results[t] = env.population_metrics()
            bar.set_postfix({k: f"{v:.3g}" for k, v in results[t].items() if k in ("coverage", "efficiency")})
    return results


def _env(config: ProbeRunConfig, unit: UnitContext) -> PopulationEnv:
    # The run's black box, built once per process (the episode and the ceiling share it).
    box = unit.box(config.recommender, config.dataset, mask_shown=True, **config.recommender_options)
    return PopulationEnv(box, n_agents=config.agents, task=config.task, target=config.target,
                         slate_size=config.resolved_slate_size, budget=config.rounds)


def spec_to_dict(spec: ProbeSpec) -> dict:
    return {"name": spec.name, "history": list(spec.history), "profile": spec.profile,
            "attributes": dict(spec.attributes)}


def run_unit(config: ProbeRunConfig, unit: UnitContext) -> dict:
    """One unit of work: "episode" or "ceiling" (both pure functions of the config)."""
    from ctrlsim.agents import RandomProbe

    started = time.time()
    env = _env(config, unit)
    if unit.key == "episode":
        metrics = run_population(env, lambda agent, rng: RandomProbe(rng, config.like_prob), seed=config.seed,
                                 checkpoints=config.resolved_checkpoints, unit=unit)
        records = [p.record for p in env.probes.values()]
        return {"recommender": env.recommender.identity, "task": env.task.config,
                "metrics": {str(t): m for t, m in metrics.items()}, "failures": dict(env.failures),
                "tokens": int(sum(r.tokens for r in records)),
                "likes": int(sum(len(r.likes) for r in records)),
                "roster": [spec_to_dict(p.spec) for p in env.probes.values()],
                "seconds": round(time.time() - started, 2)}
    if unit.key == "ceiling":
        from ctrlsim.envs.ceiling import controllability_ceiling

        target = getattr(env.task, "target", None)
        if not target:
            return {"skipped": f"task {config.task!r} has no target set"}
        env.reset(seed=config.seed)  # the same roster the episode played
        roster = [p.spec for p in env.probes.values()]
        bar = unit.progress(desc="ceiling (states)", unit="state")
        ceiling = controllability_ceiling(env.recommender, roster, target,
                                          slate_size=config.resolved_slate_size, budget=config.rounds,
                                          max_states_per_probe=config.ceiling_states,
                                          progress=lambda total: bar.update(total - bar.n))
        bar.close()
        return {"coverage": ceiling.coverage_ceiling,
                "at": {str(t): ceiling.ceiling_at(t) for t in config.resolved_checkpoints},
                "states_expanded": ceiling.states_expanded, "exhaustive": ceiling.exhaustive,
                "max_states_per_probe": ceiling.max_states_per_probe,
                "bound": "exact" if ceiling.exhaustive else "lower bound (beam search)",
                "seconds": round(time.time() - started, 2)}
    raise ConfigError(f"unknown probe-run unit {unit.key!r}; units: {', '.join(UNITS)}")



def preflight(config: ProbeRunConfig, unit: UnitContext) -> None:
    """What can be checked from the dataset alone, before the black box loads or trains."""
    from ctrlsim.envs.roster import user_order

    ds = unit.dataset(config.dataset)
    size = len(ds.items_with_tag(config.target))  # an unknown tag raises DataError naming it
    if config.task == "target-discovery" and size == 0:
        raise ConfigError(f"target {config.target!r} has no items in {ds.name}; choose another tag")
    users = len(user_order(ds))
    if config.agents > users:
        raise ConfigError(f"agents: {config.agents} probes need as many users; {ds.name} has {users}")


def check(ctx) -> None:
    preflight(ctx.config, ctx.unit)


def plan(ctx, finished) -> list[str]:
    return list(UNITS)


DECISION = "one probe's like/skip choice on one slate (one round of one probe)"


def decisions(config, key: str, record: dict) -> int:
    """The episode's probe decisions (the ceiling's beam search makes none; its cost still counts)."""
    return len(record.get("roster") or ()) * config.rounds if key == "episode" else 0
