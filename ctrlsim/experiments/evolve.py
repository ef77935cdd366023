"""`ctrlsim evolve`: CtrlBench-Rec's evolutionary training loop, then t evaluation rounds.

    K_init LLM persona probes -> [interact E_i rounds, embed, cluster, debate, merge] x E_m
    -> align -> evaluate the super probes for t rounds (Task 1 metrics per round)

Paper schedule (Appendix C): --agents 100 --merges 2 --rounds-per-merge 2 --eval-rounds 20
(100 -> 50 -> 25 probes). The run folder holds config.json, records.jsonl (one record per
finished phase and the evaluation), the loop's artefacts (roster_g*.json, clusters_g*.json,
transcript_g*.json, merge_g*.json, phases.json with wall time and tokens per phase),
final_roster.json, tables.md and figures/*.png. Rerunning the same command resumes at the
first unfinished phase; LLM replies are cached in the folder (llm-cache.sqlite), so nothing
is paid twice. With --executor ray each cluster's debate and merge is one unit of work on the
cluster's workers (the driver runs the other phases and writes every artefact). Evaluate the
result on any black box with
`ctrlsim ctrlbench --roster <out>/final_roster.json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ctrlsim.agents.llm_probe import DECISION_HEADS, DEFAULT_DECISION, DEFAULT_THRESHOLD
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    MAX_AGENTS,
    MAX_ITEMS,
    MAX_MERGES,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SLATE,
    MAX_TOKENS,
    RunOptions,
    bound,
    check_choice,
    check_choices,
    check_range,
)
from ctrlsim.experiments.evolve_fusion import ExecutorFusion, FusionUnitConfig, fuse_cluster_unit  # noqa: F401
from ctrlsim.experiments.runner import RunContext, Runner

DEFAULT_OUT = "results/evolve"
K_RULES = ("halve", "silhouette")
FUSIONS = ("debate-merge", "select-best")
PROMPT_VARIANTS = ("default", "logic")


@dataclass(frozen=True)
class EvolveConfig:
    """One evolution run (everything that determines its results)."""

    agents: int = field(default=100, metadata={
        "help": f"K_init, probes in the first generation (paper: 100; {bound(MAX_AGENTS)})"})
    merges: int = field(default=2, metadata={
        "help": f"E_m, cluster-debate-merge fusions (paper: 2; {bound(MAX_MERGES)})"})
    rounds_per_merge: int = field(default=2, metadata={
        "help": f"E_i, interaction rounds before each fusion ({bound(MAX_ROUNDS)})"})
    eval_rounds: int = field(
        default=20, metadata={
            "help": f"t, evaluation rounds of the super probes (0: none; {bound(MAX_ROUNDS)})"}
    )
    llm: str = field(
        default="qwen2.5-0.5b", metadata={"help": "LLM of probes, debate and merge (load_llm spec)"}
    )
    encoder: str = field(
        default="minilm", metadata={"help": "encoder of the embed phase (load_encoder spec)"}
    )
    recommender: str = field(
        default="embedding", metadata={"help": "the black box (ctrlsim.recommenders name)"}
    )
    target: tuple[str, ...] = field(
        default=("Film-Noir",), metadata={"help": "target tag(s), comma-separated"}
    )
    dataset: str = field(default="ml-100k", metadata={"help": "dataset name or path"})
    seed: int = field(default=0, metadata={
        "help": f"seed (users sampled, K-means, sampling, envs; {bound(MAX_SEED)})"})
    k_rule: str = field(
        default="halve",
        metadata={
            "help": "k per generation: ceil(N/2), or best silhouette in [N/2, 3N/4]",
            "choices": list(K_RULES),
        },
    )
    alpha: float = field(
        default=0.2, metadata={"help": "bio weight in V = a*enc(bio) + (1-a)*mean(enc(likes))"}
    )
    fusion: str = field(
        default="debate-merge",
        metadata={
            "help": "debate-merge (CtrlBench-Rec) or select-best (KMeans-Fusion)",
            "choices": list(FUSIONS),
        },
    )
    slate_size: int | None = field(
        default=None, metadata={
            "help": f"items per slate (default: 20 for narm, else 3, as in the paper; {bound(MAX_SLATE)})"}
    )
    temperature: float = field(default=0.7, metadata={
        "help": "sampling temperature of the loop's decisions, debates and merges (seeded; paper: 1.0)"})
    memory_rounds: int = field(default=3, metadata={
        "help": f"M, rounds of short-term memory in the loop's decisions ({bound(MAX_ROUNDS)})"})
    conversation: str = field(default="memory", metadata={
        "omit_default": True, "choices": ["memory", "append"],
        "help": "probe prompts in the loop's rounds: memory (the paper's) or append (a growing "
                "conversation, fast with KV reuse)"})
    eval_conversation: str = field(default="memory", metadata={
        "omit_default": True, "choices": ["memory", "append"],
        "help": "probe prompts in the evaluation rounds"})
    decision: str = field(default=DEFAULT_DECISION, metadata={
        "choices": list(DECISION_HEADS),
        "help": "how LLM probes decide, in the loop and the evaluation (docs/probe-validity.md)"})
    decision_threshold: float = field(default=DEFAULT_THRESHOLD, metadata={
        "help": "P(yes) at or above which a question head likes an item, in (0, 1)"})
    eval_temperature: float = field(default=0.0, metadata={
        "help": "decision temperature of the evaluation rounds (the setting `ctrlsim ctrlbench` scores "
                "every method and roster with)"})
    eval_memory_rounds: int = field(default=2, metadata={
        "help": f"M in the evaluation rounds (ctrlbench's evaluation setting; {bound(MAX_ROUNDS)})"})
    allow_search: bool = field(default=False, metadata={
        "help": "offer probes the search tool (search likes never count; the paper's evaluation: off)"})
    target_visible: bool = field(default=True, metadata={"help": "show the target tags to the probes"})
    prompt_variant: str = field(
        default="default",
        metadata={
            "help": "decision prompt in evaluation: default, or logic (long-tail, Appendix D.8)",
            "choices": list(PROMPT_VARIANTS),
        },
    )
    l_init: tuple[int, ...] = field(default=(4, 6), metadata={
        "help": f"seed history length range L_init ({bound(MAX_ITEMS)})"})
    debate_max_tokens: int = field(default=160, metadata={
        "help": f"reply budget of one debate turn ({bound(MAX_TOKENS)})"})
    merge_max_tokens: int = field(default=384, metadata={
        "help": f"reply budget of one merge (JSON profile; {bound(MAX_TOKENS)})"})
    align_min_behaviour: int = field(
        default=4, metadata={"help": "alignment fills shorter super-probe histories by catalogue search "
                                     f"({bound(MAX_ITEMS)})"}
    )
    levels: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Task 2 level presets to run with the super probes for eval-rounds rounds "
            "(level-1,level-2,level-3: Table 6; Table 2 and Figure 7 come out)"
        },
    )

    def __post_init__(self):
        check_range("align_min_behaviour", self.align_min_behaviour, low=0, high=MAX_ITEMS)
        from ctrlsim.agents.evolution.levels import LEVELS

        check_choices("levels", self.levels, LEVELS, allow_empty=True)
        if self.levels and self.eval_rounds < 1:
            raise ConfigError("levels need eval-rounds >= 1")
        for name, high in (("agents", MAX_AGENTS), ("merges", MAX_MERGES), ("rounds_per_merge", MAX_ROUNDS),
                           ("debate_max_tokens", MAX_TOKENS), ("merge_max_tokens", MAX_TOKENS)):
            check_range(name, getattr(self, name), low=1, high=high)
        check_range("eval_rounds", self.eval_rounds, low=0, high=MAX_ROUNDS)
        check_range("alpha", self.alpha, low=0.0, high=1.0)
        check_range("temperature", self.temperature, low=0.0, high=2.0)
        check_range("memory_rounds", self.memory_rounds, low=0, high=MAX_ROUNDS)
        check_range("eval_temperature", self.eval_temperature, low=0.0, high=2.0)
        from ctrlsim.agents.llm_probe import check_decision  # a bad head fails before any model loads

        for conversation in (self.conversation, self.eval_conversation):
            check_decision(self.decision, self.decision_threshold, allow_search=self.allow_search,
                           conversation=conversation)
        check_range("eval_memory_rounds", self.eval_memory_rounds, low=0, high=MAX_ROUNDS)
        check_range("seed", self.seed, low=0, high=MAX_SEED)
        check_choice("k_rule", self.k_rule, K_RULES)
        check_choice("fusion", self.fusion, FUSIONS)
        check_choice("prompt_variant", self.prompt_variant, PROMPT_VARIANTS)
        for name in ("conversation", "eval_conversation"):
            check_choice(name, getattr(self, name), ("memory", "append"))
        if self.slate_size is not None:
            check_range("slate_size", self.slate_size, low=1, high=MAX_SLATE)
        if not self.target or any(not t.strip() for t in self.target):
            raise ConfigError(f"target needs at least one non-empty tag, got {self.target!r}")
        if len(set(self.target)) != len(self.target):
            raise ConfigError(f"target: a tag is given more than once in {list(self.target)}")
        from ctrlsim.recommenders.registry import check_recommender_name

        try:
            check_recommender_name(self.recommender)
        except ConfigError as exc:
            raise ConfigError(f"recommender: {exc}") from None
        if len(self.l_init) != 2 or not 1 <= self.l_init[0] <= self.l_init[1]:
            raise ConfigError(f"l_init must be low,high with 1 <= low <= high, got {self.l_init}")
        check_range("l_init", self.l_init[1], low=1, high=MAX_ITEMS)

    @property
    def slate(self) -> int:
        return self.slate_size or (20 if self.recommender == "narm" else 3)

    def schedule(self) -> list[int]:
        """Expected population per generation with the halving rule: K, ceil(K/2), ..."""
        sizes = [self.agents]
        for _ in range(self.merges):
            sizes.append(-(-sizes[-1] // 2))
        return sizes


# ----------------------------------------------------------------------------- checks


def _check_inputs(config: EvolveConfig, dataset) -> set[str]:
    from ctrlsim.envs.roster import user_order

    unknown = [t for t in config.target if t not in dataset.tags]
    if unknown:
        raise ConfigError(
            f"unknown target tag(s) {unknown} in dataset {dataset.name!r}; known: {', '.join(dataset.tags)}"
        )
    users = len(user_order(dataset))
    if config.agents > users:
        raise ConfigError(f"agents={config.agents} exceeds the {users} users of {dataset.name!r}")
    return {i for t in config.target for i in dataset.items_with_tag(t)}


def _record_phases(folder, phases: dict) -> None:
    for name, entry in phases.items():
        key = f"phase/{name}"
        if key not in folder.store:
            folder.store.add(key, {"phase": name, **entry})





# ----------------------------------------------------------------------------- the runner


def _check(ctx: RunContext) -> None:
    from ctrlsim.backends.bundled import check_cache_writable
    from ctrlsim.backends.spec_check import llm_cache_uses
    from ctrlsim.recommenders.registry import cache_uses

    ctx.state["target_items"] = _check_inputs(ctx.config, _dataset(ctx.config))
    # The LLM's replies live in the run folder; $CTRLSIM_CACHE holds a bundled LLM and a box's weights.
    uses = {} if ctx.resources.get("llm") is not None else llm_cache_uses(ctx.config.llm)
    check_cache_writable({**cache_uses(ctx.config.recommender), **uses})


def _prepare(ctx: RunContext) -> None:
    """The loop's phases are one unit of work, "phases": a failure is reported, never stored."""
    from ctrlsim.experiments.driver import UnitsFailed
    from ctrlsim.experiments.executor import failure_record

    try:
        _evolve(ctx)
    except UnitsFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - a failed phase fails the run's unit, it does not crash it
        raise UnitsFailed({"phases": failure_record(exc)["error"]}) from exc


