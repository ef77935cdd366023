"""SteerEval tables 1-8 on a dataset with a bundled LLM, resumable, into one run folder.

`ctrlsim.run("steereval", config=config, options=options)` is the public entry: every
(condition, user, tag, direction) is one `SteerEvalEnv` episode whose figures are appended to the run
folder's `records.jsonl` as soon as they exist; a rerun with the same config skips
what is done (the LLM's response cache makes a half-finished unit cheap to redo).
`tables.md` and `figures/*.png` are rewritten from the records at the end.
Each record key is one executor unit (`run_steereval_unit`) whatever the executor: a unit
gets its scenario with its key (a `SteerEvalEpisode` spec) and reads the run's LLM response caches. The
protocol itself (scenarios, conditions, the engine) is `ctrlsim.recommenders.steereval`.
Conditions (the paper's tables in brackets):

  default       LLM scoring, paragraph profile, template append     (all tables)
  embedding     embedding ranker, paragraph profile, template append (Table 1)
  sentence      LLM scoring, sentence profile, template append      (Table 2)
  llm-append    LLM scoring, paragraph profile, LLM-written append  (Table 3)
  llm-rewrite   LLM scoring, paragraph profile, LLM rewrite         (Table 3)
  stronger      default with the "*only*"/"*no*" templates          (Table 4)
  weaker        default with the "*more*"/"*less*" templates        (Table 4)
  oracle        default with tag relevance stated in item texts     (Table 7)
  tags-visible  default with every item's tags in its text (not in the paper:
                shows how much a tag leak inflates ΔAUC_t; never a default)

Tables 5 and 6 split `default` by tag kind (trigger tags exist only when a vote table
is attached) and by tag; Table 8 samples `table8_samples` default scenarios per cell.
Significance: one-tailed paired t-test of AUC_t after vs before (greater for increase,
less for decrease), alpha 0.05, as in the paper; "undefined" when every difference is
identical. Every choice the paper leaves open is listed by `open_choices` and printed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM, SMALLEST_LLM
from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.config import (
    MAX_ITEMS,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_SLATE,
    MAX_USERS,
    check_fields,
    check_range,
    option,
)
from ctrlsim.recommenders.steereval import CONDITIONS, PAPER_CONDITIONS

DEFAULT_OUT = "results/steereval"
# Fields every finished record has (a stored record without one is damaged and its unit reruns).
RECORD_FIELDS = ("condition", "tag", "direction", "user", "reward")
RATINGS = ("digits", "generate")


@dataclass(frozen=True)
class SteerEvalConfig:
    """What identifies a SteerEval run (stored in config.json; a change starts a new run)."""

    llm: str = option(DEFAULT_PROBE_LLM, "LLM for profiles, LLM edits and scoring")
    encoder: str = option("minilm", "text encoder of the embedding ranker")
    dataset: str = option("ml-100k", "dataset name or path")
    descriptions: str | None = option(None, "item description table (csv/tsv: item id + "
                                      "description/overview), e.g. TMDb overviews")
    links: str | None = option(None, "MovieLens links.csv mapping tmdbId to movieId for "
                               "--descriptions/--trigger-votes")
    trigger_votes: str | None = option(None, "DoesTheDogDie-style vote table (item id or tmdbId, tag/topic, "
                                       "yes, no)")
    vote_threshold: float = option(0.75, "a trigger applies above this yes-vote share", low=0.0,
                                   high=0.999999)
    drop_undescribed: bool = option(True, "with --descriptions, use only items that have one (as the paper "
                                    "does)")
    rename_triggers: bool = option(True, "turn trigger questions into clauses for the templates ('Does the "
                                   "dog die?' -> 'the dog dies')")
    tags: tuple[str, ...] = option((), "tags to steer (comma-separated); empty: every tag of the dataset")
    users: int = option(10, "users per tag (the paper: 10)", low=1, high=MAX_USERS)
    pool_size: int = option(100, "items ranked per scenario, half tag-relevant (even)", low=2, high=MAX_ITEMS)
    history_len: int = option(50, "rated items the profile is written from", low=1, high=MAX_ITEMS)
    min_ratings: int = option(100, "users need at least this many ratings (more than --history-len)",
                              low=2, high=MAX_ITEMS)
    conditions: tuple[str, ...] = option(PAPER_CONDITIONS, "conditions to run", choices=CONDITIONS,
                                         nonempty=True)
    rating: str = option("digits", "LLM score: expected digit from token probabilities, or the paper's "
                         "generate-and-parse", choices=RATINGS)
    k: int = option(10, "cut-off of Coverage@k and NDCG@k", low=1, high=MAX_SLATE)
    table8_samples: int = option(100, "scenarios sampled per Table 8 cell", low=1, high=MAX_SAMPLES)
    max_refusal_share: float = option(0.25, "Trigger filter: drop tags whose LLM-written edits are "
                                      "refusals/misreadings more often than this", low=0.0, high=1.0)
    seed: int = option(0, "seeds user sampling, tie order and Table 8 sampling", low=0, high=MAX_SEED)

    def __post_init__(self):
        if not isinstance(self.pool_size, int) or self.pool_size < 2 or self.pool_size % 2:
            raise ConfigError(f"pool_size must be an even number >= 2, got {self.pool_size!r}")
        check_fields(self)
        check_range("min_ratings", self.min_ratings, low=self.history_len + 1)
        if len(set(self.tags)) != len(self.tags):
            raise ConfigError(f"tags: a tag is given more than once in {list(self.tags)}")
        if self.links and not (self.descriptions or self.trigger_votes):
            raise ConfigError("links needs --descriptions or --trigger-votes to map")
        for name in ("descriptions", "links", "trigger_votes"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise DataFileError(path, f"--{name.replace('_', '-')} file does not exist")


def open_choices(config: SteerEvalConfig) -> dict[str, str]:
    """Every choice the paper leaves open, as this run makes it (printed and stored with the run)."""
    with_desc = config.descriptions is not None
    return {
        "item text": "title (year)" + (" + attached description" if with_desc else
                                        " only: no description table attached") + "; tags never shown "
                     "except in the tags-visible condition",
        "items without description": ("dropped" if config.drop_undescribed else "kept") if with_desc
        else "n/a (no description table)",
        "popularity": "number of users who rated the item (stands in for TMDb popularity)",
        "LLM score": "expected value of the digit after 'SCORE: ' (token probabilities)"
                     if config.rating == "digits" else "generate and parse the first number (the paper)",
        "missing score": "0 (the lowest), as the paper says",
        "ties": f"random order seeded by (seed={config.seed}, user, tag), same for both profiles",
        "system message": "the release's 'Write a response that appropriately completes...' on profile "
                          "and score prompts; none on edit prompts (the paper prints none)",
        "templates": "§4.1 wording where appendix B differs; genre-increase rewrite request mirrors the "
                     "genre-decrease template",
        "LLM append": "one sentence per (tag, direction), reused for all users; first sentence kept",
        "trigger tag names": "questions turned into clauses" if config.rename_triggers else "as given",
        "Trigger filter": f"tags with > {config.max_refusal_share:.0%} refusal/misreading flags in "
                          "LLM-written "
                          "edits (either direction) are dropped from 'Trigger (kept)'",
        "users": f"{config.users} per tag, sampled with seed {config.seed} among users with "
                 f">= {config.min_ratings} ratings whose pool quotas can be met",
        "Table 8": f"up to {config.table8_samples} default scenarios sampled per cell",
        "profiles": "greedy decoding, up to 256 tokens; ASCII-normalised before ranking",
    }


# `--preset smoke`: the smallest real run of this runner (the smallest bundled LLM, a handful of
# units): what the runner contract test and a first try use.
SMOKE_PRESET: dict = {"users": 1, "tags": ("Horror",), "pool_size": 2, "history_len": 3, "min_ratings": 4,
         "conditions": ("default",), "table8_samples": 1, "llm": SMALLEST_LLM}
PRESETS = {"smoke": SMOKE_PRESET}
