"""The fixed validity checks every probe takes at the start of an episode (issue 42).

Two small, fixed decision sets, the same for every black box (they never touch the box):

- the adherence check: `CHECK_ITEMS` movies, half from the target, half not, drawn once per
  (dataset, target, seed), shown to each probe as it stands at the start of the episode (fresh, no
  memory) in slates of the episode's size. A probe that acts on its goal likes the targets.
- the fidelity check: for a probe built from a dataset user (probe id "user-<id>"), up to
  `CHECK_ITEMS // 2` items that user rated >= 4 and as many rated <= 2, none of them in the persona's
  seed history, shown with the goal hidden: the probe as the user it plays. A probe with no source
  user (a merged super probe) has no fidelity check.

Both run through the population's own policy (LLM heads, scripted, learned or custom), with their own
seed stream (`derive_rng(seed, "validity-check", ...)`), so the episode's draws are unchanged, and
their tokens on their own meter (reported apart from Table 7's). Each decision is stored in the
episode record, so anyone can recompute the card (`ctrlsim.metrics.validity`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from ctrlsim.backends import TokenMeter
from ctrlsim.seeding import derive_rng, derive_seed

from .methods import CustomPolicy, Population
from .persona import Persona
from .random_probe import RandomProbe

CHECK_ITEMS = 6  # items per probe in each fixed check (half of each kind)
LIKED_RATING = 4.0  # fidelity positives: rated at least this
DISLIKED_RATING = 2.0  # fidelity negatives: rated at most this
USER_PREFIX = "user-"  # a probe built from dataset user u has probe id "user-<u>"


def source_user(persona: Persona) -> str | None:
    pid = persona.probe_id
    return pid[len(USER_PREFIX) :] if pid.startswith(USER_PREFIX) else None


def adherence_items(
    dataset, target_items: frozenset[str], target_name: str, seed: int, n: int = CHECK_ITEMS
) -> list[tuple[str, bool]]:
    """(item id, is target) for the adherence check: n // 2 targets and the rest non-targets,
    shuffled; the same for every box and method of a (target, seed)."""
    rng = derive_rng(seed, "validity-check", "adherence", target_name)
    targets = sorted(target_items)
    others = [i for i in dataset.item_ids.astype(str) if i not in target_items]
    k = min(n // 2, len(targets))
    picked = [(str(i), True) for i in rng.choice(targets, size=k, replace=False)] + [
        (str(i), False) for i in rng.choice(others, size=min(n - k, len(others)), replace=False)
    ]
    order = rng.permutation(len(picked))
    return [picked[i] for i in order]


def fidelity_items(dataset, persona: Persona, seed: int, n: int = CHECK_ITEMS) -> list[tuple[str, float]]:
    """(item id, rating) for the fidelity check of a probe built from a dataset user; [] otherwise."""
    user = source_user(persona)
    if user is None or user not in set(dataset.user_ids):
        return []
    history = dataset.history(user)
    history = history[~history["item_id"].astype(str).isin(set(persona.behaviour))]
    rng = derive_rng(seed, "validity-check", "fidelity", user)
    picked: list[tuple[str, float]] = []
    for rows in (history[history["rating"] >= LIKED_RATING], history[history["rating"] <= DISLIKED_RATING]):
        take = rng.choice(len(rows), size=min(n // 2, len(rows)), replace=False) if len(rows) else []
        picked += [(str(rows["item_id"].iat[i]), float(rows["rating"].iat[i])) for i in take]
    order = rng.permutation(len(picked))
    return [picked[i] for i in order]


def _chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _observation(dataset, items: Sequence[str], slate_size: int) -> tuple[dict, dict]:
    slate = np.full(slate_size, -1, dtype=np.int64)
    slate[: len(items)] = dataset.indices(items)
    texts = dataset.items["text"]
    obs = {"slate": slate, "source": 0, "round": 0}
    info = {
        "round": 0,
        "slate_item_ids": list(items),
        "slate_items": [str(texts.iat[i]) for i in slate[: len(items)]],
        "slate_source": "recommender",
        "new_likes": [],
        "metrics": {},
    }
    return obs, info


def _item_scores(reply: str | None, n: int) -> list[dict | None]:
    """Per item, the question head's logged probabilities ({"p_fit": .., "p_goal": ..}); None for
    heads that generate (json) and for scripted policies."""
    import json

    try:
        logged = json.loads(reply) if reply else None
    except json.JSONDecodeError:
        logged = None
    if not isinstance(logged, dict) or not all(isinstance(v, list) and len(v) == n for v in logged.values()):
        return [None] * n
    return [{k: v[i] for k, v in logged.items()} for i in range(n)]


class _CheckPolicy:
    """Decides fixed slates with a fresh copy of the population's policy, for the agents given."""

    def __init__(
        self,
        population: Population,
        dataset,
        agents: Mapping[str, Persona],
        *,
        seed: int,
        target: Sequence[str],
        llm,
        settings,
        like_prob: float,
        meter: TokenMeter,
        goal: bool,
    ):
        self.population, self.dataset, self.agents = population, dataset, dict(agents)
        self.seed, self.target, self.llm, self.like_prob, self.meter = (
            seed,
            tuple(target),
            llm,
            like_prob,
            meter,
        )
        self.settings = settings
        self.goal = goal

    def decide(self, slates: Mapping[str, list[str]], slate_size: int, budget: int, part: int) -> dict:
        """agent -> liked flags for its slate (a fresh policy each call: no memory of other slates);
        agents whose LLM call failed get None."""
        agents = [a for a in slates if slates[a]]
        pairs = {a: _observation(self.dataset, slates[a], slate_size) for a in agents}
        obs = {a: pairs[a][0] for a in agents}  # what the env would show at round 0
        infos = {a: pairs[a][1] for a in agents}
        seed = derive_seed(self.seed, "validity-check", part)
        if self.population.policy == "llm":
            from .llm_probe import LLMPopulationPolicy

            settings = replace(
                self.settings,
                prompt_variant=self.population.prompt_variant,
                target_visible=self.settings.target_visible and self.goal,
            )
            policy = LLMPopulationPolicy(
                self.llm,
                self.dataset,
                {a: self.agents[a] for a in agents},
                target=self.target,
                settings=settings,
                seed=seed,
                meter=self.meter,
            )
            actions, failed = policy.act(obs, infos, slate_size=slate_size, budget=budget)
            stats = {a: policy.probe_stats(a) for a in agents}
            replies = {a: policy.reply(a, 1) for a in agents}
        else:
            rngs = {a: derive_rng(seed, "agent", a) for a in agents}
            if isinstance(self.population.policy, CustomPolicy):
                custom = self.population.policy.make({a: self.agents[a] for a in agents}, rngs)
            else:
                custom = CustomPolicy.per_probe(
                    "random", lambda p, rng: RandomProbe(rng, self.like_prob)
                ).make({a: self.agents[a] for a in agents}, rngs)
            actions, failed, stats, replies = custom.act(obs, infos), {}, {}, {}
        out: dict[str, Any] = {}
        for a in agents:
            if a in failed:
                out[a] = None
                continue
            likes = np.asarray(actions[a]["likes"]).astype(bool)[: len(slates[a])]
            out[a] = {
                "liked": likes.tolist(),
                "parse_failures": stats.get(a, {}).get("parse_failures", 0),
                "scores": _item_scores(replies.get(a), len(slates[a])),
            }
        return out


