"""`ctrlsim ctrlbench`: CtrlBench-Rec's method comparison (Tables 1, 2 and 7, Figures 3, 8-11).

Methods x black boxes x targets x seeds: every (method, box, target, seed) is one episode, a
pure function `run_episode(config, key) -> record`, stored in the run folder's records.jsonl as
it finishes. A killed run started again with the same command skips finished episodes (and the
LLM response cache replays the half-finished one for free). The run folder then gets:

  config.json          the config and the software that ran it
  records.jsonl        one record per episode: per-round Task 1 curves and Efficiency counts, per-tag
                       finds, Task 2 / 3 curves, per-probe rounds (slate, source, likes, query, reply),
                       parse failures, dropped probes, substitutions, setup tokens, the LLM and box
  rosters/*.json       the evaluated personas of each (method, seed, box, target)
  tables.md            Table 1 and Table 7 per black box, the paired comparison with the reference
                       method, per-target (and per-tag) coverage, substitutions; Table 2 or Task 3
                       with --task; every cell with its 95% confidence interval
  figures/*.png        coverage vs round with 95% bands per box (Figures 10, 11); per-target bars

Only likes on recommender slates count (search is off unless --allow-search; search likes are
reported apart). A target is a tag or a '+' union of tags. Tables aggregate per black box and
are defined in `ctrlsim.experiments.ctrlbench_tables`.

`--roster file.json` evaluates a stored roster (a JSON list of Persona dicts, e.g. written by
`ctrlsim evolve`) as the method "roster"; `--methods module:attribute` imports a method from the
user's code (docs/ctrlbench.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrlsim.agents.llm_probe import DECISION_HEADS, DEFAULT_DECISION, DEFAULT_THRESHOLD
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    MAX_AGENTS,
    MAX_ITEMS,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SLATE,
    RunOptions,
    bound,
    check_choice,
    check_choices,
    check_range,
    config_to_dict,
)
from ctrlsim.experiments.ctrlbench_inputs import (  # noqa: F401 - part of this runner's API
    ROSTER_METHOD,
    cache_file,
    cache_uses,
    check_targets,
    load_roster,
    method_label,
    method_population,
    roster_digest,
    run_box,
    run_dataset,
    run_llm,
    target_items,
    target_tags,
)
from ctrlsim.experiments.runner import ProgressPayload, Runner, payload_with_progress

DEFAULT_OUT = "results/ctrlbench"
# Slate sizes of the CtrlBench-Rec reference runs: 20 for NARM, 3 for the other boxes.
PAPER_SLATE_SIZE = {"narm": 20}
PAPER_CHECKPOINTS = (5, 10, 15, 20)

# The paper's code steers one population toward the union of six genres (Figure 3 splits it).
PAPER_UNION = "Action+Adventure+Thriller+War+Romance+Film-Noir"
# `--preset paper`: the paper's sizes (K = 100 / 26, t = 20, the six-genre union, five boxes),
# search off as Appendix B's evaluation (a_t in L_t or a skip).
PAPER_PRESET: dict[str, Any] = {
    "methods": ("base-large", "base-small", "kmeans-fusion", "ctrlbench", "random", "oracle"),
    "recommenders": ("twhin-bert", "bge", "narm", "sasrec", "keyword-bm25"),
    "targets": (PAPER_UNION,),
    "agents": (100, 26),
    "rounds": 20,
    "seeds": (0, 1, 2),
    "temperature": 1.0,
    "allow_search": False,
    "decision": "json",
}
TASK_CHOICES = ("target-discovery", "profile-shaping", "popularity")
SMALL_USERS = ("own", "nested")
PRESETS = {"paper": PAPER_PRESET}


@dataclass(frozen=True)
class CtrlBenchConfig:
    """One CtrlBench-Rec comparison (what identifies its results)."""

    methods: tuple[str, ...] = field(default=("base-large", "base-small", "kmeans-fusion", "ctrlbench",
                                              "random"), metadata={
        "help": "methods to compare: base-large, base-small, kmeans-fusion, ctrlbench, ctrlbench-logic, "
                "random, oracle, rl:PATH (a probe trained by `ctrlsim train-probe`), or module:attribute "
                "(a method from your code, docs/ctrlbench.md)"})
    recommenders: tuple[str, ...] = field(default=("embedding",), metadata={
        "help": "black boxes (names of `ctrlsim.recommenders`, or recbole:<Model>)"})
    targets: tuple[str, ...] = field(default=("War+Film-Noir",), metadata={
        "help": f"target sets: a tag, or tags joined by '+' into one union target (paper: {PAPER_UNION})"})
    llm: str = field(default="qwen2.5-0.5b", metadata={"help": "the probes' LLM (a load_llm spec)"})
    agents: tuple[int, ...] = field(default=(8, 2), metadata={
        "help": "K_large,K_small: probes of base-large and the evolution's start, and of base-small/random/"
                "oracle; K_small = the super probes left after the fusions for a fair comparison "
                f"(paper: 100,26; {bound(MAX_AGENTS)})"})
    rounds: int = field(default=4, metadata={
        "help": f"interaction rounds t per episode (paper: 20; {bound(MAX_ROUNDS)})"})
    seeds: tuple[int, ...] = field(default=(0, 1), metadata={
        "help": "seeds (users sampled, sampling, env); two at least for a confidence interval "
                f"({bound(MAX_SEED)})"})
    task: str = field(default="target-discovery", metadata={
        "help": "which task's tables: target-discovery (Tables 1, 7), profile-shaping (Table 2) or "
                "popularity (Figures 8, 9); every episode records all three", "choices": list(TASK_CHOICES)})
    allow_search: bool = field(default=False, metadata={
        "help": "offer probes the search tool (search likes shape histories but never count; "
                "paper's evaluation: off)"})
    reference: str | None = field(default=None, metadata={
        "help": "the method every other is compared with in the paired table (default: base-small when "
                "it runs, else the first method)"})
    small_users: str = field(default="own", metadata={
        "help": "K_small methods' users: their own random sample, or nested = the first K_small of "
                "Base-Large's (then Base-Large >= Base-Small by construction)", "choices": list(SMALL_USERS)})
    dataset: str = field(default="ml-100k", metadata={"help": "dataset name or path"})
    slate_size: int | None = field(default=None, metadata={
        "help": f"items per slate (default: the paper's, 20 for narm and 3 for the other boxes; "
                f"{bound(MAX_SLATE)})"})
    checkpoints: tuple[int, ...] | None = field(default=None, metadata={
        "help": "rounds reported in Table 1 (default: 5,10,15,20 up to --rounds, else quarters of it)"})
    memory_rounds: int = field(default=2, metadata={
        "help": f"M, rounds of short-term memory in the prompt (the shared evaluation setting; "
                f"{bound(MAX_ROUNDS)})"})
    target_visible: bool = field(default=True, metadata={"help": "show the target tags to the probes"})
    conversation: str = field(default="memory", metadata={
        "omit_default": True, "choices": ["memory", "append"],
        "help": "probe prompts: memory (last M rounds summarised, the paper's) or append (a growing "
                "conversation; fast with KV reuse, docs/ctrlbench.md)"})
    decision: str = field(default=DEFAULT_DECISION, metadata={
        "choices": list(DECISION_HEADS),
        "help": "how LLM probes decide: json (one generated {\"like\": [...]} reply, the paper's), yesno "
                "(one yes/no question per item, P(yes) from the next-token probabilities) or twostep "
                "(fits the persona? one of the goal's items? both must pass); docs/probe-validity.md"})
    decision_threshold: float = field(default=DEFAULT_THRESHOLD, metadata={
        "help": "P(yes) at or above which a question head (yesno, twostep) likes an item, in (0, 1)"})
    temperature: float = field(default=0.0, metadata={
        "help": "probe and profile sampling temperature; 0 = greedy, batched as parallel sequences on "
                "llama.cpp (paper: 1.0)"})
    l_init: tuple[int, ...] = field(default=(4, 6), metadata={
        "help": f"seed history length range L_init ({bound(MAX_ITEMS)})"})
    like_prob: float = field(default=0.3, metadata={"help": "the random method's like probability"})
    min_target_items: int = field(default=5, metadata={
        "help": "smallest target set accepted (coverage over fewer items moves in steps of 20%%+; "
                f"{bound(MAX_ITEMS)})"})
    recommender_llm: str | None = field(default=None, metadata={
        "help": "LLM inside LLM-based boxes such as keyword-bm25 (default: the box's own)"})
    roster: str | None = field(default=None, metadata={
        "help": "a JSON file of Persona dicts evaluated as the method 'roster'"})
    cache: bool = field(default=True, metadata={
        "help": "cache LLM replies and personas under $CTRLSIM_CACHE/ctrlbench (replays are free)"})
    method_options: dict[str, dict] = field(default_factory=dict, metadata={
        "help": "per-method options, method name -> dict (config only, no flag)"})

    def __post_init__(self):
        from ctrlsim.agents.methods import known_methods

        if ROSTER_METHOD in self.methods and self.roster is None:
            raise ConfigError("method 'roster' needs --roster <file.json>")
        methods = [m for m in self.methods if m != ROSTER_METHOD]
        custom = [m for m in methods if ":" in m]
        check_choices("methods", [m for m in methods if ":" not in m], known_methods(),
                      allow_empty=self.roster is not None or bool(custom))
        for name in custom:  # imported now: an unimportable one fails before any model loads
            from ctrlsim.agents.methods import get_method
            from ctrlsim.agents.rl import check_rl_method, is_rl_method

            get_method(name)
            if is_rl_method(name):  # a saved policy sees slates of the size it was trained on
                for size in sorted({self.slate_for(box) for box in self.recommenders}):
                    check_rl_method(name, slate_size=size, allow_search=self.allow_search)
        check_choice("task", self.task, TASK_CHOICES)
        check_choice("small_users", self.small_users, SMALL_USERS)
        check_choice("conversation", self.conversation, ("memory", "append"))
        from ctrlsim.agents.llm_probe import check_decision

        # A bad head, threshold or combination fails now, before any model loads.
        check_decision(self.decision, self.decision_threshold, allow_search=self.allow_search,
                       conversation=self.conversation)
        if self.reference is not None and self.reference not in self.all_methods:
            raise ConfigError(f"reference {self.reference!r} is not among the methods "
                              f"{list(self.all_methods)}")
        from ctrlsim.recommenders.registry import check_recommender_name

        for box in self.recommenders:
            try:
                check_recommender_name(box)
            except ConfigError as exc:
                raise ConfigError(f"recommenders: {exc}") from None
        check_choices("recommenders", self.recommenders, self.recommenders)  # no box twice
        if not self.recommenders:
            raise ConfigError("recommenders needs at least one black box")
        if not self.targets:
            raise ConfigError("targets needs at least one tag")
        for name, values in (("targets", self.targets), ("recommenders", self.recommenders),
                             ("methods", self.methods)):
            bad = [v for v in values if "|" in v or not v.strip()
                   or (name == "targets" and any(not tag.strip() for tag in v.split("+")))]
            if bad:
                raise ConfigError(f"{name}: {bad[0]!r} is empty or contains '|'")
        for target in self.targets:
            tags = target.split("+")
            if len(set(tags)) != len(tags):
                raise ConfigError(f"targets: {target!r} names a tag more than once")
        repeated = sorted({t for t in self.targets if self.targets.count(t) > 1})
        if repeated:
            raise ConfigError(f"targets: given more than once: {repeated}")
        if len(self.agents) != 2 or self.agents[1] > self.agents[0]:
            raise ConfigError(f"agents must be K_large,K_small with K_small <= K_large, got {self.agents}")
        for k in self.agents:
            check_range("agents", k, low=1, high=MAX_AGENTS)
        check_range("rounds", self.rounds, low=1, high=MAX_ROUNDS)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")
        for s in self.seeds:
            check_range("seeds", s, low=0, high=MAX_SEED)
        if self.slate_size is not None:
            check_range("slate_size", self.slate_size, low=1, high=MAX_SLATE)
        for t in self.checkpoints or ():
            check_range("checkpoints", t, low=1, high=self.rounds)
        check_range("memory_rounds", self.memory_rounds, low=0, high=MAX_ROUNDS)
        check_range("temperature", self.temperature, low=0.0, high=2.0)
        if len(self.l_init) != 2 or not 1 <= self.l_init[0] <= self.l_init[1]:
            raise ConfigError(f"l_init must be low,high with 1 <= low <= high, got {self.l_init}")
        check_range("l_init", self.l_init[1], low=1, high=MAX_ITEMS)
        check_range("like_prob", self.like_prob, low=0.0, high=1.0)
        check_range("min_target_items", self.min_target_items, low=1, high=MAX_ITEMS)
        if self.roster is not None and not Path(self.roster).is_file():
            raise ConfigError(f"--roster {self.roster!r}: no such file")

    # ------------------------------------------------------------------ derived
    @property
    def all_methods(self) -> tuple[str, ...]:
        """The methods evaluated: the named ones, plus 'roster' when a roster file is given."""
        if self.roster is not None and ROSTER_METHOD not in self.methods:
            return (*self.methods, ROSTER_METHOD)
        return self.methods

    @property
    def reference_method(self) -> str:
        if self.reference is not None:
            return self.reference
        return "base-small" if "base-small" in self.all_methods else self.all_methods[0]

    def decision_settings(self):
        """How this run's LLM probes decide (`ctrlsim.agents.llm_probe.DecisionSettings`)."""
        from ctrlsim.agents.llm_probe import DecisionSettings

        return DecisionSettings(memory_rounds=self.memory_rounds, target_visible=self.target_visible,
                                temperature=self.temperature, allow_search=self.allow_search,
                                conversation=self.conversation, decision=self.decision,
                                threshold=self.decision_threshold)

    def slate_for(self, box: str) -> int:
        return self.slate_size or PAPER_SLATE_SIZE.get(box, 3)

    def report_rounds(self) -> tuple[int, ...]:
        if self.checkpoints:
            return tuple(sorted(set(self.checkpoints)))
        paper = tuple(t for t in PAPER_CHECKPOINTS if t <= self.rounds)
        if self.rounds >= PAPER_CHECKPOINTS[-1]:
            return paper
        return tuple(sorted({max(1, round(self.rounds * q / 4)) for q in (1, 2, 3, 4)}))

    def keys(self) -> list[str]:
        """Episode keys in a stable order: method|box|target|seed=N."""
        return [episode_key(m, b, t, s) for b in self.recommenders for t in self.targets for s in self.seeds
                for m in self.all_methods]


