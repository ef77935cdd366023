"""`ctrlsim calibrate`'s units: one (method, box, seed) of a protocol -> its observations.

Each protocol's unit reuses that protocol's own pieces (ctrlbench's `run_episode`, SteerEval's env
and interventions, PromptShift's engine and rerankers), so what is calibrated is the instrument
users run, not a copy of it. A unit's record:

  values   metric -> observation id -> value (ctrlbench: `seed=N/<target>`; SteerEval:
           `seed=N/<user>/<tag>/<direction>`; PromptShift: `seed=N/<user>/<scenario>`)
  known    at a dial's lambda = 0, the values the metric must take by construction, where they
           depend on the observation (ctrlbench's Exposure); constant known answers are the report's
  details  what the unit cost and every fallback it met (LLM parse failures, template personas,
           refused or misread edits, unmatched titles)
"""
from __future__ import annotations

import time
from typing import Any

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.calibrate.config import (
    CalibrateConfig,
    ctrlbench_config,
    parse_unit_key,
    promptshift_config,
    steereval_config,
)
from ctrlsim.experiments.runner import ProgressPayload
from ctrlsim.recommenders.dial import is_dial, parse_dial_spec


def _lambda(box: str) -> float | None:
    return parse_dial_spec(box).lam if is_dial(box) else None


def _llm_cache(config: CalibrateConfig) -> str | None:
    """The response cache's path (nothing is created: the cache makes its folder when it opens)."""
    from ctrlsim.experiments.units import shared_cache_file

    return str(shared_cache_file("calibrate", "llm-responses.sqlite")) if config.cache else None


def _steereval_needs_llm(method: str, box: str) -> bool:
    from ctrlsim.experiments.steereval.units import CONDITIONS

    intervention = CONDITIONS[STEEREVAL_CONDITION[method]].intervention
    return intervention in ("llm-append", "llm-rewrite") or box == "llm"


def cache_uses(config: CalibrateConfig) -> dict[str, str]:
    """What the calibration keeps under $CTRLSIM_CACHE (subfolder -> what), for the up-front check:
    ctrlbench units what their episodes keep (`ctrlbench.cache_uses`); LLM units of the other
    protocols their replies (with --cache) and a bundled LLM. Dial boxes and token-free methods
    need nothing there."""
    uses: dict[str, str] = {}
    boxes = config.boxes()
    if config.protocol == "ctrlbench":
        from ctrlsim.experiments.ctrlbench.inputs import cache_uses as episode_uses

        for method in config.all_methods:
            for box in boxes:
                episode = ctrlbench_config(config, method, box, config.seeds[0])
                for part, what in episode_uses(episode).items():
                    uses.setdefault(part, what)
        return uses
    if config.protocol == "steereval":
        needs = any(_steereval_needs_llm(m, b) for m in config.all_methods for b in boxes)
        llms = [config.llm] if needs else []
    else:  # promptshift: every box that is not a dial is an LLM
        llms = [b for b in boxes if not is_dial(b)]
    if llms:
        from ctrlsim.backends.spec_check import llm_cache_uses

        for spec in llms:
            uses.update(llm_cache_uses(spec))
        if config.cache:
            uses["calibrate"] = f"the LLM replies of {', '.join(llms)} (--cache false keeps none)"
    return uses


# ----------------------------------------------------------------------------- up-front checks

def check_data(config: CalibrateConfig) -> None:
    """The data checks of the protocol (tags, targets, feasible scenarios, eligible users): no model."""
    method, box = config.all_methods[0], config.boxes()[0]
    if config.protocol == "ctrlbench":
        from ctrlsim.experiments.ctrlbench.inputs import check_targets, run_dataset

        cb = ctrlbench_config(config, method, box, config.seeds[0])
        check_targets(cb, run_dataset(cb))
    elif config.protocol == "steereval":
        for seed in config.seeds:
            if not _steereval_scenarios(steereval_config(config, method, box, seed))[1]:
                raise ConfigError(f"steereval: no feasible scenario for tags {list(config.tags)} at "
                                  f"pool_size={config.pool_size} (seed {seed})")
    else:
        from ctrlsim.experiments.promptshift.units import build_data
        from ctrlsim.recommenders.promptshift.data import sample_users

        for seed in config.seeds:
            cfg = promptshift_config(config, method, box, seed)
            sample_users(build_data(cfg), cfg.users, seed)


