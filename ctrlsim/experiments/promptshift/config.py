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

from dataclasses import dataclass

from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM, SMALLEST_LLM
from ctrlsim.backends.specs import parse_spec
from ctrlsim.data.splits import SCENARIOS
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    MAX_ITEMS,
    MAX_SEED,
    MAX_SLATE,
    MAX_TOKENS,
    MAX_USERS,
    check_choices,
    check_fields,
    check_range,
    config_to_dict,
    option,
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

    llms: tuple[str, ...] = option((DEFAULT_RUN_LLM,), "LLM specs, comma-separated")
    dataset: str = option("ml-100k", "dataset name or path (e.g. a Last.fm-1K folder)")
    users: int = option(8, "users to sample (the paper: up to 600)", low=1, high=MAX_USERS)
    seed: int = option(0, "seed of the stratified user sample", low=0, high=MAX_SEED)
    scenarios: tuple[str, ...] = option(SCENARIOS, "identity-cue scenarios", choices=SCENARIOS, nonempty=True)
    n_candidates: int = option(N_CANDIDATES, "N, titles asked of the LLM per list", low=1, high=MAX_SLATE)
    k: int = option(K, "K, the evaluated list length (no more than N)", low=1, high=MAX_SLATE)
    history_len: int = option(HISTORY_LEN, "|H_u|, fit positives in the prompt", low=1, high=MAX_ITEMS)
    min_fit_positives: int = option(MIN_FIT_POSITIVES, "fit positives a user needs (at least |H_u|)", low=1,
                                    high=MAX_ITEMS)
    positive_threshold: float | None = option(
        None, f"rating (or play count) a positive needs; none: {MOVIE_POSITIVE:g} for ratings, "
        f"{PLAY_POSITIVE:g} plays for listening data")
    domain: str | None = option(None, "prompts; none: music for track catalogues", choices=DOMAINS)
    p: float = option(RBO_P, "RBO persistence, in (0, 1)")
    rho: float = option(RHO, "Difficulty@K rank bonus", low=0)
    match_threshold: float | None = option(None, "fuzzy title-matching threshold; none: chosen on "
                                           f"validation from {MATCH_THRESHOLDS}", low=0, high=100)
    select_on_validation: bool = option(True, "choose B3's parameters on validation positives (else the "
                                        "paper's values)")
    max_tokens: int | None = option(None, "reply budget; none: 16 per title + 32", low=1, high=MAX_TOKENS)
    temperature: float = option(TEMPERATURE, "sampling temperature (0: greedy)", low=0)
    exclude_history: bool = option(False, "drop generated items already in H_u")
    unmatched: str = option(UNMATCHED_POLICIES[0], "unmatched titles in SliceShift: count as 0 or skip",
                            choices=UNMATCHED_POLICIES)

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
        check_fields(self)
        if self.k > self.n_candidates:
            raise ConfigError(f"k ({self.k}) must not exceed n_candidates ({self.n_candidates})")
        if self.min_fit_positives < self.history_len:
            raise ConfigError(f"min_fit_positives ({self.min_fit_positives}) must be >= history_len "
                              f"({self.history_len}) so every prompt holds the full history")
        if self.positive_threshold is not None:
            check_range("positive_threshold", self.positive_threshold)
        if not 0 < self.p < 1:
            raise ConfigError(f"p must be in (0, 1), got {self.p!r}")

    def identity(self) -> dict:
        """What the results depend on: every field (the response caches are the run's, not the config's)."""
        return config_to_dict(self)

    def units(self, users) -> list[UserLists]:
        """One unit per (LLM, sampled user), in a stable order."""
        return [UserLists(llm, user) for llm in self.llms for user in users]


@dataclass(frozen=True)
class UserLists:
    """One unit of a PromptShift run: the lists one generator (an LLM spec or `dial:<lambda>`) writes
    for one user. Stored under `key` ("<llm>/<user>"); the spec travels with the key to the unit."""

    llm: str
    user: str

    @property
    def key(self) -> str:
        return f"{self.llm}/{self.user}"


# `--preset smoke`: the smallest real run of this runner (the smallest bundled LLM, a handful of
# units): what the runner contract test and a first try use.
SMOKE_PRESET: dict = {"users": 2, "scenarios": ("gender",), "n_candidates": 3, "k": 2, "history_len": 3,
         "min_fit_positives": 3, "llms": (SMALLEST_LLM,)}
PRESETS = {"smoke": SMOKE_PRESET}
