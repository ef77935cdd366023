"""`ctrlsim controls`' units: one (control, value, seed) or the non-profiled check -> its record."""
from __future__ import annotations

import time

import numpy as np

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.controls.config import ControlsConfig, ControlUnit
from ctrlsim.seeding import derive_rng


def declared(config: ControlsConfig, unit: UnitContext, box: str):
    """The box's declared controls (`Controls`): in-process, or what its service answers."""
    return unit.box(box, config.dataset).controls


def personas(config: ControlsConfig, unit: UnitContext, seed: int) -> list[tuple[str, tuple[str, ...]]]:
    """(user id, first `history` liked items) of `users` users drawn by `seed` among those with enough."""
    from ctrlsim.envs.roster import seed_items, user_order

    dataset = unit.dataset(config.dataset)
    users = [u for u in user_order(dataset) if len(dataset.history_ids(u, min_rating=4.0)) >= config.history]
    if len(users) < config.users:
        raise ConfigError(f"only {len(users)} users liked {config.history} items; ask for fewer --users")
    order = derive_rng(seed, "controls-users").permutation(len(users))[:config.users]
    return [(users[i], tuple(seed_items(dataset, users[i], config.history))) for i in order]


def _slates(config: ControlsConfig, unit: UnitContext, box_name: str, people,
            settings: dict) -> list[list[str]]:
    from ctrlsim.recommenders import UserState

    box = unit.box(box_name, config.dataset)
    states = [UserState(history=h, user_id=u, settings=settings) for u, h in people]
    return [s.item_ids for s in box.recommend(states, config.slate_size)]


def _distance(a: list[str], b: list[str]) -> float:
    union = set(a) | set(b)
    return 1.0 - len(set(a) & set(b)) / len(union) if union else 0.0


def partners(dataset, people, seed: int) -> tuple[list[int], list[int]]:
    """For each persona, the index of the most different other one (lowest cosine between tag-count
    profiles of their histories; ties: the first) and of a random other one (seeded)."""
    tags = sorted({t for item_tags in dataset.items["tags"] for t in item_tags})
    column = {t: c for c, t in enumerate(tags)}
    profiles = np.zeros((len(people), len(tags)))
    for row, (_, history) in enumerate(people):
        for item in history:
            for tag in dataset.items["tags"].iat[dataset.item_index[item]]:
                profiles[row, column[tag]] += 1
    unit_rows = profiles / np.maximum(np.linalg.norm(profiles, axis=1, keepdims=True), 1e-12)
    cosine = unit_rows @ unit_rows.T
    np.fill_diagonal(cosine, np.inf)
    rng = derive_rng(seed, "controls-random-partners")
    randoms = [int(rng.choice([j for j in range(len(people)) if j != i])) for i in range(len(people))]
    return [int(np.argmin(row)) for row in cosine], randoms


def run_unit(config: ControlsConfig, unit: UnitContext) -> dict:
    from ctrlsim.recommenders.controls import slate_property

    started = time.perf_counter()
    spec: ControlUnit = unit.spec
    controls = declared(config, unit, spec.box)
    dataset = unit.dataset(config.dataset)
    people = personas(config, unit, spec.seed)
    record: dict = {"recommender": spec.box, "seed": spec.seed, "users": [u for u, _ in people]}
    if spec.control is None:
        if not controls.non_profiled:
            raise ConfigError(f"{spec.box} declares no non-profiled mode")
        extreme, random = partners(dataset, people, spec.seed)
        for mode, settings in (("non_profiled", dict(controls.non_profiled)), ("profiled", {})):
            slates = _slates(config, unit, spec.box, people, settings)
            record[mode] = {"settings": settings, "slates": slates,
                            "extreme": [_distance(slates[i], slates[j]) for i, j in enumerate(extreme)],
                            "random": [_distance(slates[i], slates[j]) for i, j in enumerate(random)]}
        record.update(kind="non_profiled", extreme_partner=extreme, random_partner=random)
    else:
        control = controls.by_name()[spec.control]
        slates = _slates(config, unit, spec.box, people, {spec.control: spec.value})
        record.update(kind="control", control=spec.control, value=spec.value, property=control.property,
                      slates=slates, values=[slate_property(control.property, dataset, s, h)
                                             for s, (_, h) in zip(slates, people)])
    record["box"] = unit.box(spec.box, config.dataset).identity
    record["timing"] = {"seconds": round(time.perf_counter() - started, 3)}
    return record


# ----------------------------------------------------------------------------- driver hooks

def plan(ctx, finished) -> list[ControlUnit]:
    """Every declared control at every sweep value, and the non-profiled check where declared."""
    config = ctx.config
    units = []
    for box in config.boxes:
        controls = declared(config, ctx.unit, box)
        units += [ControlUnit(box, c.name, value, seed) for c in controls.controls
                  for value in c.sweep(config.points) for seed in config.seeds]
        if controls.non_profiled:
            units += [ControlUnit(box, None, None, seed) for seed in config.seeds]
    return units


def check(ctx) -> None:
    """Enough users for the personas: no box is asked anything yet."""
    personas(ctx.config, ctx.unit, ctx.config.seeds[0])


DECISION = "one slate requested for one persona"


def decisions(config, key: str, record: dict) -> int:
    return len(record.get("users") or ()) * (2 if record.get("kind") == "non_profiled" else 1)