def _evolve(ctx: RunContext) -> None:
    """The evolution loop, phase by phase, in the driver (it writes the loop's artefacts); with
    --executor ray each cluster's debate and merge is a unit on the workers (`ExecutorFusion`)."""
    from ctrlsim.agents import MethodContext, ProfileSettings
    from ctrlsim.agents.evolution import EvolutionLoop, EvolutionSettings
    from ctrlsim.backends import resolve_llm
    from ctrlsim.envs import make_task
    from ctrlsim.experiments.units import provide_llm

    config, folder = ctx.config, ctx.folder
    assert folder is not None
    cache = str(folder.file("llm-cache.sqlite").resolve())
    llm = resolve_llm(ctx.resources.get("llm") or config.llm, cache=cache)
    # The evaluation units find the same LLM object when they run in this process.
    provide_llm(config.llm, cache, llm)
    dataset = _dataset(config)
    recommender = _recommender(config)
    task = make_task("target-discovery", dataset, target=list(config.target))
    decisions = _decisions(config)
    context = MethodContext(
        dataset=dataset, recommender=recommender, target_tags=tuple(config.target),
        target_items=frozenset(ctx.state["target_items"]), seed=config.seed, k_large=config.agents,
        k_small=config.agents, rounds=config.eval_rounds, slate_size=config.slate,
        decision_settings=decisions,
        profile_settings=ProfileSettings(l_init=tuple(config.l_init)), llm_factory=lambda: llm,
        profile_store=folder.file("profiles.sqlite"), show_progress=ctx.show_progress)
    settings = EvolutionSettings(
        merges=config.merges, rounds_per_merge=config.rounds_per_merge, k_rule=config.k_rule,
        alpha=config.alpha,
        fusion=config.fusion, temperature=config.temperature, debate_max_tokens=config.debate_max_tokens,
        merge_max_tokens=config.merge_max_tokens, align_min_behaviour=config.align_min_behaviour)
    # Debate and merge go cluster by cluster to the executor's workers; with the local executor
    # every cluster debates and merges together here (one batched call per round).
    fusion = None
    if ctx.options.executor != "local" and config.fusion == "debate-merge":
        fusion = ExecutorFusion(config, ctx.options, folder, show_progress=ctx.show_progress)
    loop = EvolutionLoop(folder.path, dataset=dataset, recommender=recommender, task=task, llm=llm,
                         encoder=config.encoder, settings=settings, decision_settings=decisions,
                         seed=config.seed,
                         slate_size=config.slate, show_progress=ctx.show_progress, fuse_elsewhere=fusion,
                         identity={k: v for k, v in folder.config.items() if k not in RUNNER.extensible})
    try:
        result = loop.run(lambda: context.base_personas(config.agents),
                          stop_after=ctx.resources.get("stop_after"))
    finally:
        if fusion is not None:
            fusion.close()
    _record_phases(folder, result.phases)
    folder.write_json("generations.json", result.generations)
    ctx.state.update(result=result, llm=llm)