def run_checks(
    population: Population,
    dataset,
    *,
    target_items: frozenset[str],
    target_name: str,
    target_tags: Sequence[str],
    seed: int,
    slate_size: int,
    budget: int,
    llm=None,
    settings=None,
    like_prob: float = 0.3,
) -> dict:
    """Both fixed checks for every probe of `population` -> the record's `validity` decisions:
    `check` ([{"probe", "item", "target", "liked"}]), `fidelity_check` ([{"probe", "item", "rating",
    "liked"}]), the checks' tokens and parse failures, and the probes whose check call failed."""
    from .llm_probe import DecisionSettings

    settings = settings if settings is not None else DecisionSettings()
    meter = TokenMeter()
    personas = {f"probe_{n}": p for n, p in enumerate(population.personas)}
    adherence = adherence_items(dataset, target_items, target_name, seed)
    target_flag = dict(adherence)
    fidelity = {a: fidelity_items(dataset, p, seed) for a, p in personas.items()}
    check: list[dict] = []
    fidelity_check: list[dict] = []
    failed: set[str] = set()
    parse_failures = 0
    for goal in (True, False):  # the adherence check with the goal shown, the fidelity check without
        policy = _CheckPolicy(
            population,
            dataset,
            personas,
            seed=seed,
            target=target_tags,
            llm=llm,
            settings=settings,
            like_prob=like_prob,
            meter=meter,
            goal=goal,
        )
        items = {a: [i for i, _ in adherence] if goal else [i for i, _ in fidelity[a]] for a in personas}
        chunked = {a: _chunks(items[a], slate_size) for a in personas}
        for part in range(max((len(c) for c in chunked.values()), default=0)):
            slates = {a: c[part] for a, c in chunked.items() if part < len(c)}
            decided = policy.decide(slates, slate_size, budget, part if goal else 1000 + part)
            for a, result in decided.items():
                pid = personas[a].probe_id
                if result is None:
                    failed.add(pid)
                    continue
                parse_failures += int(result["parse_failures"])
                for item, liked, score in zip(slates[a], result["liked"], result["scores"]):
                    extra = {"p": score} if score is not None else {}
                    if goal:
                        check.append(
                            {
                                "probe": pid,
                                "item": item,
                                "target": bool(target_flag[item]),
                                "liked": bool(liked),
                                **extra,
                            }
                        )
                    else:
                        fidelity_check.append(
                            {
                                "probe": pid,
                                "item": item,
                                "rating": dict(fidelity[a])[item],
                                "liked": bool(liked),
                                **extra,
                            }
                        )
    usage = meter.total
    return {
        "check": check,
        "fidelity_check": fidelity_check,
        "check_usage": usage.to_dict(),  # the checks are the instrument's cost, apart from the episode's
        "check_parse_failures": parse_failures,
        "check_failed_probes": sorted(failed),
    }


def relevant_like(dataset, persona: Persona, item: str) -> bool:
    """Appendix B's relevance constraint for one like: the item's tags meet the persona's interests
    (a tag named in an interest phrase) or the tags of its seed items."""
    tags = dataset.items["tags"]
    item_tags = {str(t) for t in tags.iat[dataset.item_index[item]]}
    seed_tags = {
        str(t) for i in persona.behaviour if i in dataset.item_index for t in tags.iat[dataset.item_index[i]]
    }
    interests = " ".join(persona.interests).lower()
    return bool(item_tags & seed_tags) or any(t.lower() in interests for t in item_tags)