# ----------------------------------------------------------------------------- ctrlbench

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


def ctrlbench_unit(config: CalibrateConfig, method: str, box: str, seed: int, show_progress: bool) -> dict:
    from ctrlsim.experiments.ctrlbench.config import episode_key
    from ctrlsim.experiments.ctrlbench.inputs import run_box, run_dataset, target_items
    from ctrlsim.experiments.ctrlbench.units import run_episode

    cb = ctrlbench_config(config, method, box, seed)
    dataset = run_dataset(cb)
    values: dict[str, dict[str, float]] = {"coverage": {}, "exposure": {}}
    known: dict[str, dict[str, float]] = {}
    details: dict[str, Any] = {"decisions": 0, "parse_failures": 0, "template_fallbacks": 0,
                               "dropped_probes": 0, "probes": 0}
    starts: dict[str, list[list[str]]] = {}
    identity = llm = None
    validity: list[dict] = []  # each episode's validity decisions, for the report's card
    for target in config.targets:
        # Episode bars only for LLM probes: a scripted episode takes milliseconds.
        bars = show_progress and method not in ("oracle", "random")
        record = run_episode(cb, episode_key(method, box, target, seed), show_progress=bars)
        targets = set(target_items(dataset, target))
        obs = f"seed={seed}/{target}"
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
        if _lambda(box) == 0.0:
            recommender = run_box(cb, box)
            known.setdefault("exposure", {})[obs] = 100.0 * fixed_exposure(
                recommender.base_order, histories, cb.rounds, record["slate_size"], targets, dataset.item_ids)
    return {"values": values, "known": known, "details": details, "start_histories": starts,
            "box_identity": identity, "llm": llm, "episodes_validity": validity}


# ----------------------------------------------------------------------------- SteerEval

def _steereval_scenarios(cfg) -> tuple[tuple, list]:
    """(data, scenarios) of a SteerEval config, once per process (they need no model)."""
    from ctrlsim.experiments.executor import worker_cache
    from ctrlsim.experiments.steereval.units import prepare_dataset, scenarios_for

    def build():
        data = prepare_dataset(cfg)
        return data, scenarios_for(cfg, data)[0]
    return worker_cache(f"calibrate-steereval:{cfg!r}", build)


# Each SteerEval method is the intervention of one of SteerEval's conditions, on the unit's ranker.
STEEREVAL_CONDITION = {"template": "default", "stronger": "stronger", "weaker": "weaker",
                       "llm-append": "llm-append", "llm-rewrite": "llm-rewrite"}


def steereval_unit(config: CalibrateConfig, method: str, box: str, seed: int, show_progress: bool) -> dict:
    import dataclasses

    from ctrlsim.envs.steereval_env import to_observation_text
    from ctrlsim.experiments.steereval.units import CONDITIONS, intervention_policy, make_env
    from ctrlsim.experiments.units import cached_llm

    cfg = steereval_config(config, method, box, seed)
    data, scenarios = _steereval_scenarios(cfg)
    cond = dataclasses.replace(CONDITIONS[STEEREVAL_CONDITION[method]], ranker=box)
    needs_llm = _steereval_needs_llm(method, box)
    model: Any = cached_llm(config.llm, _llm_cache(config)) if needs_llm else config.llm
    policy = intervention_policy(cond, model)
    env = make_env(cfg, data, cond, model)
    start = model.meter.total if needs_llm else None
    values: dict[str, float] = {}
    problems = 0
    for sc in scenarios:
        obs, info = env.reset(options={"scenario": sc})
        steered = to_observation_text(policy.act(obs, info))
        _, reward, _, _, figures = env.step(steered)
        values[f"seed={seed}/{sc.user_id}/{sc.tag}/{sc.direction}"] = float(reward)
        problems += bool(set(figures.get("edit_problems", ())) & {"empty", "refusal", "unchanged"})
    details: dict[str, Any] = {"scenarios": len(scenarios), "edits_refused_or_unchanged": problems}
    if start is not None:
        total = model.meter.total
        details["tokens"] = {"prompt": total.prompt_tokens - start.prompt_tokens,
                             "completion": total.completion_tokens - start.completion_tokens}
        if total.unknown_calls - start.unknown_calls:  # calls whose server sent no counts
            details["tokens"]["unknown_calls"] = total.unknown_calls - start.unknown_calls
    engine = env.engine
    return {"values": {"delta_auc": values}, "known": {}, "details": details,
            "box_identity": engine.recommender().identity,
            "llm": model.identity if needs_llm else None}


