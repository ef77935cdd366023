"""SteerEval tables 1-8 on a dataset with a bundled LLM, resumable, into one run folder.

`run_steereval(config, options)` is the public entry: every (condition, user, tag,
direction) is one `SteerEvalEnv` episode whose figures are appended to the run
folder's `records.jsonl` as soon as they exist; a rerun with the same config skips
what is done (the LLM's response cache makes a half-finished unit cheap to redo).
`tables.md` and `figures/*.png` are rewritten from the records at the end.
Each record key is one executor unit (`run_steereval_unit`) whatever the executor: a unit
rebuilds its scenario from the config and reads the run folder's LLM response cache. The
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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.config import (
    MAX_ITEMS,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_SLATE,
    MAX_USERS,
    RunOptions,
    bound,
    check_choice,
    check_choices,
    check_range,
    config_to_dict,
)
from ctrlsim.experiments.runner import RunContext, Runner
from ctrlsim.experiments.steereval_report import (  # noqa: F401 - the tables' public names live here too
    format_tables,
    kept_trigger_tags,
    per_tag_summary,
    table6,
    table8,
    token_totals,
    write_figures,
)
from ctrlsim.experiments.steereval_units import (  # noqa: F401 - re-exported: the protocol's public names
    CONDITIONS,
    LLM_WRITTEN,
    PAPER_CONDITIONS,
    Condition,
    SteerEvalUnit,
    make_env,
    measure_unit,
    planned_scenarios,
    prepare_dataset,
    record_key,
    run_steereval_unit,
    scenarios_for,
)


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


DEFAULT_OUT = "results/steereval"


@dataclass(frozen=True)
class SteerEvalConfig:
    """What identifies a SteerEval run (stored in config.json; a change starts a new run)."""

    llm: str = field(default="qwen2.5-0.5b", metadata=_help("LLM for profiles, LLM edits and scoring"))
    encoder: str = field(default="minilm", metadata=_help("text encoder of the embedding ranker"))
    dataset: str = field(default="ml-100k", metadata=_help("dataset name or path"))
    descriptions: str | None = field(default=None, metadata=_help(
        "item description table (csv/tsv: item id + description/overview), e.g. TMDb overviews"))
    links: str | None = field(default=None, metadata=_help(
        "MovieLens links.csv mapping tmdbId to movieId for --descriptions/--trigger-votes"))
    trigger_votes: str | None = field(default=None, metadata=_help(
        "DoesTheDogDie-style vote table (item id or tmdbId, tag/topic, yes, no)"))
    vote_threshold: float = field(default=0.75, metadata=_help("a trigger applies above this yes-vote share"))
    drop_undescribed: bool = field(default=True, metadata=_help(
        "with --descriptions, use only items that have one (as the paper does)"))
    rename_triggers: bool = field(default=True, metadata=_help(
        "turn trigger questions into clauses for the templates ('Does the dog die?' -> 'the dog dies')"))
    tags: tuple[str, ...] = field(default=(), metadata=_help(
        "tags to steer (comma-separated); empty: every tag of the dataset"))
    users: int = field(default=10, metadata=_help(f"users per tag (the paper: 10; {bound(MAX_USERS)})"))
    pool_size: int = field(default=100, metadata=_help(
        f"items ranked per scenario, half tag-relevant ({bound(MAX_ITEMS)})"))
    history_len: int = field(default=50, metadata=_help(
        f"rated items the profile is written from ({bound(MAX_ITEMS)})"))
    min_ratings: int = field(default=100, metadata=_help(
        f"users need at least this many ratings ({bound(MAX_ITEMS)})"))
    conditions: tuple[str, ...] = field(default=PAPER_CONDITIONS, metadata=_help(
        "conditions to run", choices=list(CONDITIONS)))
    rating: str = field(default="digits", metadata=_help(
        "LLM score: expected digit from token probabilities, or the paper's generate-and-parse",
        choices=["digits", "generate"]))
    k: int = field(default=10, metadata=_help(f"cut-off of Coverage@k and NDCG@k ({bound(MAX_SLATE)})"))
    table8_samples: int = field(default=100, metadata=_help(
        f"scenarios sampled per Table 8 cell ({bound(MAX_SAMPLES)})"))
    max_refusal_share: float = field(default=0.25, metadata=_help(
        "Trigger filter: drop tags whose LLM-written edits are refusals/misreadings more often than this"))
    seed: int = field(default=0, metadata=_help(
        f"seeds user sampling, tie order and Table 8 sampling ({bound(MAX_SEED)})"))

    def __post_init__(self):
        for name, high in (("users", MAX_USERS), ("history_len", MAX_ITEMS), ("k", MAX_SLATE),
                           ("table8_samples", MAX_SAMPLES)):
            check_range(name, getattr(self, name), low=1, high=high)
        check_range("seed", self.seed, low=0, high=MAX_SEED)
        if not isinstance(self.pool_size, int) or self.pool_size < 2 or self.pool_size % 2:
            raise ConfigError(f"pool_size must be an even number >= 2, got {self.pool_size!r}")
        check_range("pool_size", self.pool_size, low=2, high=MAX_ITEMS)
        check_range("min_ratings", self.min_ratings, low=self.history_len + 1, high=MAX_ITEMS)
        check_range("vote_threshold", self.vote_threshold, low=0.0, high=0.999999)
        check_range("max_refusal_share", self.max_refusal_share, low=0.0, high=1.0)
        check_choices("conditions", self.conditions, CONDITIONS)
        check_choice("rating", self.rating, ("digits", "generate"))
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


# ----------------------------------------------------------------------------- the runner

def _check(ctx: RunContext) -> None:
    """Dataset, tags and scenarios, before any model loads (the scenarios need no model)."""
    config = ctx.config
    data, scenarios, short = planned_scenarios(config)
    if not scenarios:
        raise ConfigError(f"no feasible scenario: no user meets the pool quotas at "
                          f"pool_size={config.pool_size} for tags {data[1]}")
    ctx.state.update(scenarios=scenarios, short=short, choices=open_choices(config))
    if ctx.resources.get("llm") is None:  # replies live in the run folder; a bundled LLM in $CTRLSIM_CACHE
        from ctrlsim.backends.bundled import check_cache_writable
        from ctrlsim.backends.spec_check import llm_cache_uses

        check_cache_writable(llm_cache_uses(config.llm))


def _prepare(ctx: RunContext) -> None:
    assert ctx.folder is not None
    choices = ctx.state["choices"]
    ctx.folder.write_json("choices.json", choices)
    if ctx.show_progress:
        print("SteerEval choices the paper leaves open:")
        for key, value in choices.items():
            print(f"  {key}: {value}")
    llm = ctx.resources.get("llm")
    if llm is not None:  # a loaded LLM (benchmarks, tests) serves the units of this process
        from ctrlsim.experiments.units import provide_llm

        provide_llm(ctx.config.llm, _cache_path(ctx), llm)


def _cache_path(ctx: RunContext) -> str:
    assert ctx.folder is not None
    return str(ctx.folder.file("llm-cache.sqlite").resolve())


def _plan(ctx: RunContext, finished) -> list[str]:
    return [record_key(cond, sc) for sc in ctx.state["scenarios"] for cond in ctx.config.conditions]


def _payload(ctx: RunContext) -> SteerEvalUnit:
    return SteerEvalUnit(ctx.config, _cache_path(ctx))


def _result(ctx: RunContext, records) -> dict[str, Any]:
    rows = list(records.values())
    return {"config": config_to_dict(ctx.config), "choices": ctx.state.get("choices", {}),
            "short_tags": ctx.state.get("short", {}), "llm": rows[0]["llm"] if rows else ctx.config.llm,
            "records": rows, "tokens": token_totals(rows)}


def _report(ctx: RunContext, records) -> str:
    """The tables. Those of a finished run are made once per (result, config, code) and read back by
    a rerun with the same records; the partial tables written while units run are not kept."""
    from ctrlsim.experiments.output_cache import cached_text

    result = _result(ctx, records)
    if not set(_plan(ctx, records)) <= set(records):
        return format_tables(result, ctx.config)
    return cached_text("steereval-tables", {"result": result, "config": config_to_dict(ctx.config)},
                       lambda: format_tables(result, ctx.config))


def _figures(ctx: RunContext, records) -> None:
    """The figures; drawn once per (records, code): a rerun with the same records reads them back."""
    from ctrlsim.experiments.output_cache import cached_figures

    rows = list(records.values())
    cached_figures(ctx.folder, "steereval-figures", rows, lambda target: write_figures(target, rows))


RUNNER = Runner(name="steereval", config_cls=SteerEvalConfig, description=__doc__,
                unit_fn=run_steereval_unit, plan=_plan, report=_report, figures=_figures, check=_check,
                prepare=_prepare, payload=_payload, extensible=("conditions",), llm_fields=("llm",),
                encoder_fields=("encoder",), default_out=DEFAULT_OUT, unit_name="episodes",
                record_fields=("condition", "tag", "direction", "user", "reward"))


def run_steereval(config: SteerEvalConfig, options: RunOptions | None = None, *, llm=None,
                  show_progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the SteerEval tables for `config`; returns the result dict.

    The result: config, open choices, the LLM's identity, tags short of users, all records
    (one per condition/user/tag/direction), token totals summed from the records, the markdown
    tables and the failed units. `llm` may be a loaded LLM (benchmarks pass one; local executor
    only); otherwise each process loads `config.llm` once, after every check has passed.
    """
    from ctrlsim.experiments.driver import drive

    options = options or RunOptions()
    if llm is not None and options.executor != "local":
        raise ConfigError(f"a loaded llm can only be used with --executor local, got {options.executor!r}: "
                          "ray workers load config.llm themselves")
    resources = {"llm": llm, config.llm: llm} if llm is not None else {}
    result = drive(RUNNER, config, options, show_progress=show_progress, resources=resources)
    assert result.context is not None
    summary = _result(result.context, result.records_by_key)
    summary.update(tables=result.markdown, failed=result.failed)
    return summary


def main(argv: list[str] | None = None) -> int:
    from ctrlsim.experiments.commands import runner_main

    return runner_main("steereval", argv)


def tables_from_folder(out: str | Path) -> str:
    """The tables of a run folder's records so far (read-only: works while a run is still writing)."""
    from ctrlsim.experiments.store import read_run_records

    stored, records = read_run_records(Path(out) / "records.jsonl", RUNNER.record_fields)
    config = RUNNER.config_from_identity(stored)
    rows = list(records.values())
    result = {"records": rows, "llm": rows[0]["llm"] if rows else config.llm, "short_tags": {},
              "tokens": token_totals(rows)}
    return format_tables(result, config)