def episode_key(method: str, box: str, target: str, seed: int) -> str:
    return f"{method}|{box}|{target}|seed={seed}"


def parse_key(key: str) -> tuple[str, str, str, int]:
    try:
        method, box, target, seed = key.split("|")
        return method, box, target, int(seed.removeprefix("seed="))
    except ValueError:
        raise ConfigError(f"not a ctrlbench episode key: {key!r} (expected method|box|target|seed=N)") \
            from None


# ----------------------------------------------------------------------------- one episode

def run_episode(config: CtrlBenchConfig, key: str, *, show_progress: bool = True) -> dict:
    """One (method, box, target, seed) episode -> its record (a pure function of config and key)."""
    from ctrlsim.agents import ProfileSettings
    from ctrlsim.agents.episode import EpisodeSpec, play_episode
    from ctrlsim.agents.methods import MethodContext

    started = time.perf_counter()
    method, box, target, seed = parse_key(key)
    dataset = run_dataset(config)
    recommender = run_box(config, box)
    targets = target_items(dataset, target)
    settings = config.decision_settings()
    slate_size = config.slate_for(box)
    context = MethodContext(
        dataset=dataset, recommender=recommender, target_tags=target_tags(target), target_items=targets,
        seed=seed, small_sample="large" if config.small_users == "nested" else "small",
        k_large=config.agents[0], k_small=config.agents[1], rounds=config.rounds, slate_size=slate_size,
        decision_settings=settings,
        profile_settings=ProfileSettings(l_init=tuple(config.l_init), temperature=config.temperature),
        llm_factory=lambda: run_llm(config),
        profile_store=cache_file("profiles.sqlite") if config.cache else None,
        options=dict(config.method_options.get(method, {})), show_progress=show_progress)
    population = method_population(method, config.roster, context)
    spec = EpisodeSpec(method, method_label(method), box, target, seed, config.rounds, slate_size,
                       config.target_visible, config.like_prob, target_tags(target), config.allow_search,
                       config.task)
    llm = run_llm(config) if population.policy == "llm" else None
    record = play_episode(spec, population, recommender, targets, llm=llm, settings=settings,
                          show_progress=show_progress)
    # The unit's wall time: loading the box and writing the personas count, not only the rounds.
    record["timing"] = {"seconds": round(time.perf_counter() - started, 2)}
    return record


