"""ctrlbench's observation function: one (method, box, seed) of CtrlBench-Rec as calibration data.

`observe` plays the protocol's own episodes (`units.run_episode`), one per target, in the caller's
unit context (its models, its response caches), and returns
Coverage and Exposure per (seed, target), the known Exposure of a box that ignores its users (a
dial at lambda 0), what the episodes cost, and each episode's validity decisions. `ctrlsim
calibrate` and the audit reach it through the runner's declaration (`RUNNER.observation`), never
by importing this package.

A caller whose config has `task = "persistence"` (and `baseline_rounds`, `release_rounds`) gets
steer-then-release episodes instead, and per (seed, target) their figures (`persistence.
episode_persistence`): s0 and s* for every episode with recommender slates in every round, and the
half-life (rounds; its `observed` flag False = censored at the last release round), retention
area and relapse share for those steering moved (`PERSISTENCE_METRICS`). A caller without a `task`
field observes target discovery, as before.
"""
from __future__ import annotations

from typing import Any

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.ctrlbench.config import PERSISTENCE, CtrlBenchConfig, Episode
from ctrlsim.experiments.ctrlbench.inputs import cache_uses as episode_cache_uses
from ctrlsim.experiments.ctrlbench.inputs import check_targets, run_box, target_items
from ctrlsim.experiments.ctrlbench.units import run_episode
from ctrlsim.experiments.runner import Observation
from ctrlsim.recommenders.dial import is_dial, parse_dial_spec

# What a persistence observation holds per episode (s0, s* for every measured one; the rest for
# those steering moved), in the order `ctrlsim calibrate --task persistence` reports them.
PERSISTENCE_METRICS = ("half_life", "area", "relapse", "s0", "s_star")


def _task_fields(cal: Any) -> dict[str, Any]:
    """The persistence task's fields of a caller that asks for it; nothing otherwise (callers without
    a `task` field, such as the audit's, observe target discovery with ctrlbench's defaults)."""
    if getattr(cal, "task", None) != PERSISTENCE:
        return {}
    return {"task": PERSISTENCE, "baseline_rounds": cal.baseline_rounds, "release_rounds": cal.release_rounds}


def config_for(cal: Any, method: str, box: str, seed: int) -> CtrlBenchConfig:
    """The protocol's own config for one calibration unit (validated as ctrlbench validates it)."""
    return CtrlBenchConfig(methods=(method,), recommenders=(box,), targets=cal.targets, llm=cal.llm,
                           agents=cal.agents, rounds=cal.rounds, seeds=(seed,), slate_size=cal.slate_size,
                           dataset=cal.dataset, cache=cal.cache, decision=cal.decision,
                           decision_threshold=cal.decision_threshold, **_task_fields(cal))


def check_methods(methods: tuple[str, ...]) -> None:
    from ctrlsim.agents.methods import get_method

    for method in methods:
        try:
            get_method(method)
        except ConfigError as exc:
            raise ConfigError(f"methods: protocol ctrlbench does not take {method!r}: {exc}") from None


def check_compare(box: str) -> None:
    from ctrlsim.recommenders.registry import check_recommender_name

    check_recommender_name(box)


def check(cal: Any, method: str, box: str, unit: UnitContext) -> None:
    """The targets exist and are large enough: no model loads."""
    cb = config_for(cal, method, box, cal.seeds[0])
    check_targets(cb, unit.dataset(cb.dataset))


def cache_uses(cal: Any, methods: tuple[str, ...], boxes: list[str]) -> dict[str, str]:
    """What the episodes keep under $CTRLSIM_CACHE (ctrlbench's own cache)."""
    uses: dict[str, str] = {}
    for method in methods:
        for box in boxes:
            for part, what in episode_cache_uses(config_for(cal, method, box, cal.seeds[0])).items():
                uses.setdefault(part, what)
    return uses


def fixed_exposure(base_order, histories, rounds: int, slate_size: int, targets: set[str], item_ids) -> float:
    """The share of `targets` a box that ignores its users shows them in `rounds` rounds.

    With shown items masked (as ctrlbench runs every box), probe j's slates are the first
    rounds * slate_size items of the base ranking less its starting history, whatever it likes.
    """
    shown: set[str] = set()
    for history in histories:
        start = set(history)
        ranked = (str(item_ids[i]) for i in base_order if str(item_ids[i]) not in start)
        shown.update(next(ranked) for _ in range(rounds * slate_size))
    return len(shown & targets) / len(targets)