def _dataset(config: EvolveConfig):
    """The dataset, once per process: the loop's task and the black box must share one object."""
    from ctrlsim.experiments.units import cached_dataset

    return cached_dataset(config.dataset)


def _recommender(config: EvolveConfig):
    from ctrlsim.experiments.executor import worker_cache
    from ctrlsim.recommenders import make_recommender

    return worker_cache(f"evolve-box:{config.dataset}:{config.recommender}",
                        lambda: make_recommender(config.recommender, _dataset(config), mask_shown=True))


def _decisions(config: EvolveConfig, *, evaluation: bool = False):
    """How probes decide in the loop's interaction phases, or (`evaluation`) in the evaluation
    rounds, under the same setting `ctrlsim ctrlbench` uses, so one roster gets one score."""
    from ctrlsim.agents import DecisionSettings

    shared = dict(target_visible=config.target_visible, allow_search=config.allow_search,
                  decision=config.decision, threshold=config.decision_threshold)
    if evaluation:
        return DecisionSettings(memory_rounds=config.eval_memory_rounds, temperature=config.eval_temperature,
                                conversation=config.eval_conversation, **shared)
    return DecisionSettings(memory_rounds=config.memory_rounds, temperature=config.temperature,
                            conversation=config.conversation, **shared)


@dataclass(frozen=True)
class EvaluationUnit:
    """What an evaluation unit needs: the config, the super probes (as dicts) and the LLM cache."""

    config: EvolveConfig
    final: tuple[dict, ...]
    cache: str
    target_items: frozenset
    show_progress: bool