# ----------------------------------------------------------------------------- the runner

def episode_unit(unit: ProgressPayload, key: str) -> dict:
    return run_episode(unit.config, key, show_progress=unit.show_progress)


def _check(ctx) -> None:
    from ctrlsim.backends.bundled import check_cache_writable

    check_targets(ctx.config, run_dataset(ctx.config))  # bad targets and rosters fail before any model loads
    check_cache_writable(cache_uses(ctx.config))  # an unwritable $CTRLSIM_CACHE fails now, not per episode


def _identity(ctx) -> dict:
    stored = config_to_dict(ctx.config)
    if ctx.config.roster is not None:
        stored["roster_sha256"] = roster_digest(ctx.config.roster)
    return stored


def _resolved(ctx) -> dict:
    """Open fields as the units resolve them: the slate size per box, the LLM inside an LLM box."""
    config = ctx.config
    resolved: dict = {"slate_size": {box: config.slate_for(box) for box in config.recommenders}}
    if "keyword-bm25" in config.recommenders:
        import inspect

        from ctrlsim.recommenders.keyword_bm25 import KeywordBM25Recommender

        default = inspect.signature(KeywordBM25Recommender.__init__).parameters["llm"].default
        resolved["recommender_llm"] = {"keyword-bm25": config.recommender_llm or default}
    return resolved


