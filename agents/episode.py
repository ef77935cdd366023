"""CtrlBench-Rec's episode: one method's population against one black box for t rounds -> its record.

The protocol's methods are `ctrlsim.agents.methods` (base-large, base-small, random, oracle, what
the evolution loop registers, and the user's own); this module plays one of them on one
(box, target, seed) and turns the trace into the stored record: per-round curves of all three
tasks, per-probe results with every round's slate and source, costs and identities. The runner
(`ctrlsim ctrlbench`) only loads the shared resources and plans the episodes; `ctrlsim evolve`
evaluates its super probes with the same curves.

What is counted: only likes on slates the recommender built. Search results (when the run allows
search) shape a probe's history like any like, but a search-found item never counts toward
Coverage, Efficiency, Len or the Task 2 / Task 3 curves; the record reports them apart
(`search_likes`, `search_target_likes`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from ctrlsim.envs.tasks import SOURCE_RECOMMENDER

from ctrlsim.metrics import controllability as M

CURVES = ("coverage", "efficiency", "efficiency_all_likes", "len", "tokens")
TASKS = ("target-discovery", "profile-shaping", "popularity")


def _finite(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def _counted(trace) -> list[list[list[str]]]:
    """Per probe, per round, the likes the metrics count (those on recommender slates)."""
    return [p.recommender_likes_per_round for p in trace.probes]


def _likes_up_to(trace, rounds: int) -> list[list[list[str]]]:
    """For t = 1..rounds, each probe's counted likes in rounds 1..t."""
    counted = _counted(trace)
    return [[[i for r in per_round[:t] for i in r] for per_round in counted] for t in range(1, rounds + 1)]


def round_curves(trace, target_items: Iterable[str], rounds: int) -> dict[str, list]:
    """Task 1's metrics after rounds 1..rounds for one episode, from recommender-slate likes only
    (a probe dropped early keeps what it had)."""
    target = set(target_items)
    out: dict[str, list] = {name: [] for name in CURVES}
    for t, likes in enumerate(_likes_up_to(trace, rounds), start=1):
        tokens = [p.tokens_per_round[min(t, len(p.tokens_per_round)) - 1] if p.tokens_per_round else 0
                  for p in trace.probes]
        out["coverage"].append(_finite(M.coverage(likes, target)))
        out["efficiency"].append(_finite(M.target_exploration_efficiency(likes, target)))
        out["efficiency_all_likes"].append(_finite(M.exploration_efficiency(likes, target)))
        out["len"].append(M.average_behaviour_length(likes))
        out["tokens"].append(M.average_tokens(tokens))
    return out


def efficiency_counts(trace, target_items: Iterable[str], rounds: int) -> dict[str, list[int]]:
    """Per round t, the two sums behind Efficiency: target likes (repeats across probes counted) and
    distinct targets found. Tables pool them over episodes (a ratio of totals), so an episode that
    found nothing weighs in instead of dropping out."""
    target = set(target_items)
    likes, found = [], []
    for upto in _likes_up_to(trace, rounds):
        likes.append(sum(1 for x in upto for i in x if i in target))
        found.append(len(M.discovered_targets(upto, target)))
    return {"target_likes": likes, "found": found}


def tag_found(trace, dataset, tags: Sequence[str]) -> dict[str, int]:
    """Per tag of a union target, the distinct items carrying it that the probes found (Figure 3)."""
    liked = {i for per_round in _counted(trace) for r in per_round for i in r}
    return {tag: len(liked & set(dataset.items_with_tag(tag))) for tag in tags}


def popularity_curves(trace, dataset, target_items: Iterable[str], rounds: int) -> dict[str, list]:
    """Task 3: new target discoveries per round (Figure 8) and eq. 3 per round over the items the
    probes interacted with (liked on recommender slates; Table 3's definition, Figure 9)."""
    popularity = dataset.items["popularity"].to_numpy(dtype=float)
    counted = _counted(trace)
    per_round = [[list(dataset.indices(r)) for r in p] for p in counted]
    return {"new_discoveries": M.new_discoveries_per_round(counted, set(target_items), rounds),
            "popularity": [_finite(v) for v in M.popularity_per_round(popularity, per_round, rounds)],
            "interaction_popularity": _finite(M.interaction_popularity(
                popularity, [i for p in per_round for r in p for i in r])),
            "catalogue_popularity": float(popularity.mean())}