def evaluation_unit(unit: EvaluationUnit, key: str) -> dict:
    """Unit "evaluate" (Task 1 rounds of the super probes) or "level/<name>" (a Task 2 level)."""
    from ctrlsim.agents.persona import Persona
    from ctrlsim.experiments.evolve_eval import evaluate_level, evaluate_roster
    from ctrlsim.experiments.units import cached_llm

    config = unit.config
    personas = [Persona.from_dict(p) for p in unit.final]
    llm = cached_llm(config.llm, unit.cache)
    recommender, decisions = _recommender(config), _decisions(config, evaluation=True)
    if key == "evaluate":
        return evaluate_roster(config, personas, recommender, llm, decisions, set(unit.target_items),
                               show_progress=unit.show_progress)
    if key.startswith("level/"):
        return evaluate_level(config, key.removeprefix("level/"), personas, recommender, llm, decisions)
    raise ConfigError(f"unknown evolve unit {key!r}")


def _payload(ctx: RunContext) -> EvaluationUnit:
    assert ctx.folder is not None
    return EvaluationUnit(ctx.config, tuple(p.to_dict() for p in ctx.state["result"].final),
                          str(ctx.folder.file("llm-cache.sqlite").resolve()),
                          frozenset(ctx.state["target_items"]), ctx.show_progress)


