"""PromptShift's units: the dataset preparation, the choices the paper leaves open, and one unit
(`UserLists`, key "<llm>/<user>") that generates the user's lists; plus the driver's checks and plan."""
from __future__ import annotations

import json
from typing import Mapping

from ctrlsim.backends import LLM
from ctrlsim.data.splits import AGE_GROUPS
from ctrlsim.experiments.config import config_from_dict
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.promptshift.config import GENERATION_CHOICES, PromptShiftConfig, UserLists
from ctrlsim.experiments.provenance import software_versions
from ctrlsim.experiments.runner import RunContext
from ctrlsim.recommenders.dial import is_dial
from ctrlsim.recommenders.promptshift.data import PromptShiftData, sample_users
from ctrlsim.recommenders.promptshift.defaults import (
    AUTO,
    MATCH_THRESHOLD,
    MATCH_THRESHOLDS,
    default_max_tokens,
)
from ctrlsim.recommenders.promptshift.engine import PromptShiftEngine
from ctrlsim.recommenders.promptshift.generation import REQUEST, GeneratedList
from ctrlsim.recommenders.promptshift.rerankers import PAPER_PARAMS, PARAM_GRID


def build_data(cfg: PromptShiftConfig, unit: UnitContext | None = None) -> PromptShiftData:
    """The dataset's PromptShift preparation (once per process: the driver and local units share it)."""
    unit = unit or UnitContext()
    key = "promptshift-data:" + json.dumps([cfg.dataset, cfg.scenarios, cfg.positive_threshold,
                                            cfg.history_len, cfg.min_fit_positives])

    def factory() -> PromptShiftData:
        threshold = AUTO if cfg.positive_threshold is None else cfg.positive_threshold
        return PromptShiftData.build(unit.dataset(cfg.dataset), scenarios=cfg.scenarios,
                                     positive_threshold=threshold, history_len=cfg.history_len,
                                     min_fit_positives=cfg.min_fit_positives)
    return unit.once(key, factory)


def protocol_choices(cfg: PromptShiftConfig, data: PromptShiftData) -> dict:
    """Every choice the paper leaves open, as this run makes it (printed in config.json and tables.md)."""
    domain = cfg.domain or data.domain
    return {
        "domain": domain,
        "positives": f"{'play count' if data.domain == 'music' else 'rating'} >= {data.positive_threshold:g}",
        "split": f"per user by time: first round({data.fractions[0]:.2f} n) fit, up to "
                 f"round({data.fractions[0] + data.fractions[1]:.2f} n) validation, rest test",
        "eligible users": f"{len(data.eligible)} (>= {data.min_fit_positives} fit positives, "
                          ">= 1 test positive, a slice in every scenario)",
        "user sample": "seeded; one user per gender-age slice first, the rest proportional to slice size",
        "age groups": ", ".join(f"{name} [{lo}, {hi})" for name, lo, hi in AGE_GROUPS),
        "request sentence": REQUEST[domain].format(n=cfg.n_candidates),
        "decoding": f"temperature {cfg.temperature}, max_tokens "
                    f"{cfg.max_tokens or default_max_tokens(cfg.n_candidates)}, stop at line N+1",
        "matching": "exact on normalised titles, then without leading article, then rapidfuzz "
                    "token_sort_ratio" + (
                        f" >= {cfg.match_threshold:g} (fixed)" if cfg.match_threshold is not None else
                        f" >= the threshold of {MATCH_THRESHOLDS} whose matches hit the most validation "
                        "positives (ties: the strictest)"),
        "title transforms": "fixed (case, accents, punctuation, release year, articles), not selected",
        "duplicates": "a later title matching an item already in the list is dropped",
        "history items in lists": "dropped" if cfg.exclude_history else "kept (as in the paper)",
        "unmatched titles": "SliceShift: " + ("contribute 0 and count in |L|" if cfg.unmatched == "zero"
                                              else "skipped")
                            + "; RBO: agree when their normalised titles agree; never a hit; B1-B3 keep "
                              "their slots",
        "RBO": "Webber et al.'s extrapolated RBO over the top K; lists of unequal length use its "
               "uneven-list form",
        "phi_bar_s": "mean of phi_bar_u over the sampled users (U_s)",
        "B1/B2": f"fixed alpha = alpha0 = {PAPER_PARAMS.alpha0}, no protected prefix",
        "B3 parameters": (f"chosen on validation over {PARAM_GRID}: highest validation Difficulty@K with "
                          "HitRate@K >= B0's (ties: the paper's values)") if cfg.select_on_validation
                         else "the paper's values",
        "t-tests": "one-tailed paired t-tests (our addition); 'undefined' when every difference is equal",
    }