def profile_curves(trace, task, rounds: int) -> dict[str, Any]:
    """Task 2 (Table 2, eq. 2) with `task` a `ProfileShaping`: per round the mean over probes of
    cos(V_t, V_target) (accuracy) and of cos(V_t, V_0) (old-interest similarity, V_0 = the seed
    history), the JS divergence (eq. 2) between the tag distribution of every recommender slate
    shown up to round t and the target's; smoothness per interval t0-t3, t3-t6, ..."""
    dataset = task.dataset
    counted = _counted(trace)
    trajectories = []
    for probe, per_round in zip(trace.probes, counted):
        history = list(probe.seed_history)
        vectors = [M.centred_profile_vector(task.vectors[dataset.indices(history)], task.global_mean)]
        for t in range(rounds):
            history.extend(per_round[t] if t < len(per_round) else [])
            vectors.append(M.centred_profile_vector(task.vectors[dataset.indices(history)], task.global_mean))
        trajectories.append(vectors)
    item_tags = dataset.items["tags"]
    shown_by_round: list[list] = [[] for _ in range(rounds)]
    for probe in trace.probes:
        for n, r in enumerate(probe.rounds[:rounds]):
            if r["source"] == SOURCE_RECOMMENDER:
                shown_by_round[n].extend(item_tags.iat[dataset.item_index[i]] for i in r["slate"])
    js, shown = [], []
    for tags_this_round in shown_by_round:
        shown.extend(tags_this_round)
        js.append(_finite(M.js_divergence(M.tag_distribution(shown, task.all_tags), task.target_dist)))

    def mean_over_probes(curves):
        return [float(np.mean([c[t] for c in curves])) for t in range(len(curves[0]))] if curves else []

    return {"accuracy": mean_over_probes([M.similarity_curve(v, task.target_vector) for v in trajectories]),
            "old_interest": mean_over_probes([M.similarity_curve(v, v[0]) for v in trajectories]),
            "smoothness": mean_over_probes([M.interval_smoothness(v) for v in trajectories]),
            "intervals": [f"t{a}-t{b}" for a, b in zip(M.SMOOTHNESS_EDGES[:-1], M.SMOOTHNESS_EDGES[1:])
                          if b <= rounds],
            "js_divergence": js}


def phase_series(trace, target_items: Iterable[str], rounds: int) -> dict[str, list]:
    """Per round of a steer-then-release episode, over its probes' recommender slates: the mean share
    of slate items that are targets (what retention reads), and the mean number of likes and of
    target likes per probe (effort). A round no probe played on a recommender slate is None.
    `searches`: per round, the mean number of searches the probes that played it typed (effort of
    its own kind; 0 where search is off)."""
    target = set(target_items)
    share: list[float | None] = []
    likes: list[float | None] = []
    target_likes: list[float | None] = []
    searches = [float(np.mean([bool(p.rounds[t].get("query")) for p in trace.probes if t < len(p.rounds)]
                              or [0.0])) for t in range(rounds)]
    for t in range(rounds):
        played = [r for p in trace.probes if t < len(p.rounds)
                  for r in [p.rounds[t]] if r["source"] == SOURCE_RECOMMENDER and r["slate"]]
        if not played:
            share.append(None)
            likes.append(None)
            target_likes.append(None)
            continue
        share.append(float(np.mean([sum(i in target for i in r["slate"]) / len(r["slate"]) for r in played])))
        likes.append(float(np.mean([len(r["liked"]) for r in played])))
        target_likes.append(float(np.mean([sum(i in target for i in r["liked"]) for r in played])))
    return {"target_share": share, "likes": likes, "target_likes": target_likes, "searches": searches}