def _plan(ctx: RunContext, finished) -> list[str]:
    result = ctx.state.get("result")
    if result is None or result.stopped_after is not None:
        return []
    return (["evaluate"] if ctx.config.eval_rounds > 0 else []) + [f"level/{n}" for n in ctx.config.levels]


def _phases(records) -> dict:
    return {k.removeprefix("phase/"): {f: v for f, v in r.items() if f != "phase"}
            for k, r in records.items() if k.startswith("phase/")}


def _generations(ctx: RunContext) -> list[dict]:
    result = ctx.state.get("result")
    if result is not None:
        return result.generations
    assert ctx.folder is not None
    return ctx.folder.read_json("generations.json", default=[])


def _levels(ctx: RunContext, records) -> dict:
    return {n: records[f"level/{n}"] for n in ctx.config.levels if f"level/{n}" in records}


def _report(ctx: RunContext, records) -> str:
    from ctrlsim.experiments.evolve_report import level_tables, render_tables

    tables = render_tables(ctx.config, _generations(ctx), _phases(records), records.get("evaluate"))
    levels = _levels(ctx, records)
    return tables + ("\n" + level_tables(levels) if levels else "")


def _figures(ctx: RunContext, records) -> None:
    from ctrlsim.experiments.evolve_report import save_figures, save_level_figure

    levels = _levels(ctx, records)
    if levels:
        save_level_figure(ctx.folder, levels)
    save_figures(ctx.folder, _generations(ctx), records.get("evaluate"))


RUNNER = Runner(name="evolve", config_cls=EvolveConfig, description=__doc__, unit_fn=evaluation_unit,
                plan=_plan, report=_report, figures=_figures, check=_check, prepare=_prepare,
                payload=_payload, resolved=lambda ctx: {"slate_size": ctx.config.slate},
                extensible=("levels",), llm_fields=("llm",), encoder_fields=("encoder",),
                default_out=DEFAULT_OUT, unit_name="evaluations")


def run_evolve(config: EvolveConfig, options: RunOptions | None = None, *, show_progress: bool = True,
               llm=None, stop_after: str | None = None) -> dict:
    """Run (or resume) the loop and the evaluation; returns {"final", "phases", "evaluation", "out", ...}.

    `llm` overrides loading `config.llm` in this process (it should carry a response cache for free
    resumes; with --executor ray the workers still load `config.llm`); `stop_after` ends the run once
    that phase is finished (tests use it to cut a run short). Failed units raise `RunFailedError`.
    """
    from ctrlsim.experiments.driver import RunFailedError, drive

    resources = {k: v for k, v in (("llm", llm), ("stop_after", stop_after)) if v is not None}
    if llm is not None:
        resources[config.llm] = llm  # the spec is served by this object: not checked as a path
    result = drive(RUNNER, config, options, show_progress=show_progress, resources=resources)
    if result.failed:
        raise RunFailedError(result)
    ctx = result.context
    assert ctx is not None
    loop = ctx.state["result"]
    if loop.stopped_after is not None:
        return {"stopped_after": loop.stopped_after, "out": str(result.out), "phases": loop.phases}
    records = result.records_by_key
    return {"final": loop.final, "generations": loop.generations, "phases": loop.phases,
            "evaluation": records.get("evaluate"), "tables": result.markdown, "out": str(result.out),
            "seconds": round(result.seconds, 1), "llm": ctx.state["llm"].identity}


def main(argv: list[str] | None = None) -> int:
    from ctrlsim.experiments.commands import runner_main

    return runner_main("evolve", argv)