# --------------------------------------------------------------------- units
def make_engine(cfg: PromptShiftConfig, data: PromptShiftData, llm: str | LLM,
                users=None) -> PromptShiftEngine:
    """The engine of one generator: an LLM (a spec or a live one) or a dial spec (`dial:<lambda>`,
    the reference generator of known cue dependence, docs/calibration.md)."""
    # A fixed threshold matches from the start; otherwise validation selection moves it.
    match_threshold = MATCH_THRESHOLD if cfg.match_threshold is None else cfg.match_threshold
    generator = None
    if isinstance(llm, str) and is_dial(llm):
        from ctrlsim.recommenders.promptshift.dial import make_list_generator

        llm, generator = None, make_list_generator(llm, data, n=cfg.n_candidates)  # type: ignore[assignment]
    return PromptShiftEngine(data, llm, users=users, generator=generator, n_candidates=cfg.n_candidates,
                             k=cfg.k, p=cfg.p,
                             rho=cfg.rho, match_threshold=match_threshold, max_tokens=cfg.max_tokens,
                             temperature=cfg.temperature, domain=cfg.domain,
                             exclude_history=cfg.exclude_history, unmatched=cfg.unmatched)


def generate_user_lists(cfg: PromptShiftConfig, unit: UnitContext) -> dict:
    """One `UserLists` unit: the user's L^0, P1-P3 and one cued list per scenario."""
    spec: UserLists = unit.spec
    user = spec.user
    data = build_data(cfg, unit)
    if is_dial(spec.llm):
        engine = make_engine(cfg, data, spec.llm, users=[user])
        identity = engine.config["generator"]
    else:
        llm = unit.llm(spec.llm)
        engine, identity = make_engine(cfg, data, llm, users=[user]), llm.identity
    lists, usage = engine.lists_for(user, engine.user_conditions(user))
    return {"user": user, "llm": identity, "lists": [c.generated.to_dict() for c in lists],
            "tokens": usage}


def generated_list(d: Mapping) -> GeneratedList:
    return GeneratedList(d["condition"], list(d["titles"]), d["text"], d["prompt_tokens"],
                         d["completion_tokens"], d.get("raw_count", 0), d.get("error"))


def check(ctx: RunContext) -> None:
    """The dataset's preparation and the user sample: no model is loaded."""
    data = build_data(ctx.config, ctx.unit)  # loads the dataset only
    ctx.state.update(data=data, users=sample_users(data, ctx.config.users, ctx.config.seed),
                     choices=protocol_choices(ctx.config, data))
    from ctrlsim.backends.bundled import check_cache_writable
    from ctrlsim.backends.spec_check import llm_cache_uses

    given = ctx.resources.get("llms", {})  # loaded LLMs (tests, benchmarks) load nothing
    check_cache_writable({part: what for spec in ctx.config.llms if spec not in given
                          for part, what in llm_cache_uses(spec).items()})


def identity(ctx: RunContext) -> dict:
    # The records are generated lists, so the folder's identity is what generation depends on; the
    # other choices only shape the tables, which are always recomputed from the lists.
    generation = {key: ctx.state["choices"][key] for key in GENERATION_CHOICES}
    return {"config": ctx.config.identity(), "users": ctx.state["users"], "generation": generation}


def from_identity(identity: Mapping) -> PromptShiftConfig:
    return config_from_dict(PromptShiftConfig, identity.get("config", identity))


def prepare(ctx: RunContext) -> None:
    assert ctx.folder is not None
    ctx.folder.write_json("config.json", {
        "runner": "promptshift", "config": ctx.folder.config, "choices": ctx.state["choices"],
        "provenance": ctx.folder.provenance, "software": software_versions()})


def plan(ctx: RunContext, finished) -> list[UserLists]:
    return ctx.config.units(ctx.state["users"])


DECISION = "one generated candidate list (one prompt of one user)"


def decisions(config, key: str, record: dict) -> int:
    return len(record.get("lists") or ())