# ----------------------------------------------------------------------------- PromptShift

def promptshift_unit(config: CalibrateConfig, method: str, box: str, seed: int, show_progress: bool) -> dict:
    from ctrlsim.experiments.promptshift.units import build_data
    from ctrlsim.experiments.promptshift.units import make_engine as _engine
    from ctrlsim.experiments.units import cached_llm
    from ctrlsim.recommenders.promptshift.data import sample_users
    from ctrlsim.recommenders.promptshift.rerankers import PAPER_PARAMS
    from ctrlsim.recommenders.promptshift.selection import reranker_set

    cfg = promptshift_config(config, method, box, seed)
    data = build_data(cfg)
    users = sample_users(data, cfg.users, seed)
    # The runner's own engine: a dial spec gets the dial generator, an LLM spec the LLM's lists.
    engine = _engine(cfg, data, box if is_dial(box) else cached_llm(box, _llm_cache(config)), users=users)
    reranker = reranker_set(engine, PAPER_PARAMS)[method.upper()]
    values: dict[str, dict[str, float]] = {"drift": {}, "slice_shift": {}}
    unmatched = parse_errors = 0
    for user in users:
        history = engine.history_slots(user)
        for scenario in cfg.scenarios:
            episode = engine.episode(user, scenario)
            order = reranker.order(engine.candidate_slots(episode), episode.slice_id, history)
            metrics = engine.evaluate(episode, order)
            obs = f"seed={seed}/{user}/{scenario}"
            values["drift"][obs] = float(metrics["drift"])
            values["slice_shift"][obs] = float(metrics["slice_shift"])
            counts = episode.cue.counts()
            unmatched += counts["unmatched"]
            parse_errors += counts["parse_error"]
    details = {"users": len(users), "unmatched_titles": unmatched, "parse_errors": parse_errors,
               **engine.generated_usage}
    about = engine.config
    return {"values": values, "known": {}, "details": details,
            "box_identity": about.get("generator") or about.get("llm"),
            "llm": None if is_dial(box) else about.get("llm")}


UNITS = {"ctrlbench": ctrlbench_unit, "steereval": steereval_unit, "promptshift": promptshift_unit}


def run_unit(config: CalibrateConfig, key: str, *, show_progress: bool = False) -> dict:
    """One (method, box, seed) unit -> its record (a pure function of the config and the key)."""
    started = time.perf_counter()
    method, box, seed = parse_unit_key(key)
    record = UNITS[config.protocol](config, method, box, seed, show_progress)
    return {"protocol": config.protocol, "method": method, "box": box, "lambda": _lambda(box), "seed": seed,
            **record, "timing": {"seconds": round(time.perf_counter() - started, 2)}}


# ----------------------------------------------------------------------------- driver hooks

def calibrate_unit(unit: ProgressPayload, key: str) -> dict:
    return run_unit(unit.config, key, show_progress=unit.show_progress)


def check(ctx) -> None:
    from ctrlsim.backends.bundled import check_cache_writable

    check_data(ctx.config)
    check_cache_writable(cache_uses(ctx.config))  # an unwritable $CTRLSIM_CACHE fails now, not per unit


def plan(ctx, finished) -> list[str]:
    return ctx.config.keys()