def _from_identity(identity) -> CtrlBenchConfig:
    from ctrlsim.experiments.config import config_from_dict

    return config_from_dict(CtrlBenchConfig, {k: v for k, v in identity.items() if k != "roster_sha256"})


def _plan(ctx, finished) -> list[str]:
    return ctx.config.keys()


def _sizes(config: CtrlBenchConfig) -> dict[str, int]:
    """Items per target and per tag of every target."""
    dataset = run_dataset(config)
    sizes = {target: len(target_items(dataset, target)) for target in config.targets}
    sizes.update({tag: len(dataset.items_with_tag(tag)) for t in config.targets for tag in target_tags(t)})
    return sizes


def _on_stored(ctx, key: str, record: dict) -> None:
    """The episode's roster file, from its record (on resume only where it is missing: files are
    written atomically, so one that exists is whole)."""
    name = key.replace("|", "_").replace("=", "").replace(":", "-").replace("/", "-")
    path = f"rosters/{name}.json"
    if not ctx.folder.file(path).exists():
        ctx.folder.write_json(path, record["personas"])


def _report(ctx, records) -> str:
    from ctrlsim.experiments.ctrlbench_report import render_tables

    return render_tables(ctx.config, dict(records), _sizes(ctx.config))


def _figures(ctx, records) -> None:
    from ctrlsim.experiments.ctrlbench_report import save_figures

    save_figures(ctx.folder, ctx.config, dict(records), _sizes(ctx.config))