def persistence_values(record: dict, obs: str, values: dict[str, dict[str, float]],
                       observed: dict[str, bool]) -> None:
    """One steer-then-release episode's figures into `values` (metric -> obs -> value) and its
    half-life's flag into `observed` (True: it fell to half; False: censored)."""
    from ctrlsim.experiments.ctrlbench.persistence import episode_persistence

    figures = episode_persistence(record)
    if figures["s0"] is None:  # a round without a recommender slate: nothing measured
        return
    values["s0"][obs], values["s_star"][obs] = figures["s0"], figures["s_star"]
    if figures.get("curve") is not None:
        values["half_life"][obs] = int(figures["half_life"])
        values["area"][obs], values["relapse"][obs] = figures["area"], figures["relapse"]
        observed[obs] = bool(figures["observed"])


def observe(cal: Any, method: str, box: str, seed: int, unit: UnitContext) -> dict:
    """Coverage and Exposure (%) per `seed=N/<target>` from one episode per target (with a caller's
    `task = "persistence"`: the steer-then-release figures, see the module docstring)."""
    cb = config_for(cal, method, box, seed)
    dataset = unit.dataset(cb.dataset)
    persists = cb.task == PERSISTENCE
    values: dict[str, dict[str, float]] = ({m: {} for m in PERSISTENCE_METRICS} if persists
                                           else {"coverage": {}, "exposure": {}})
    observed: dict[str, bool] = {}
    known: dict[str, dict[str, float]] = {}
    details: dict[str, Any] = {"decisions": 0, "parse_failures": 0, "template_fallbacks": 0,
                               "dropped_probes": 0, "probes": 0}
    starts: dict[str, list[list[str]]] = {}
    identity = llm = None
    validity: list[dict] = []  # each episode's validity decisions, for the report's card
    lam = parse_dial_spec(box).lam if is_dial(box) else None
    for target in cal.targets:
        # Episode bars only for LLM probes: a scripted episode takes milliseconds.
        record = run_episode(cb, unit, Episode(method, box, target, seed),
                             bars=method not in ("oracle", "random"))
        targets = set(target_items(dataset, target))
        obs = f"seed={seed}/{target}"
        if persists:
            persistence_values(record, obs, values, observed)
        else:
            values["coverage"][obs] = 100.0 * float(record["curves"]["coverage"][-1])
            surfaced = {i for p in record["probes"] for r in p["rounds"] if r["source"] == "recommender"
                        for i in r["slate"]}
            values["exposure"][obs] = 100.0 * len(surfaced & targets) / len(targets)
        details["decisions"] += int(record.get("decisions") or 0)
        details["parse_failures"] += int(record.get("parse_failures") or 0)
        details["template_fallbacks"] += int(record.get("template_fallbacks") or 0)
        details["dropped_probes"] += len(record.get("dropped") or {})
        details["probes"] += int(record["k"])
        identity, llm = record["box"], record["llm"]
        validity.append({k: record.get(k)
                         for k in ("method", "label", "recommender", "target", "seed", "validity")})
        histories = [list(p["behaviour"]) for p in record["personas"]]
        starts[obs] = histories
        if lam == 0.0 and not persists:
            recommender = run_box(unit, cb, box)
            known.setdefault("exposure", {})[obs] = 100.0 * fixed_exposure(
                recommender.base_order, histories, cb.rounds, record["slate_size"], targets, dataset.item_ids)
    out = {"values": values, "known": known, "details": details, "start_histories": starts,
           "box_identity": identity, "llm": llm, "episodes_validity": validity}
    if persists:
        out["observed"] = {"half_life": observed}
    return out


OBSERVATION = Observation(
    config_for=config_for, observe=observe, check=check, cache_uses=cache_uses, llms=lambda cal, m, b: [],
    check_methods=check_methods, check_compare=check_compare, metrics=("coverage", "exposure"),
    share_metrics=("coverage", "exposure"),
    default_methods=("oracle", "random"), dial_kind="dial")
