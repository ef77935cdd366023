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
and `promptshift.report` averages and formats the records. Layouts: Table 4
(Paraphrase Drift, Cue Drift, Delta d, SliceShift per dataset-model), Table 5
(B0 vs B3 per dataset-model), Table 6 (B0-B3 macro means over settings).

    ctrlsim promptshift --llms qwen2.5-0.5b --users 8 --out results/promptshift
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM
from ctrlsim.backends.specs import parse_spec
from ctrlsim.data.splits import SCENARIOS
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    MAX_ITEMS,
    MAX_SEED,
    MAX_SLATE,
    MAX_TOKENS,
    MAX_USERS,
    bound,
    check_choice,
    check_choices,
    check_range,
    config_to_dict,
)
from ctrlsim.recommenders.dial import is_dial
from ctrlsim.recommenders.promptshift.defaults import (
    HISTORY_LEN,
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
)
from ctrlsim.recommenders.promptshift.generation import DOMAINS

DEFAULT_RUN_LLM = DEFAULT_PROBE_LLM
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
