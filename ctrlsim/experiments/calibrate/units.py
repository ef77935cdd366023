"""`ctrlsim calibrate`'s units: one (method, box, seed) of a protocol -> its observations.

Each unit calls the protocol's own observation function (`Runner.observation`: ctrlbench's
episodes, SteerEval's env and interventions, PromptShift's engine and rerankers), so what is
calibrated is the instrument users run, not a copy of it, and this package imports none of theirs.
A unit's record:

  values   metric -> observation id -> value (ctrlbench: `seed=N/<target>`; SteerEval:
           `seed=N/<user>/<tag>/<direction>`; PromptShift: `seed=N/<user>/<scenario>`)
  known    at a dial's lambda = 0, the values the metric must take by construction, where they
           depend on the observation (ctrlbench's Exposure); constant known answers are the report's
  details  what the unit cost and every fallback it met (LLM parse failures, template personas,
           refused or misread edits, unmatched titles)
"""
from __future__ import annotations

import time

from ctrlsim.experiments.calibrate.config import CalibrateConfig, parse_unit_key
from ctrlsim.experiments.runner import ProgressPayload
from ctrlsim.recommenders.dial import is_dial, parse_dial_spec


def _lambda(box: str) -> float | None:
    return parse_dial_spec(box).lam if is_dial(box) else None


def _llm_cache(config: CalibrateConfig) -> str | None:
    """The response cache's path (nothing is created: the cache makes its folder when it opens)."""
    from ctrlsim.experiments.units import shared_cache_file

    return str(shared_cache_file("calibrate", "llm-responses.sqlite")) if config.cache else None


def cache_uses(config: CalibrateConfig) -> dict[str, str]:
    """What the calibration keeps under $CTRLSIM_CACHE (subfolder -> what), for the up-front check:
    what the protocol keeps itself (ctrlbench's episodes), and the replies of the LLMs its units
    load (with --cache) and a bundled LLM. Dial boxes and token-free methods need nothing there."""
    observation, boxes = config.observation, config.boxes()
    uses = dict(observation.cache_uses(config, config.all_methods, boxes))
    llms = observation.llms(config, config.all_methods, boxes)
    if llms:
        from ctrlsim.backends.spec_check import llm_cache_uses

        for spec in llms:
            uses.update(llm_cache_uses(spec))
        if config.cache:
            uses["calibrate"] = f"the LLM replies of {', '.join(llms)} (--cache false keeps none)"
    return uses


def check_data(config: CalibrateConfig) -> None:
    """The data checks of the protocol (tags, targets, feasible scenarios, eligible users): no model."""
    config.observation.check(config, config.all_methods[0], config.boxes()[0])


def run_unit(config: CalibrateConfig, key: str, *, show_progress: bool = False) -> dict:
    """One (method, box, seed) unit -> its record (a pure function of the config and the key)."""
    started = time.perf_counter()
    method, box, seed = parse_unit_key(key)
    record = config.observation.observe(config, method, box, seed, show_progress=show_progress,
                                        llm_cache=_llm_cache(config))
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
