"""`ctrlsim calibrate`'s units: one (method, box, seed) of a protocol -> its observations.

Each unit calls the protocol's own observation function (`Runner.observation`: ctrlbench's
episodes, SteerEval's env and interventions, PromptShift's engine and rerankers) with the unit's
own context, so what is calibrated is the instrument users run, not a copy of it, its replies go
to this run's response caches, and this package imports none of theirs. A unit's record:

  values   metric -> observation id -> value (ctrlbench: `seed=N/<target>`; SteerEval:
           `seed=N/<user>/<tag>/<direction>`; PromptShift: `seed=N/<user>/<scenario>`)
  known    at a dial's lambda = 0, the values the metric must take by construction, where they
           depend on the observation (ctrlbench's Exposure); constant known answers are the report's
  details  what the unit cost and every fallback it met (LLM parse failures, template personas,
           refused or misread edits, unmatched titles)
  observed (ctrlbench --task persistence) half_life -> observation id -> whether the episode fell to
           half within the release (False: its half-life is censored at the last release round)
"""
from __future__ import annotations

import time
from dataclasses import replace

from ctrlsim.experiments.calibrate.config import CalibrateConfig, CalibrationUnit
from ctrlsim.experiments.context import UnitContext
from ctrlsim.recommenders.dial import is_dial, parse_dial_spec


def _lambda(box: str) -> float | None:
    return parse_dial_spec(box).lam if is_dial(box) else None


def cache_uses(config: CalibrateConfig) -> dict[str, str]:
    """What the calibration keeps under $CTRLSIM_CACHE (subfolder -> what), for the up-front check:
    what the protocol keeps itself and a bundled LLM (replies and personas live in the run folder).
    Dial boxes and token-free methods need nothing there."""
    from ctrlsim.backends.spec_check import llm_cache_uses

    observation, boxes = config.observation, config.boxes()
    uses = dict(observation.cache_uses(config, config.all_methods, boxes))
    for spec in observation.llms(config, config.all_methods, boxes):
        uses.update(llm_cache_uses(spec))
    return uses


def check_data(config: CalibrateConfig, unit: UnitContext) -> None:
    """The data checks of the protocol (tags, targets, feasible scenarios, eligible users): no model."""
    config.observation.check(config, config.all_methods[0], config.boxes()[0], unit)


def run_unit(config: CalibrateConfig, unit: UnitContext) -> dict:
    """One (method, box, seed) unit -> its record (a pure function of the config and the unit's spec)."""
    started = time.perf_counter()
    spec: CalibrationUnit = unit.spec
    if not config.cache:  # --cache false: every reply and persona is paid for
        unit = UnitContext(replace(unit.settings, run_folder=None, shared_cache=None), unit.key, spec)
    record = config.observation.observe(config, spec.method, spec.box, spec.seed, unit)
    return {"protocol": config.protocol, "method": spec.method, "box": spec.box, "lambda": _lambda(spec.box),
            "seed": spec.seed, **record, "timing": {"seconds": round(time.perf_counter() - started, 2)}}


# ----------------------------------------------------------------------------- driver hooks

def check(ctx) -> None:
    from ctrlsim.backends.bundled import check_cache_writable

    check_data(ctx.config, ctx.unit)
    check_cache_writable(cache_uses(ctx.config))  # an unwritable $CTRLSIM_CACHE fails now, not per unit


def plan(ctx, finished) -> list[CalibrationUnit]:
    return ctx.config.units()


DECISION = ("as in the calibrated protocol: one probe's choice on one slate (ctrlbench), one profile "
            "edit (steereval), one generated list (promptshift)")


def decisions(config, key: str, record: dict) -> int:
    """From the unit's details: ctrlbench's probes x episode rounds, SteerEval's scenarios,
    PromptShift's calls."""
    details = record.get("details") or {}
    if "probes" in details:
        # a persistence episode plays baseline + steering + release rounds (callers' configs
        # without the property play --rounds)
        return int(details["probes"]) * getattr(config, "episode_rounds", config.rounds)
    if "scenarios" in details:
        return int(details["scenarios"])
    return int(details.get("calls") or 0)