@dataclass(frozen=True)
class EpisodeSpec:
    """What identifies one episode besides the population: the method, box, target and seed.

    target is the target's name ("War", or a union "War+Film-Noir"); target_tags its tags."""

    method: str
    label: str
    box: str
    target: str
    seed: int
    rounds: int
    slate_size: int
    target_visible: bool
    like_prob: float
    target_tags: tuple[str, ...] = ()
    allow_search: bool = False
    task: str = "target-discovery"
    phases: Any = None  # a steer-then-release `ctrlsim.envs.PhasePlan` (rounds = its total), or None
    negative_feedback: bool = False  # the env takes not interested, dislike and block actions
    # `play_population`'s hook: sees each round's actions and returns those played (a
    # counterfactual arm's feedback); not part of what identifies the episode
    intervene: Any = field(default=None, compare=False, repr=False)

    @property
    def tags(self) -> tuple[str, ...]:
        return self.target_tags or tuple(self.target.split("+"))


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
                        target=list(spec.tags), slate_size=spec.slate_size, budget=spec.rounds,
                        token_meter=meter, allow_search=spec.allow_search, phases=spec.phases,
                        negative_feedback=spec.negative_feedback)
    llm = llm if population.policy == "llm" else None
    bar = tqdm(total=spec.rounds, desc=f"{spec.method} {spec.box} {spec.target} s{spec.seed}", unit="round",
               leave=False, disable=not show_progress)

    def tick(round_no, trace):
        bar.update(1)
        found = {i for per_round in _counted(trace) for r in per_round for i in r if i in target_items}
        bar.set_postfix(coverage=f"{len(found) / max(len(target_items), 1):.1%}")

    from .validity import run_checks

    checks = run_checks(population, recommender.dataset, target_items=target_items, target_name=spec.target,
                        target_tags=spec.tags, seed=spec.seed, slate_size=spec.slate_size, budget=spec.rounds,
                        llm=llm, settings=settings, like_prob=spec.like_prob)
    try:
        trace = play_population(env, population, seed=spec.seed, target=spec.tags, llm=llm,
                                settings=settings, like_prob=spec.like_prob, meter=meter, on_round=tick,
                                intervene=spec.intervene)
    finally:
        bar.close()
    record = episode_record(spec, population, trace, target_items, recommender, llm,
                            seconds=time.perf_counter() - started, checks=checks, settings=settings)
    usage = meter.total
    if usage.unknown_calls:  # the curves' tokens hold only the reported counts: a lower bound
        record["tokens_unknown"] = {"calls": usage.unknown_calls, "of": usage.calls}
    return record


def _fallback_counts(population) -> dict[str, int | None]:
    """Substitutions a method made: personas written from a template instead of by the LLM, merges
    that fell back to the best member, target items the merge added back."""
    llm_personas = population.policy == "llm"
    generations = population.artefacts.get("generations") or []
    return {
        "template_fallbacks": sum(x.source == "template" for x in population.personas)
        if llm_personas else None,
        "merge_fallbacks": sum(int(g.get("merge_fallbacks", g.get("invalid_merges", 0)) or 0)
                               for g in generations) if generations else None,
        "merges": sum(int(g.get("merges", 0) or 0) for g in generations) if generations else None,
        "target_items_added": sum(int(g.get("target_items_added", 0) or 0) for g in generations)
        if generations else None,
    }


def validity_record(population, trace, target_items: frozenset, dataset, checks: dict, *,
                    seed: int) -> dict[str, Any]:
    """The episode's validity: the fixed checks' decisions (so anyone can recompute the card), the
    decisions on the box's own slates, and this episode's adherence, fidelity AUC and relevance
    share, each with a cluster-bootstrap interval over its probes (`ctrlsim.metrics.validity`)."""
    from ctrlsim.metrics import validity as V

    from .validity import relevant_like

    def estimate(e) -> dict:
        return {"value": _finite(e.value), "low": _finite(e.low), "high": _finite(e.high), "n": e.n}

    by_id = {p.probe_id: p for p in population.personas}
    slates = [{"probe": p.probe_id, "item": i, "target": i in target_items, "liked": i in set(r["liked"])}
              for p in trace.probes for r in p.rounds if r["source"] == SOURCE_RECOMMENDER
              for i in r["slate"]]
    likes = [{"probe": d["probe"], "relevant": relevant_like(dataset, by_id[d["probe"]], d["item"])}
             for d in slates if d["liked"] and d["probe"] in by_id]
    check, fidelity = checks["check"], checks["fidelity_check"]
    adherence = V.adherence_card([d["probe"] for d in check], [d["target"] for d in check],
                                 [d["liked"] for d in check], seed=seed)
    on_slates = V.adherence_card([d["probe"] for d in slates], [d["target"] for d in slates],
                                 [d["liked"] for d in slates], seed=seed)
    rated = [d for d in fidelity if d["rating"] >= 4 or d["rating"] <= 2]
    auc = V.fidelity_auc([d["probe"] for d in rated], [d["rating"] >= 4 for d in rated],
                         [float(d["liked"]) for d in rated], seed=seed)
    relevance = V.share_ci([d["probe"] for d in likes], [d["relevant"] for d in likes], seed=seed)
    per_probe: dict[str, dict[str, int]] = {}
    for d in slates:
        counts = per_probe.setdefault(d["probe"], {"probe": d["probe"], "target_shown": 0, "target_liked": 0,
                                                   "other_shown": 0, "other_liked": 0})
        kind = "target" if d["target"] else "other"
        counts[f"{kind}_shown"] += 1
        counts[f"{kind}_liked"] += int(d["liked"])
    return {"adherence": estimate(adherence.adherence), "slate_adherence": estimate(on_slates.adherence),
            "slate_counts": {"target": on_slates.n_target, "other": on_slates.n_other,
                             "target_liked": sum(d["liked"] for d in slates if d["target"]),
                             "other_liked": sum(d["liked"] for d in slates if not d["target"])},
            "slate_decisions": list(per_probe.values()),
            "fidelity_auc": estimate(auc),
            "relevance": estimate(relevance) | {"likes": len(likes),
                                                "relevant": sum(d["relevant"] for d in likes)},
            "check": check, "fidelity_check": fidelity,
            "check_usage": checks["check_usage"], "check_parse_failures": checks["check_parse_failures"],
            "check_failed_probes": checks["check_failed_probes"]}


