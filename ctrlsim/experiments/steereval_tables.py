"""SteerEval tables 1-8 on a dataset with a bundled LLM, resumable, into one run folder.

`run_steereval(config, options)` is the public entry: every (condition, user, tag,
direction) is one `SteerEvalEnv` episode whose figures are appended to the run
folder's `records.jsonl` as soon as they exist; a rerun with the same config skips
what is done (the LLM's response cache makes a half-finished unit cheap to redo).
`tables.md` and `figures/*.png` are rewritten from the records at the end.
With `--executor ray` each record key is one executor unit (`run_steereval_unit`): workers
rebuild the scenarios from the config and share the run folder's LLM response cache.
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

import argparse
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.config import (
    RunOptions,
    check_choice,
    check_choices,
    check_range,
    config_from_args,
    config_to_dict,
    runner_parser,
)
from ctrlsim.metrics.stats import format_test
from ctrlsim.metrics.steereval import direction_cell, mean_ci, rejected_tags
from ctrlsim.seeding import derive_rng

DEFAULT_OUT = "results/steereval"


@dataclass(frozen=True)
class Condition:
    ranker: str = "llm"
    profile_style: str = "paragraph"
    intervention: str = "template-append"
    emphasis: str = "default"
    oracle: bool = False
    show_tags: bool = False

    @property
    def env_key(self) -> tuple:
        return self.ranker, self.profile_style, self.oracle, self.show_tags


CONDITIONS = {
    "default": Condition(),
    "embedding": Condition(ranker="embedding"),
    "sentence": Condition(profile_style="sentence"),
    "llm-append": Condition(intervention="llm-append"),
    "llm-rewrite": Condition(intervention="llm-rewrite"),
    "stronger": Condition(emphasis="stronger"),
    "weaker": Condition(emphasis="weaker"),
    "oracle": Condition(oracle=True),
    "tags-visible": Condition(show_tags=True),
}
PAPER_CONDITIONS = tuple(c for c in CONDITIONS if c != "tags-visible")
LLM_WRITTEN = ("llm-append", "llm-rewrite")  # the edits whose refusals drive the Trigger(75) filter

# The paper's numbers (Llama-3.1-8B, ML-25M + TMDb, 94 tags x 10 users), shown beside ours.
PAPER: dict[str, dict[Any, tuple[float, float]]] = {
    "Table 1": {"LLM scoring": (0.0476, -0.0266), "Embedding": (0.0636, 0.0473)},
    "Table 2": {"Paragraph-length": (0.0476, -0.0266), "Sentence-length": (0.0647, -0.0231)},
    "Table 3": {"Template append": (0.0476, -0.0266), "LLM append": (0.0417, -0.0198),
                "LLM rewrite": (0.0589, -0.0379)},
    "Table 4": {"Stronger": (0.0569, -0.0330), "Weaker": (0.0471, -0.0224)},
    "Table 5": {"Genre": (0.1095, -0.0654), "Trigger (kept)": (0.0320, -0.0168),
                "Trigger (all)": (0.0297, -0.0169)},
    "Table 7": {"Genre-Oracle": (0.1660, -0.1504), "Genre": (0.1095, -0.0654),
                "Trigger-Oracle": (0.1211, -0.1721), "Trigger": (0.0320, -0.0168),
                "All-Oracle": (0.1302, -0.1677), "All": (0.0476, -0.0266)},
    "Table 8": {("increase", True): (21.09, 3.38), ("increase", False): (19.37, -0.98),
                ("decrease", True): (20.47, -0.58), ("decrease", False): (19.15, 0.05)},
}


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


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
    users: int = field(default=10, metadata=_help("users per tag (the paper: 10)"))
    pool_size: int = field(default=100, metadata=_help("items ranked per scenario, half tag-relevant"))
    history_len: int = field(default=50, metadata=_help("rated items the profile is written from"))
    min_ratings: int = field(default=100, metadata=_help("users need at least this many ratings"))
    conditions: tuple[str, ...] = field(default=PAPER_CONDITIONS, metadata=_help(
        "conditions to run", choices=list(CONDITIONS)))
    rating: str = field(default="digits", metadata=_help(
        "LLM score: expected digit from token probabilities, or the paper's generate-and-parse",
        choices=["digits", "generate"]))
    k: int = field(default=10, metadata=_help("cut-off of Coverage@k and NDCG@k"))
    table8_samples: int = field(default=100, metadata=_help("scenarios sampled per Table 8 cell"))
    max_refusal_share: float = field(default=0.25, metadata=_help(
        "Trigger filter: drop tags whose LLM-written edits are refusals/misreadings more often than this"))
    seed: int = field(default=0, metadata=_help("seeds user sampling, tie order and Table 8 sampling"))

    def __post_init__(self):
        for name in ("users", "history_len", "k", "table8_samples"):
            check_range(name, getattr(self, name), low=1)
        check_range("seed", self.seed, low=0)
        if not isinstance(self.pool_size, int) or self.pool_size < 2 or self.pool_size % 2:
            raise ConfigError(f"pool_size must be an even number >= 2, got {self.pool_size!r}")
        check_range("min_ratings", self.min_ratings, low=self.history_len + 1)
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


# ----------------------------------------------------------------------------- preparation

def prepare_dataset(config: SteerEvalConfig):
    """The dataset with the config's side tables, the tags to steer, their template phrases and the
    items scenarios may use. Cheap (no model): every value is checked before any model loads."""
    from ctrlsim.agents.steering import trigger_phrase
    from ctrlsim.data import attach_descriptions, attach_tag_votes, load_dataset
    from ctrlsim.envs.steereval_env import NON_TAGS

    ds = load_dataset(config.dataset)
    if config.descriptions:
        ds = attach_descriptions(ds, config.descriptions, links=config.links)
    if config.trigger_votes:
        ds = attach_tag_votes(ds, config.trigger_votes, threshold=config.vote_threshold, links=config.links)
    tags = list(config.tags) or [t for t in ds.tags if t not in NON_TAGS]
    unknown = [t for t in tags if t not in set(ds.tags)]
    if unknown:
        raise ConfigError(f"tags: unknown tag(s) {', '.join(map(repr, unknown))} for dataset {ds.name!r}; "
                          f"known: {', '.join(ds.tags)}")
    kinds = ds.item_tags.drop_duplicates("tag").set_index("tag")["kind"]
    rename = config.rename_triggers
    phrases = {t: trigger_phrase(t) if rename and kinds.get(t) == "trigger" else t for t in tags}
    items = None
    if config.descriptions and config.drop_undescribed:
        described = ds.items["description"].fillna("").astype(str).str.strip() != ""
        items = frozenset(ds.items.loc[described, "item_id"])
    return ds, tags, phrases, items


def choose_scenarios(env, tags: list[str], config: SteerEvalConfig):
    """Per tag, the first `users` users (seeded order) whose pool quotas can be met; both directions.

    Returned round-robin over tags (each tag's first user, then each tag's second, ...) so
    that an interrupted run has results for every tag.
    """
    from ctrlsim.envs.steereval_env import DIRECTIONS

    order = derive_rng(config.seed, "steereval-users").permutation(len(env.users))
    users = [env.users[i] for i in order]
    per_tag: dict[str, list] = {}
    for tag in tags:
        per_tag[tag] = []
        for user in users:
            if len(per_tag[tag]) == config.users:
                break
            pair = [env.build(user, tag, d) for d in DIRECTIONS]
            if all(sc is not None for sc in pair):
                per_tag[tag].append(pair)
    scenarios = [sc for rank in range(config.users) for tag in tags if rank < len(per_tag[tag])
                 for sc in per_tag[tag][rank]]
    short = {tag: len(pairs) for tag, pairs in per_tag.items() if len(pairs) < config.users}
    return scenarios, short


# ----------------------------------------------------------------------------- the run

def run_steereval(config: SteerEvalConfig, options: RunOptions | None = None, *, llm=None,
                  show_progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the SteerEval tables for `config`; returns the result dict.

    The result: config, open choices, the LLM's identity, tags short of users, all records
    (one per condition/user/tag/direction), token totals summed from the records, and the
    markdown tables. `llm` may be a loaded LLM (benchmarks pass one); otherwise `config.llm`
    is loaded after the dataset, tags and output folder have been checked.
    """
    from ctrlsim.agents.steering import LLMAppend, LLMRewrite, TemplateAppend
    from ctrlsim.backends import load_llm
    from ctrlsim.envs.steereval_env import SteerEvalEnv
    from ctrlsim.experiments.runfolder import RunFolder

    options = options or RunOptions()
    if llm is not None and options.executor != "local":
        raise ConfigError(f"a loaded llm can only be used with --executor local, got {options.executor!r}: "
                          "ray workers load config.llm themselves")
    out = Path(options.out or DEFAULT_OUT)
    ds, tags, phrases, items = prepare_dataset(config)
    choices = open_choices(config)
    if show_progress:
        print("SteerEval choices the paper leaves open:")
        for key, value in choices.items():
            print(f"  {key}: {value}")

    data = (ds, tags, phrases, items)
    probe_env = make_env(config, data, Condition(), config.llm)  # no model loads until a profile is needed
    scenarios, short = choose_scenarios(probe_env, tags, config)
    if not scenarios:
        raise ConfigError(f"no feasible scenario: no user meets the pool quotas at "
                          f"pool_size={config.pool_size}"
                          f" for tags {tags}")
    failed: dict[str, str] = {}
    with RunFolder(out, config_to_dict(config), overwrite=options.overwrite) as folder:
        folder.write_json("choices.json", choices)
        store = folder.store
        units = [(cond, sc) for sc in scenarios for cond in config.conditions]
        owners = shared_work_owners(units)
        todo = [(cond, sc) for cond, sc in units if record_key(cond, sc) not in store]
        if todo and options.executor == "local":
            model = llm if llm is not None else load_llm(config.llm, cache=out / "llm-cache.sqlite")
            identity = model.identity
            envs: dict[tuple, SteerEvalEnv] = {}
            policies = {"llm-append": LLMAppend(model), "llm-rewrite": LLMRewrite(model)}
            bar = tqdm(todo, desc="steereval episodes", disable=not show_progress)
            for cond_name, sc in bar:
                cond = CONDITIONS[cond_name]
                env = envs.get(cond.env_key) or envs.setdefault(cond.env_key,
                                                                make_env(config, data, cond, model))
                policy = policies.get(cond.intervention) or TemplateAppend(cond.emphasis)
                store.add(record_key(cond_name, sc), measure_unit(env, policy, model, cond_name, sc, owners,
                                                                  identity))
                bar.set_postfix(condition=cond_name)
        elif todo:
            from ctrlsim.experiments.executor import executor_from_options, is_failure

            def on_record(key: str, record: dict) -> None:
                if is_failure(record):  # not stored: a rerun retries the unit
                    failed[key] = record["error"]
                    return
                store.add(key, record)

            unit = SteerEvalUnit(config, str((out / "llm-cache.sqlite").resolve()))
            with executor_from_options(options) as executor:
                executor.run(run_steereval_unit, unit, [record_key(c, sc) for c, sc in todo], on_record,
                             progress=show_progress, desc="steereval episodes")
            if failed and show_progress:
                print(f"{len(failed)} unit(s) failed (rerun the same command to retry them): "
                      + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        records = [r for _, r in store.records()]
        result = {"config": config_to_dict(config), "choices": choices, "short_tags": short,
                  "llm": records[0]["llm"] if records else config.llm, "records": records,
                  "tokens": token_totals(records), "failed": failed}
        result["tables"] = format_tables(result, config)
        folder.write_tables(result["tables"])
        if options.figures:
            write_figures(folder, records)
    return result


def make_env(config: SteerEvalConfig, data: tuple, cond: Condition, model):
    """The SteerEval env of one condition over `data` (what `prepare_dataset` returns)."""
    from ctrlsim.envs.steereval_env import SteerEvalEnv

    ds, tags, phrases, items = data
    return SteerEvalEnv(dataset=ds, llm=model, ranker=cond.ranker, encoder=config.encoder,
                        profile_style=cond.profile_style, rating=config.rating, oracle=cond.oracle,
                        show_tags=cond.show_tags, tags=tags, tag_phrases=phrases, items=items,
                        pool_size=config.pool_size, history_len=config.history_len,
                        min_ratings=config.min_ratings, k=config.k, tie_seed=config.seed)


def measure_unit(env, policy, model, cond_name: str, sc, owners: dict[tuple, str], identity) -> dict:
    """Run one (condition, scenario) episode in `env` and return its record.

    Work shared by several units (profile, original ranking, the LLM-append sentence) counts
    towards the first unit that needs it in the full order (`owners`), so the token totals do not
    depend on where an earlier run was interrupted (a resume replays it from cache).
    """
    from ctrlsim.envs.steereval_env import to_observation_text

    cond = CONDITIONS[cond_name]
    key = record_key(cond_name, sc)
    meter = model.meter
    marks = [meter.total]
    env.original_profile(sc)
    marks.append(meter.total)
    env.original_ranking(sc)
    marks.append(meter.total)
    obs, info = env.reset(options={"scenario": sc})
    steered = to_observation_text(policy.act(obs, info))
    marks.append(meter.total)
    _, reward, _, _, figures = env.step(steered)
    marks.append(meter.total)
    shared = [owners[("profile", cond.env_key, sc.user_id)] == key,
              owners[("ranking", cond.env_key, sc.user_id, sc.tag)] == key,
              cond.intervention != "llm-append"
              or owners[("append", sc.tag, sc.direction)] == key, True]
    counted = [(b.prompt_tokens - a.prompt_tokens, b.completion_tokens - a.completion_tokens)
               for a, b, keep in zip(marks, marks[1:], shared) if keep]
    record = {"condition": cond_name, "tag": sc.tag, "tag_kind": sc.tag_kind,
              "direction": sc.direction, "user": sc.user_id, "reward": reward,
              "llm": identity, **figures,
              "tokens": {"prompt": sum(p for p, _ in counted),
                         "completion": sum(c for _, c in counted)}}
    if cond.intervention in LLM_WRITTEN:
        record["original_profile"] = info["original_profile"]
    else:
        record.pop("steered_profile")
    return record


@dataclass(frozen=True)
class SteerEvalUnit:
    """What a ray worker needs besides the unit key: the run's config and the run folder's LLM cache."""

    config: SteerEvalConfig
    llm_cache: str


def _unit_plan(config: SteerEvalConfig) -> tuple[tuple, dict[str, tuple[str, Any]], dict[tuple, str]]:
    """(data, units by record key, shared-work owners), rebuilt on a worker exactly as the driver does."""
    data = prepare_dataset(config)
    scenarios, _ = choose_scenarios(make_env(config, data, Condition(), config.llm), data[1], config)
    units = [(cond, sc) for sc in scenarios for cond in config.conditions]
    return data, {record_key(cond, sc): (cond, sc) for cond, sc in units}, shared_work_owners(units)


def run_steereval_unit(unit: SteerEvalUnit, key: str) -> dict:
    """One SteerEval unit (a record key) -> its record, on any worker (the ray executor's unit).

    A fresh env and policy per unit: shared work memoised by an earlier unit on this worker would
    otherwise cost this unit 0 tokens. Each unit measures all of its shared work (from the response
    cache when another unit already paid for it) and keeps the parts it owns, as the local loop does.
    """
    from ctrlsim.agents.steering import LLMAppend, LLMRewrite, TemplateAppend
    from ctrlsim.backends import load_llm
    from ctrlsim.experiments.executor import worker_cache

    config = unit.config
    data, units, owners = worker_cache(f"steereval-plan:{config!r}", lambda: _unit_plan(config))
    if key not in units:
        raise ConfigError(f"unknown steereval unit {key!r} for this config")
    cond_name, sc = units[key]
    cond = CONDITIONS[cond_name]
    model = worker_cache(f"llm:{config.llm}:{unit.llm_cache}",
                         lambda: load_llm(config.llm, cache=unit.llm_cache))
    policies = {"llm-append": LLMAppend, "llm-rewrite": LLMRewrite}
    policy = policies[cond.intervention](model) if cond.intervention in policies \
        else TemplateAppend(cond.emphasis)
    env = make_env(config, data, cond, model)
    return measure_unit(env, policy, model, cond_name, sc, owners, model.identity)



def tables_from_folder(out: str | Path) -> str:
    """The tables of a run folder's records so far (read-only: works while a run is still writing)."""
    import json

    from ctrlsim.experiments.config import config_from_dict

    folder = Path(out)
    config = config_from_dict(SteerEvalConfig, json.loads((folder / "config.json").read_text())["config"])
    records: dict[str, dict] = {}
    for line in (folder / "records.jsonl").read_text().splitlines()[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line torn by an interruption
            continue
        if isinstance(row, dict) and "key" in row and "record" in row:
            records.setdefault(row["key"], row["record"])
    rows = list(records.values())
    result = {"records": rows, "llm": rows[0]["llm"] if rows else config.llm, "short_tags": {},
              "tokens": token_totals(rows)}
    return format_tables(result, config)


def shared_work_owners(units: list[tuple[str, Any]]) -> dict[tuple, str]:
    """The unit (record key) that pays for each piece of shared work: the first in `units` needing it."""
    owners: dict[tuple, str] = {}
    for cond_name, sc in units:
        cond, key = CONDITIONS[cond_name], record_key(cond_name, sc)
        owners.setdefault(("profile", cond.env_key, sc.user_id), key)
        owners.setdefault(("ranking", cond.env_key, sc.user_id, sc.tag), key)
        if cond.intervention == "llm-append":
            owners.setdefault(("append", sc.tag, sc.direction), key)
    return owners


def record_key(condition: str, sc) -> str:
    return f"{condition}/{sc.user_id}/{sc.tag}/{sc.direction}"


def token_totals(records: list[dict]) -> dict[str, int]:
    """Tokens spent, summed from the stored records (so a resumed run reports the whole run)."""
    prompt = sum(r.get("tokens", {}).get("prompt", 0) for r in records)
    completion = sum(r.get("tokens", {}).get("completion", 0) for r in records)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# ----------------------------------------------------------------------------- tables

def _by(records, **match) -> list[dict]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def _cell(records: list[dict], direction: str) -> str:
    cell = direction_cell(records, direction)
    return "-" if cell is None else f"{format_test(cell.test)} n={cell.n}"


def _paper(table: str, row: str, direction: str) -> str:
    label = re.sub(r" \(\d+\)$", "", row)  # "Genre (19)" -> "Genre"
    values = PAPER.get(table, {}).get(label)
    return "" if values is None else f"{values[0 if direction == 'increase' else 1]:+.4f}"


def _table(title: str, rows: list[tuple[str, list[dict]]], paper_key: str | None = None) -> str:
    from tabulate import tabulate

    body = [[name, _cell(rs, "increase"), _paper(paper_key or "", name, "increase"),
             _cell(rs, "decrease"), _paper(paper_key or "", name, "decrease")] for name, rs in rows]
    head = ["", "Incr. ΔAUC_t (↑)", "paper", "Decr. ΔAUC_t (↓)", "paper"]
    return f"{title}\n\n{tabulate(body, headers=head, tablefmt='github', disable_numparse=True)}\n"


def kept_trigger_tags(records: list[dict], max_share: float) -> tuple[set[str], set[str]] | None:
    """(kept, rejected) trigger tags by the refusal filter, or None when no LLM-written edit ran."""
    written = [r for r in records if r["condition"] in LLM_WRITTEN and r["tag_kind"] == "trigger"]
    triggers = {r["tag"] for r in records if r["tag_kind"] == "trigger"}
    if not triggers or not written:
        return None
    rejected = rejected_tags(written, max_share)
    return triggers - rejected, rejected & triggers


def per_tag_summary(records: list[dict], alpha: float = 0.05) -> dict[str, dict]:
    """Per direction: tag -> (mean ΔAUC_t, steered the right way, significant) over `records`."""
    out: dict[str, dict] = {}
    for direction in ("increase", "decrease"):
        out[direction] = {}
        for tag in sorted({r["tag"] for r in records}):
            cell = direction_cell(_by(records, tag=tag), direction)
            if cell is not None:
                out[direction][tag] = (cell.mean, cell.steered, cell.test.significant(alpha))
    return out


def _tag_list(summary: dict, tags: list[str]) -> str:
    return ", ".join(f"{t} ({summary[t][0]:+.4f})" for t in tags) or "-"


def table6(default: list[dict]) -> str:
    from tabulate import tabulate

    parts = ["Table 6. Mean ΔAUC_t per tag (default condition): most and least steered tags"]
    for kind in sorted({r["tag_kind"] for r in default}):
        summary = per_tag_summary(_by(default, tag_kind=kind))
        rows = []
        for direction, sign in (("increase", 1), ("decrease", -1)):
            tags = summary[direction]
            right = sorted((t for t, v in tags.items() if v[1]), key=lambda t: -sign * tags[t][0])
            rows += [[f"Biggest {direction}", _tag_list(tags, right[:3])],
                     [f"Smallest {direction}", _tag_list(tags, right[::-1][:3])]]
            n_right = sum(v[1] for v in tags.values())
            n_sig = sum(v[1] and v[2] for v in tags.values())
            rows.append([f"Tags steered ({direction})",
                         f"{n_right}/{len(tags)} in the right direction, {n_sig}/{len(tags)} significantly "
                         f"(paper, all tags: {'89/94' if direction == 'increase' else '76/94'} "
                         "right direction)"])
        parts.append(f"\n{kind.capitalize()} tags\n\n" + tabulate(rows, headers=["", "tags (ΔAUC_t)"],
                                                                   tablefmt="github", disable_numparse=True))
    return "\n".join(parts) + "\n"


def table8(default: list[dict], samples: int, seed: int) -> str:
    from tabulate import tabulate

    rows = []
    for direction in ("increase", "decrease"):
        for rel, name in ((True, "Rel."), (False, "Irrel.")):
            cell = [r for r in _by(default, direction=direction) if r["next_item_relevant"] == rel]
            if not cell:
                continue
            rng = derive_rng(seed, "steereval-table8", direction, name)
            chosen = [cell[i] for i in sorted(rng.choice(len(cell), min(samples, len(cell)), replace=False))]
            before = np.mean([r["rank_set_before"] for r in chosen])
            delta = np.mean([r["rank_set_after"] - r["rank_set_before"] for r in chosen])
            paper = PAPER["Table 8"][(direction, rel)]
            rows.append([direction.capitalize(), name, f"{before:.2f}", f"{delta:+.2f}", len(chosen),
                         f"{paper[0]:.2f}", f"{paper[1]:+.2f}"])
    return ("Table 8. Rank_set of the true next item within its relevance subset (lower is better; the "
            "paper's subsets have 50 items, ours pool_size/2)\n\n"
            + tabulate(rows, headers=["Task", "Type", "Original Rank_set", "ΔRank_set", "n", "paper orig.",
                                      "paper Δ"], tablefmt="github", disable_numparse=True) + "\n")


def format_tables(result: dict, config: SteerEvalConfig) -> str:
    recs = result["records"]
    default = _by(recs, condition="default")
    rating = "digit probabilities" if config.rating == "digits" else "generate-and-parse"
    llm = result["llm"]
    if isinstance(llm, dict):
        llm = f"{llm.get('model')} ({llm.get('runtime')}, sha256 {str(llm.get('sha256', ''))[:12]})"
    head = (f"# SteerEval tables\n\nLLM: {llm}; rating: {rating}; encoder: {config.encoder}; "
            f"dataset: {config.dataset}; pool: {config.pool_size}; users per tag: {config.users}; "
            f"tags: {len({r['tag'] for r in recs})}; records: {len(recs)}\n\n"
            "ΔAUC_t cells: mean over scenarios, (*) one-tailed paired t-test significant at 0.05, "
            "'undefined' when every difference is identical; 'paper' = the published value.\n")
    parts = [head,
             _table(f"Table 1. Ranking method (paragraph profile, template append; LLM rating: {rating})",
                    [("LLM scoring", default), ("Embedding", _by(recs, condition="embedding"))], "Table 1"),
             _table("Table 2. Profile generation (LLM scoring, template append)",
                    [("Paragraph-length", default), ("Sentence-length", _by(recs, condition="sentence"))],
                    "Table 2"),
             _table("Table 3. Steering intervention",
                    [("Template append", default), ("LLM append", _by(recs, condition="llm-append")),
                     ("LLM rewrite", _by(recs, condition="llm-rewrite"))], "Table 3"),
             _table("Table 4. Emphasis level", [("Stronger", _by(recs, condition="stronger")),
                                                ("Weaker", _by(recs, condition="weaker"))], "Table 4")]
    kinds = sorted({r["tag_kind"] for r in default})
    rows5: list[tuple[str, list[dict]]] = []
    filtered = kept_trigger_tags(recs, config.max_refusal_share)
    for kind in kinds:
        of_kind = _by(default, tag_kind=kind)
        if kind == "trigger" and filtered is not None:
            kept = [r for r in of_kind if r["tag"] in filtered[0]]
            rows5.append((f"Trigger (kept) ({len(filtered[0])})", kept))
            rows5.append((f"Trigger (all) ({len({r['tag'] for r in of_kind})})", of_kind))
        else:
            rows5.append((f"{kind.capitalize()} ({len({r['tag'] for r in of_kind})})", of_kind))
    table5 = _table("Table 5. Tag source", rows5, "Table 5")
    if filtered is not None:
        table5 += f"\nTrigger filter dropped: {', '.join(sorted(filtered[1])) or 'none'}\n"
    parts += [table5, table6(default)]
    rows7 = []
    for kind in kinds:
        rows7 += [(f"{kind.capitalize()}-Oracle", _by(recs, condition="oracle", tag_kind=kind)),
                  (kind.capitalize(), _by(default, tag_kind=kind))]
    rows7 += [("All-Oracle", _by(recs, condition="oracle")), ("All", default)]
    parts.append(_table("Table 7. Oracle item information", rows7, "Table 7"))
    if _by(recs, condition="tags-visible"):
        parts.append(_table("Tag leak check (not in the paper): item texts listing their tags",
                            [("Tag-free (default)", default),
                             ("Tags visible", _by(recs, condition="tags-visible"))]))
    parts.append(table8(default, config.table8_samples, config.seed))
    problems = sum(1 for r in recs if r.get("edit_problems"))
    parts.append(f"Scenarios with edit problems (refusal/misreading flags): {problems} of {len(recs)}; "
                 f"tags short of users: {result['short_tags'] or 'none'}; tokens: {result['tokens']}\n")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- figures

def write_figures(folder, records: list[dict]) -> None:
    """ΔAUC_t per condition and per tag (default condition), with 95% confidence intervals."""
    from ctrlsim.experiments.runfolder import new_figure

    if not records:
        return
    for name, groups in (("delta_auc_per_condition", "condition"), ("delta_auc_per_tag", "tag")):
        rows = records if groups == "condition" else _by(records, condition="default")
        labels = sorted({r[groups] for r in rows}, key=lambda v: (list(CONDITIONS).index(v)
                                                                  if groups == "condition" else 0, v))
        if not labels:
            continue
        fig, ax = new_figure((max(6.0, 0.5 * len(labels) + 2), 4))
        width = 0.4
        for shift, direction in ((-width / 2, "increase"), (width / 2, "decrease")):
            stats = [mean_ci([r["delta_auc"] for r in _by(rows, **{groups: g}, direction=direction)])
                     for g in labels]
            means = [s[0] for s in stats]
            errors = [s[1] for s in stats]
            ax.bar(np.arange(len(labels)) + shift, means, width, yerr=errors, capsize=3, label=direction)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(labels)), labels, rotation=45, ha="right")
        ax.set_ylabel("mean ΔAUC_t (95% CI)")
        ax.set_title(f"SteerEval ΔAUC_t per {groups}")
        ax.legend()
        folder.save_figure(fig, name)


# ----------------------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    return runner_parser("ctrlsim steereval", __doc__, SteerEvalConfig)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(SteerEvalConfig, args)  # validates every value before any model loads
    options = config_from_args(RunOptions, args)
    started = time.perf_counter()
    result = run_steereval(config, options)
    print(result["tables"])
    print(f"run folder: {options.out or DEFAULT_OUT} ({time.perf_counter() - started:.0f} s)")
    return 0