RUNNER = Runner(name="ctrlbench", config_cls=CtrlBenchConfig, description=__doc__, unit_fn=episode_unit,
                payload=payload_with_progress, plan=_plan, report=_report, figures=_figures, check=_check,
                identity=_identity, resolved=_resolved,
                from_identity=_from_identity, on_stored=_on_stored,
                extensible=("methods", "recommenders", "targets", "seeds"),
                llm_fields=("llm", "recommender_llm"), presets=PRESETS, default_out=DEFAULT_OUT,
                record_fields=("method", "recommender", "target", "seed", "curves", "probes", "personas"),
                unit_name="episodes")


def run_ctrlbench(config: CtrlBenchConfig, options: RunOptions | None = None, *, show_progress: bool = True,
                  max_episodes: int | None = None) -> dict:
    """Run (or resume) the comparison; returns {"records", "tables", "out", "failed"}.

    `max_episodes` stops after that many new episodes (tests use it to interrupt a run).
    """
    from ctrlsim.experiments.driver import drive

    result = drive(RUNNER, config, options, show_progress=show_progress, max_units=max_episodes)
    return {"records": result.records_by_key, "tables": result.markdown, "out": str(result.out),
            "failed": result.failed}


def main(argv: list[str] | None = None) -> int:
    from ctrlsim.experiments.commands import runner_main

    return runner_main("ctrlbench", argv)
