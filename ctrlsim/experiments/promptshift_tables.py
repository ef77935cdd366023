"""PromptShift Tables 4, 5 and 6 (Gan & Dong, section 5) on a dataset with bundled LLMs, resumable.

A run samples up to `users` eligible users once (seeded, stratified by the
gender-age slice) and, per LLM and user, generates the history-only list L^0,
the three paraphrase controls and one identity-cued list per scenario through
`ctrlsim.recommenders.promptshift.engine.PromptShiftEngine`. Each (LLM, user) is one
unit of work; its lists go to `records.jsonl` in the run folder as soon as
they exist, so a rerun generates nothing twice.

The tables are computed from the stored lists: the fuzzy matching threshold and
B3's parameters are chosen on the validation positives and frozen, then the
test positives are read once (`ctrlsim.recommenders.promptshift.selection`),
and `promptshift_report` averages and formats the records. Layouts: Table 4
(Paraphrase Drift, Cue Drift, Delta d, SliceShift per dataset-model), Table 5
(B0 vs B3 per dataset-model), Table 6 (B0-B3 macro means over settings).

    ctrlsim promptshift --llms qwen2.5-0.5b --users 8 --out results/promptshift
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ctrlsim.backends import LLM
from ctrlsim.backends.specs import parse_spec
from ctrlsim.data import load_dataset
from ctrlsim.data.splits import AGE_GROUPS, SCENARIOS
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    MAX_ITEMS,
    MAX_SEED,
    MAX_SLATE,
    MAX_TOKENS,
    MAX_USERS,
    RunOptions,
    bound,
    check_choice,
    check_choices,
    check_range,
    config_to_dict,
)
from ctrlsim.experiments.executor import worker_cache
from ctrlsim.experiments.promptshift_report import figures, format_tables, macro_table, summarise
from ctrlsim.experiments.provenance import software_versions
from ctrlsim.experiments.runner import RunContext, Runner
from ctrlsim.experiments.units import cached_llm, provide_llm
from ctrlsim.recommenders.dial import is_dial
from ctrlsim.recommenders.promptshift.data import PromptShiftData, sample_users
from ctrlsim.recommenders.promptshift.defaults import (
    AUTO,
    HISTORY_LEN,
    MATCH_THRESHOLD,
    MATCH_THRESHOLDS,
    MIN_FIT_POSITIVES,
    MOVIE_POSITIVE,
    N_CANDIDATES,
    PLAY_POSITIVE,
    RBO_P,
    RHO,
    TEMPERATURE,
    UNMATCHED_POLICIES,
    K,
    default_max_tokens,
)
from ctrlsim.recommenders.promptshift.engine import PromptShiftEngine
from ctrlsim.recommenders.promptshift.generation import DOMAINS, REQUEST, GeneratedList
from ctrlsim.recommenders.promptshift.rerankers import PAPER_PARAMS, PARAM_GRID
from ctrlsim.recommenders.promptshift.selection import validate_then_test

DEFAULT_RUN_LLM = "qwen2.5-0.5b"
# The choices the stored lists depend on (the rest only shape the tables).
GENERATION_CHOICES = ("domain", "positives", "request sentence", "decoding")


@dataclass(frozen=True)
class PromptShiftConfig:
    """Everything that determines a PromptShift run's results (stored in its config.json)."""

    llms: tuple[str, ...] = field(default=(DEFAULT_RUN_LLM,), metadata={"help": "LLM specs, comma-separated"})
    dataset: str = field(default="ml-100k", metadata={
        "help": "dataset name or path (e.g. a Last.fm-1K folder)"})
    users: int = field(default=8, metadata={
        "help": f"users to sample (the paper: up to 600; {bound(MAX_USERS)})"})
    seed: int = field(default=0, metadata={"help": f"seed of the stratified user sample ({bound(MAX_SEED)})"})
    scenarios: tuple[str, ...] = field(default=SCENARIOS, metadata={"help": "identity-cue scenarios",
                                                                    "choices": list(SCENARIOS)})
    n_candidates: int = field(default=N_CANDIDATES, metadata={
        "help": f"N, titles asked of the LLM per list ({bound(MAX_SLATE)})"})
    k: int = field(default=K, metadata={"help": f"K, the evaluated list length ({bound(MAX_SLATE)})"})
    history_len: int = field(default=HISTORY_LEN, metadata={
        "help": f"|H_u|, fit positives in the prompt ({bound(MAX_ITEMS)})"})
    min_fit_positives: int = field(default=MIN_FIT_POSITIVES, metadata={
        "help": f"fit positives a user needs ({bound(MAX_ITEMS)})"})
    positive_threshold: float | None = field(default=None, metadata={
        "help": f"rating (or play count) a positive needs; none: {MOVIE_POSITIVE:g} for ratings, "
                f"{PLAY_POSITIVE:g} plays for listening data"})
    domain: str | None = field(default=None, metadata={"help": "prompts; none: music for track catalogues",
                                                       "choices": list(DOMAINS)})
    p: float = field(default=RBO_P, metadata={"help": "RBO persistence"})
    rho: float = field(default=RHO, metadata={"help": "Difficulty@K rank bonus"})
    match_threshold: float | None = field(default=None, metadata={
        "help": f"fuzzy title-matching threshold; none: chosen on validation from {MATCH_THRESHOLDS}"})
    select_on_validation: bool = field(default=True, metadata={
        "help": "choose B3's parameters on validation positives (else the paper's values)"})
    max_tokens: int | None = field(default=None, metadata={
        "help": f"reply budget; none: 16 per title + 32 ({bound(MAX_TOKENS)})"})
    temperature: float = field(default=TEMPERATURE, metadata={"help": "sampling temperature (0: greedy)"})
    exclude_history: bool = field(default=False, metadata={"help": "drop generated items already in H_u"})
    unmatched: str = field(default=UNMATCHED_POLICIES[0], metadata={
        "help": "unmatched titles in SliceShift: count as 0 or skip", "choices": list(UNMATCHED_POLICIES)})
    llm_cache: str | None = field(default=None, metadata={
        "help": "response-cache file for the LLMs (sqlite); does not change results"})

    def __post_init__(self):
        if isinstance(self.llms, str):
            object.__setattr__(self, "llms", (self.llms,))
        object.__setattr__(self, "llms", tuple(self.llms))
        object.__setattr__(self, "scenarios", tuple(self.scenarios))
        if not self.llms or any(not isinstance(s, str) or not s.strip() for s in self.llms):
            raise ConfigError(f"llms needs at least one non-empty model spec, got {self.llms!r}")
        check_choices("llms", self.llms, self.llms)  # no spec twice
        for spec in self.llms:
            if is_dial(spec):  # the reference generator: checked in full by make_list_generator
                from ctrlsim.recommenders.dial import parse_dial_spec

                if parse_dial_spec(spec).kind != "dial":
                    raise ConfigError(f"llms: {spec!r}: PromptShift's reference generator is dial:<lambda>")
                continue
            runtime, target = parse_spec(spec.strip())
            if not target.strip():
                raise ConfigError(f"llms: spec {spec!r} names the runtime {runtime!r} but no model")
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise ConfigError(f"dataset must be a name or path, got {self.dataset!r}")
        check_choices("scenarios", self.scenarios, SCENARIOS)
        for name, high in (("users", MAX_USERS), ("n_candidates", MAX_SLATE), ("k", MAX_SLATE),
                           ("history_len", MAX_ITEMS), ("min_fit_positives", MAX_ITEMS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
            check_range(name, value, low=1, high=high)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        check_range("seed", self.seed, low=0, high=MAX_SEED)
        if self.k > self.n_candidates:
            raise ConfigError(f"k ({self.k}) must not exceed n_candidates ({self.n_candidates})")
        if self.min_fit_positives < self.history_len:
            raise ConfigError(f"min_fit_positives ({self.min_fit_positives}) must be >= history_len "
                              f"({self.history_len}) so every prompt holds the full history")
        if self.positive_threshold is not None:
            check_range("positive_threshold", self.positive_threshold)
        if self.domain is not None:
            check_choice("domain", self.domain, DOMAINS)
        if not 0 < self.p < 1:
            raise ConfigError(f"p must be in (0, 1), got {self.p!r}")
        check_range("rho", self.rho, low=0)
        if self.match_threshold is not None:
            check_range("match_threshold", self.match_threshold, low=0, high=100)
        if self.max_tokens is not None:
            check_range("max_tokens", self.max_tokens, low=1, high=MAX_TOKENS)
        check_range("temperature", self.temperature, low=0)
        check_choice("unmatched", self.unmatched, UNMATCHED_POLICIES)

    def identity(self) -> dict:
        """What the results depend on (the response cache does not change them)."""
        d = config_to_dict(self)
        d.pop("llm_cache")
        return d


# ------------------------------------------------------------------ choices
def build_data(cfg: PromptShiftConfig) -> PromptShiftData:
    """The dataset's PromptShift preparation (cached per process: the driver and local units share it)."""
    key = "promptshift-data:" + json.dumps([cfg.dataset, cfg.scenarios, cfg.positive_threshold,
                                            cfg.history_len, cfg.min_fit_positives])

    def factory() -> PromptShiftData:
        dataset = load_dataset(cfg.dataset)
        threshold = AUTO if cfg.positive_threshold is None else cfg.positive_threshold
        return PromptShiftData.build(dataset, scenarios=cfg.scenarios, positive_threshold=threshold,
                                     history_len=cfg.history_len, min_fit_positives=cfg.min_fit_positives)
    return worker_cache(key, factory)


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
def _engine(cfg: PromptShiftConfig, data: PromptShiftData, llm: str | LLM, users=None) -> PromptShiftEngine:
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


def generate_user_lists(cfg: PromptShiftConfig, key: str) -> dict:
    """Unit of work "<llm>/<user>": the user's L^0, P1-P3 and one cued list per scenario."""
    llm_spec, _, user = key.rpartition("/")
    data = build_data(cfg)
    if is_dial(llm_spec):
        engine = _engine(cfg, data, llm_spec, users=[user])
        identity = engine.config["generator"]
    else:
        llm = cached_llm(llm_spec, cfg.llm_cache)
        engine, identity = _engine(cfg, data, llm, users=[user]), llm.identity
    lists, usage = engine.lists_for(user, engine.user_conditions(user))
    return {"user": user, "llm": identity, "lists": [c.generated.to_dict() for c in lists],
            "tokens": usage}


def _generated(d: Mapping) -> GeneratedList:
    return GeneratedList(d["condition"], list(d["titles"]), d["text"], d["prompt_tokens"],
                         d["completion_tokens"], d.get("raw_count", 0), d.get("error"))


# ----------------------------------------------------------------------- the runner
def _check(ctx: RunContext) -> None:
    """The dataset's preparation and the user sample: no model is loaded."""
    data = build_data(ctx.config)  # loads the dataset only
    ctx.state.update(data=data, users=sample_users(data, ctx.config.users, ctx.config.seed),
                     choices=protocol_choices(ctx.config, data))
    from ctrlsim.backends.bundled import check_cache_writable
    from ctrlsim.backends.spec_check import llm_cache_uses

    given = ctx.resources.get("llms", {})  # loaded LLMs (tests, benchmarks) load nothing
    check_cache_writable({part: what for spec in ctx.config.llms if spec not in given
                          for part, what in llm_cache_uses(spec).items()})


def _identity(ctx: RunContext) -> dict:
    # The records are generated lists, so the folder's identity is what generation depends on; the
    # other choices only shape the tables, which are always recomputed from the lists.
    generation = {key: ctx.state["choices"][key] for key in GENERATION_CHOICES}
    return {"config": ctx.config.identity(), "users": ctx.state["users"], "generation": generation}


def _from_identity(identity: Mapping) -> PromptShiftConfig:
    from ctrlsim.experiments.config import config_from_dict

    return config_from_dict(PromptShiftConfig, identity.get("config", identity))


def _prepare(ctx: RunContext) -> None:
    assert ctx.folder is not None
    ctx.folder.write_json("config.json", {
        "runner": "promptshift", "config": ctx.folder.config, "choices": ctx.state["choices"],
        "provenance": ctx.folder.provenance, "software": software_versions()})
    for name, obj in ctx.resources.get("llms", {}).items():
        provide_llm(name, ctx.config.llm_cache, obj)


def _plan(ctx: RunContext, finished) -> list[str]:
    return [f"{name}/{u}" for name in ctx.config.llms for u in ctx.state["users"]]


def _summary(ctx: RunContext, records: Mapping[str, dict]) -> dict:
    """The tables' numbers, computed once per set of records (the report and the figures share it)."""
    cached = ctx.state.get("summary")
    if cached is not None and cached[0] == sorted(records):
        return cached[1]
    if "data" not in ctx.state:
        _check(ctx)
    users = ctx.state["users"]
    result = report(ctx.config, ctx.state["data"], users, records, ctx.state["choices"])
    expected = {f"{name}/{u}" for name in ctx.config.llms for u in users}
    assert ctx.folder is not None
    result.update(complete=expected <= set(records), out=str(ctx.folder.path))
    ctx.state["summary"] = (sorted(records), result)
    return result


def _report(ctx: RunContext, records: Mapping[str, dict]) -> str:
    result = _summary(ctx, records)
    assert ctx.folder is not None
    ctx.folder.write_json("summary.json", result)
    return format_tables(result)


def _figures(ctx: RunContext, records: Mapping[str, dict]) -> None:
    assert ctx.folder is not None
    for name, fig in figures(_summary(ctx, records)).items():
        ctx.folder.save_figure(fig, name)


RUNNER = Runner(name="promptshift", config_cls=PromptShiftConfig, description=__doc__.split("\n\n")[0],
                unit_fn=generate_user_lists, plan=_plan, report=_report, figures=_figures, check=_check,
                prepare=_prepare, identity=_identity, from_identity=_from_identity,
                extensible=("config.llms",), llm_fields=("llms",), dial_fields=("llms",),
                record_fields=("user", "lists"),
                default_out="results/promptshift",
                unit_name="users")


def run(config: PromptShiftConfig, options: RunOptions | None = None, *,
        llms: Mapping[str, LLM] | None = None, stop_after_users: int | None = None,
        show_progress: bool = True) -> dict:
    """Run (or resume) the PromptShift tables into `options.out`; returns the summary `format_tables` prints.

    `llms` supplies ready LLM objects by spec (tests share one model);
    `stop_after_users` ends the generation after that many new units, as an
    interruption would.
    """
    from ctrlsim.experiments.driver import drive

    resources: dict = {"llms": dict(llms or {}), **dict(llms or {})}
    result = drive(RUNNER, config, options, show_progress=show_progress, resources=resources,
                   max_units=stop_after_users)
    assert result.context is not None
    summary = dict(_summary(result.context, result.records_by_key))
    summary.update(complete=summary["complete"] and not result.failed, failed=result.failed)
    return summary


def report(cfg: PromptShiftConfig, data: PromptShiftData, users: Sequence[str], records: Mapping[str, dict],
           choices: dict) -> dict:
    """Selection on validation, then test metrics, for every LLM with stored lists."""
    settings = []
    for name in cfg.llms:
        done = [u for u in users if f"{name}/{u}" in records]
        if not done:
            continue
        engine = _engine(cfg, data, name, users=done)
        tokens = {"prompt_tokens": 0, "completion_tokens": 0}
        for u in done:
            for d in records[f"{name}/{u}"]["lists"]:
                engine.preload(u, _generated(d))
                tokens["prompt_tokens"] += d["prompt_tokens"] or 0  # null: not reported (unknown)
                tokens["completion_tokens"] += d["completion_tokens"] or 0
                if d["prompt_tokens"] is None or d["completion_tokens"] is None:
                    tokens["unknown_lists"] = tokens.get("unknown_lists", 0) + 1
        test, selection = validate_then_test(engine, done, match_threshold=cfg.match_threshold,
                                             select_b3=cfg.select_on_validation)
        identity = records[f"{name}/{done[0]}"].get("llm", {"spec": name})
        settings.append(summarise(data.dataset.name, name, identity, test, cfg.k, cfg.scenarios, selection,
                                  tokens))
    return {"config": config_to_dict(cfg), "users": list(users), "choices": choices, "settings": settings,
            "table6": macro_table(settings, cfg.k), "records": len(records)}


# ----------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    from ctrlsim.experiments.commands import runner_main

    return runner_main("promptshift", argv)


__all__ = ["PromptShiftConfig", "build_data", "generate_user_lists", "main", "protocol_choices",
           "report", "run"]

if __name__ == "__main__":
    sys.exit(main())
