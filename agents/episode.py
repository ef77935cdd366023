"""CtrlBench-Rec's episode: one method's population against one black box for t rounds -> its record.

The protocol's methods are `ctrlsim.agents.methods` (base-large, base-small, random, and what the
evolution loop registers); this module plays one of them on one (box, target, seed) and turns the
trace into the stored record (per-round curves, per-probe results, costs, identities). The runner
(`ctrlsim ctrlbench`) only loads the shared resources and plans the episodes; `ctrlsim evolve`
uses the same curves for its super probes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from ctrlsim.metrics import controllability as M

CURVES = ("coverage", "efficiency", "efficiency_all_likes", "len", "tokens")


def _finite(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def round_curves(trace, target_items: Iterable[str], rounds: int) -> dict[str, list]:
    """Each metric after rounds 1..rounds for one episode (a probe dropped early keeps what it had)."""
    target = set(target_items)
    out: dict[str, list] = {name: [] for name in CURVES}
    for t in range(1, rounds + 1):
        likes = [[i for r in p.likes_per_round[:t] for i in r] for p in trace.probes]
        tokens = [p.tokens_per_round[min(t, len(p.tokens_per_round)) - 1] if p.tokens_per_round else 0
                  for p in trace.probes]
        out["coverage"].append(_finite(M.coverage(likes, target)))
        out["efficiency"].append(_finite(M.target_exploration_efficiency(likes, target)))
        out["efficiency_all_likes"].append(_finite(M.exploration_efficiency(likes, target)))
        out["len"].append(M.average_behaviour_length(likes))
        out["tokens"].append(M.average_tokens(tokens))
    return out


@dataclass(frozen=True)
class EpisodeSpec:
    """What identifies one episode besides the population: the method, box, target and seed."""

    method: str
    label: str
    box: str
    target: str
    seed: int
    rounds: int
    slate_size: int
    target_visible: bool
    like_prob: float


def play_episode(spec: EpisodeSpec, population, recommender, target_items: frozenset, *, llm=None,
                 settings=None, show_progress: bool = True) -> dict:
    """Play `population` (a `methods.Population`) on `recommender` and return the episode's record.

    `llm` is used only by LLM populations; an infrastructure failure inside the episode propagates
    (the unit fails), a probe's own failure is counted in the record (see `play_population`).
    """
    from ctrlsim.agents.population import play_population
    from ctrlsim.envs import PopulationEnv
    from tqdm import tqdm

    from ctrlsim.backends import TokenMeter

    started = time.perf_counter()
    meter = TokenMeter()
    env = PopulationEnv(recommender, n_agents=len(population.personas), task="target-discovery",
                        target=spec.target, slate_size=spec.slate_size, budget=spec.rounds, token_meter=meter)
    llm = llm if population.policy == "llm" else None
    bar = tqdm(total=spec.rounds, desc=f"{spec.method} {spec.box} {spec.target} s{spec.seed}", unit="round",
               leave=False, disable=not show_progress)

    def tick(round_no, trace):
        bar.update(1)
        likes = [[i for r in p.likes_per_round for i in r] for p in trace.probes]
        found = len({i for x in likes for i in x if i in target_items})
        bar.set_postfix(coverage=f"{found / max(len(target_items), 1):.1%}")

    try:
        trace = play_population(env, population, seed=spec.seed, target=(spec.target,), llm=llm,
                                settings=settings, like_prob=spec.like_prob, meter=meter, on_round=tick)
    finally:
        bar.close()
    return episode_record(spec, population, trace, target_items, recommender, llm,
                          seconds=time.perf_counter() - started)


def episode_record(spec: EpisodeSpec, population, trace, target_items: frozenset, recommender, llm, *,
                   seconds: float) -> dict[str, Any]:
    """The stored record: per-round curves, per-probe results, costs and identities."""
    probes = []
    for p in trace.probes:
        likes = [i for r in p.likes_per_round for i in r]
        probes.append({"probe_id": p.probe_id, "likes": likes,
                       "target_likes": sum(i in target_items for i in likes),
                       "tokens": p.tokens_per_round[-1] if p.tokens_per_round else 0,
                       "dropped": p.dropped, "dropped_round": p.dropped_round, **p.stats})
    return {
        "method": spec.method, "label": spec.label, "recommender": spec.box, "target": spec.target,
        "seed": spec.seed, "policy": population.policy, "prompt_variant": population.prompt_variant,
        "target_visible": spec.target_visible if population.policy == "llm" else None,
        "k": len(population.personas), "target_size": len(target_items), "slate_size": spec.slate_size,
        "rounds": spec.rounds,
        "curves": round_curves(trace, target_items, spec.rounds),
        "setup_tokens": population.setup_tokens,
        "parse_failures": sum(p.get("parse_failures", 0) for p in probes),
        "decisions": sum(p.get("decisions", 0) for p in probes),
        "dropped": {p["probe_id"]: p["dropped"] for p in probes if p["dropped"]},
        "template_fallbacks": sum(x.source == "template" for x in population.personas)
        if population.policy == "llm" else None,
        "artefacts": dict(population.artefacts),
        "personas": [x.to_dict() for x in population.personas],
        "probes": probes,
        "llm": llm.identity if llm is not None else None,
        "box": recommender.identity,
        "timing": {"seconds": round(seconds, 2)},
    }