def _decision(population, settings) -> dict | None:
    """How an LLM population decided (head and threshold); None for scripted and learned probes."""
    if population.policy != "llm":
        return None
    from .llm_probe import DecisionSettings, decision_identity

    return decision_identity(settings if settings is not None else DecisionSettings())


def episode_record(spec: EpisodeSpec, population, trace, target_items: frozenset, recommender, llm, *,
                   seconds: float, checks: dict | None = None, settings=None) -> dict[str, Any]:
    """The stored record: per-round curves, per-probe results and rounds, costs and identities."""
    from ctrlsim.agents.methods import policy_name

    dataset = recommender.dataset
    probes = []
    for p, counted in zip(trace.probes, _counted(trace)):
        likes = [i for r in counted for i in r]
        probes.append({"probe_id": p.probe_id, "likes": likes,
                       "target_likes": sum(i in target_items for i in likes),
                       "search_likes": p.search_likes,
                       "tokens": p.tokens_per_round[-1] if p.tokens_per_round else 0,
                       "dropped": p.dropped, "dropped_round": p.dropped_round, **p.stats,
                       "rounds": p.rounds})
    search_likes = [i for p in trace.probes for i in p.search_likes]
    record: dict[str, Any] = {
        "method": spec.method, "label": spec.label, "recommender": spec.box, "target": spec.target,
        "target_tags": list(spec.tags), "seed": spec.seed, "policy": policy_name(population.policy),
        "prompt_variant": population.prompt_variant,
        "target_visible": spec.target_visible if population.policy == "llm" else None,
        "allow_search": spec.allow_search, "task": spec.task,
        "k": len(population.personas), "target_size": len(target_items), "slate_size": spec.slate_size,
        "rounds": spec.rounds,
        "curves": round_curves(trace, target_items, spec.rounds),
        "efficiency_counts": efficiency_counts(trace, target_items, spec.rounds),
        "tag_found": tag_found(trace, dataset, spec.tags),
        "tag_sizes": {tag: len(dataset.items_with_tag(tag)) for tag in spec.tags},
        "popularity_curves": popularity_curves(trace, dataset, target_items, spec.rounds),
        "search_likes": len(search_likes),
        "search_target_likes": sum(i in target_items for i in search_likes),
        "setup_tokens": population.setup_tokens,
        "parse_failures": sum(p.get("parse_failures", 0) for p in probes),
        "decisions": sum(p.get("decisions", 0) for p in probes),
        "dropped": {p["probe_id"]: p["dropped"] for p in probes if p["dropped"]},
        **_fallback_counts(population),
        "artefacts": dict(population.artefacts),
        "personas": [x.to_dict() for x in population.personas],
        "probes": probes,
        "llm": llm.identity if llm is not None else None,
        "decision": _decision(population, settings),
        "box": recommender.identity,
        "timing": {"seconds": round(seconds, 2)},
    }
    if checks is not None:
        record["validity"] = validity_record(population, trace, target_items, dataset, checks, seed=spec.seed)
    if getattr(population, "setup_unknown_calls", 0):  # setup_tokens is then a lower bound
        record["setup_tokens_unknown"] = population.setup_unknown_calls
    if spec.phases is not None:
        record["phases"] = spec.phases.to_dict()
        if spec.task == "suppression":  # which way this episode steered (the key says it too)
            record["direction"] = spec.phases.direction
        record["persistence"] = phase_series(trace, target_items, spec.rounds)
    if spec.task == "profile-shaping":
        from ctrlsim.envs import make_task

        task = make_task("profile-shaping", dataset, target=list(spec.tags))
        record["profile_curves"] = profile_curves(trace, task, spec.rounds)
    return record
