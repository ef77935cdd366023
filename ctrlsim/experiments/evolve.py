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

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    RunOptions,
    check_choice,
    check_choices,
    check_range,
    config_from_args,
    config_to_dict,
    runner_parser,
)

if TYPE_CHECKING:  # the executor module is imported lazily at run time
    from ctrlsim.experiments.executor import Executor

DEFAULT_OUT = "results/evolve"
K_RULES = ("halve", "silhouette")
FUSIONS = ("debate-merge", "select-best")
PROMPT_VARIANTS = ("default", "logic")


@dataclass(frozen=True)
class EvolveConfig:
    """One evolution run (everything that determines its results)."""

    agents: int = field(default=100, metadata={"help": "K_init, probes in the first generation (paper: 100)"})
    merges: int = field(default=2, metadata={"help": "E_m, cluster-debate-merge fusions (paper: 2)"})
    rounds_per_merge: int = field(default=2, metadata={"help": "E_i, interaction rounds before each fusion"})
    eval_rounds: int = field(
        default=20, metadata={"help": "t, evaluation rounds of the super probes (0: none)"}
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
    seed: int = field(default=0, metadata={"help": "seed (users sampled, K-means, sampling, envs)"})
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
        default=None, metadata={"help": "items per slate (default: 20 for narm, else 3, as in the paper)"}
    )
    temperature: float = field(default=0.7, metadata={"help": "sampling temperature (seeded; paper: 1.0)"})
    memory_rounds: int = field(default=3, metadata={"help": "M, rounds of short-term memory in decisions"})
    target_visible: bool = field(default=True, metadata={"help": "show the target tags to the probes"})
    prompt_variant: str = field(
        default="default",
        metadata={
            "help": "decision prompt in evaluation: default, or logic (long-tail, Appendix D.8)",
            "choices": list(PROMPT_VARIANTS),
        },
    )
    l_init: tuple[int, ...] = field(default=(4, 6), metadata={"help": "seed history length range L_init"})
    debate_max_tokens: int = field(default=160, metadata={"help": "reply budget of one debate turn"})
    merge_max_tokens: int = field(default=384, metadata={"help": "reply budget of one merge (JSON profile)"})
    align_min_behaviour: int = field(
        default=4, metadata={"help": "alignment fills shorter super-probe histories by catalogue search"}
    )
    levels: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Task 2 level presets to run with the super probes for eval-rounds rounds "
            "(level-1,level-2,level-3: Table 6; Table 2 and Figure 7 come out)"
        },
    )

    def __post_init__(self):
        check_range("align_min_behaviour", self.align_min_behaviour, low=0)
        from ctrlsim.agents.evolution.levels import LEVELS

        check_choices("levels", self.levels, LEVELS, allow_empty=True)
        if self.levels and self.eval_rounds < 1:
            raise ConfigError("levels need eval-rounds >= 1")
        for name in ("agents", "merges", "rounds_per_merge", "debate_max_tokens", "merge_max_tokens"):
            check_range(name, getattr(self, name), low=1)
        check_range("eval_rounds", self.eval_rounds, low=0)
        check_range("alpha", self.alpha, low=0.0, high=1.0)
        check_range("temperature", self.temperature, low=0.0, high=2.0)
        check_range("memory_rounds", self.memory_rounds, low=0)
        check_range("seed", self.seed, low=0)
        check_choice("k_rule", self.k_rule, K_RULES)
        check_choice("fusion", self.fusion, FUSIONS)
        check_choice("prompt_variant", self.prompt_variant, PROMPT_VARIANTS)
        if self.slate_size is not None:
            check_range("slate_size", self.slate_size, low=1)
        if not self.target or any(not t.strip() for t in self.target):
            raise ConfigError(f"target needs at least one non-empty tag, got {self.target!r}")
        if len(set(self.target)) != len(self.target):
            raise ConfigError(f"target: a tag is given more than once in {list(self.target)}")
        from ctrlsim.recommenders.registry import RECOMMENDERS

        if self.recommender not in RECOMMENDERS and not self.recommender.startswith("recbole:"):
            raise ConfigError(
                f"recommender: unknown black box {self.recommender!r}; choose from "
                f"{', '.join(sorted(RECOMMENDERS))} or recbole:<Model>"
            )
        if len(self.l_init) != 2 or not 1 <= self.l_init[0] <= self.l_init[1]:
            raise ConfigError(f"l_init must be low,high with 1 <= low <= high, got {self.l_init}")

    @property
    def slate(self) -> int:
        return self.slate_size or (20 if self.recommender == "narm" else 3)

    def schedule(self) -> list[int]:
        """Expected population per generation with the halving rule: K, ceil(K/2), ..."""
        sizes = [self.agents]
        for _ in range(self.merges):
            sizes.append(-(-sizes[-1] // 2))
        return sizes


# ----------------------------------------------------------------------------- the run


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


def run_evolve(
    config: EvolveConfig,
    options: RunOptions | None = None,
    *,
    show_progress: bool = True,
    llm=None,
    stop_after: str | None = None,
) -> dict:
    """Run (or resume) the loop and the evaluation; returns {"final", "phases", "evaluation", "out", ...}.

    `llm` overrides loading `config.llm` in this process (it should carry a response cache for free
    resumes; with --executor ray the workers still load `config.llm` for the cluster units);
    `stop_after` ends the run once that phase is finished (tests use it to cut a run short).
    """
    from ctrlsim.agents import DecisionSettings, MethodContext, ProfileSettings
    from ctrlsim.agents.evolution import EvolutionLoop, EvolutionSettings
    from ctrlsim.backends import load_llm
    from ctrlsim.data import load_dataset
    from ctrlsim.envs import make_task
    from ctrlsim.experiments.runfolder import RunFolder
    from ctrlsim.recommenders import make_recommender

    options = options or RunOptions()
    out = Path(options.out or DEFAULT_OUT)
    dataset = load_dataset(config.dataset)
    target_items = _check_inputs(config, dataset)  # bad inputs fail before any model loads
    started = time.perf_counter()
    with RunFolder(out, config_to_dict(config), overwrite=options.overwrite) as folder:
        if llm is None:
            llm = load_llm(config.llm, cache=folder.file("llm-cache.sqlite"))
        recommender = make_recommender(config.recommender, dataset, mask_shown=True)
        task = make_task("target-discovery", dataset, target=list(config.target))
        decisions = DecisionSettings(
            memory_rounds=config.memory_rounds,
            target_visible=config.target_visible,
            temperature=config.temperature,
        )
        context = MethodContext(
            dataset=dataset,
            recommender=recommender,
            target_tags=tuple(config.target),
            target_items=frozenset(target_items),
            seed=config.seed,
            k_large=config.agents,
            k_small=config.agents,
            rounds=config.eval_rounds,
            slate_size=config.slate,
            decision_settings=decisions,
            profile_settings=ProfileSettings(l_init=tuple(config.l_init)),
            llm_factory=lambda: llm,
            profile_store=folder.file("profiles.sqlite"),
            show_progress=show_progress,
        )
        settings = EvolutionSettings(
            merges=config.merges,
            rounds_per_merge=config.rounds_per_merge,
            k_rule=config.k_rule,
            alpha=config.alpha,
            fusion=config.fusion,
            temperature=config.temperature,
            debate_max_tokens=config.debate_max_tokens,
            merge_max_tokens=config.merge_max_tokens,
            align_min_behaviour=config.align_min_behaviour,
        )
        # Debate and merge go cluster by cluster to the executor's workers; with the local executor
        # every cluster debates and merges together here (one batched call per round), as before.
        fusion = None
        if options.executor != "local" and config.fusion == "debate-merge":
            fusion = ExecutorFusion(config, options, folder, show_progress=show_progress)
        loop = EvolutionLoop(
            folder.path,
            dataset=dataset,
            recommender=recommender,
            task=task,
            llm=llm,
            encoder=config.encoder,
            settings=settings,
            decision_settings=decisions,
            seed=config.seed,
            slate_size=config.slate,
            show_progress=show_progress,
            fuse_elsewhere=fusion,
        )
        try:
            result = loop.run(lambda: context.base_personas(config.agents), stop_after=stop_after)
        finally:
            if fusion is not None:
                fusion.close()
        _record_phases(folder, result.phases)
        if result.stopped_after is not None:
            return {"stopped_after": result.stopped_after, "out": str(out), "phases": result.phases}
        evaluation = None
        if config.eval_rounds > 0:
            if "evaluate" not in folder.store:
                folder.store.add(
                    "evaluate",
                    evaluate_roster(
                        config,
                        result.final,
                        recommender,
                        llm,
                        decisions,
                        target_items,
                        show_progress=show_progress,
                    ),
                )
            evaluation = folder.store.get("evaluate")
        levels = {}
        for name in config.levels:
            key = f"level/{name}"
            if key not in folder.store:
                folder.store.add(key, evaluate_level(config, name, result.final, recommender, llm, decisions))
            levels[name] = folder.store.get(key)
        tables = render_tables(config, result.generations, result.phases, evaluation)
        if levels:
            tables += "\n" + level_tables(levels)
        folder.write_tables(tables)
        if options.figures:
            if levels:
                save_level_figure(folder, levels)
            save_figures(folder, result.generations, evaluation)
    return {
        "final": result.final,
        "generations": result.generations,
        "phases": result.phases,
        "evaluation": evaluation,
        "tables": tables,
        "out": str(out),
        "seconds": round(time.perf_counter() - started, 1),
        "llm": llm.identity,
    }


@dataclass(frozen=True)
class FusionUnitConfig:
    """What a worker needs to debate and merge one cluster: models by spec, the generation's job."""

    llm: str
    dataset: str
    cache: str | None  # the run folder's response cache (absolute), shared by driver and workers
    job: object  # ctrlsim.agents.evolution.cluster_unit.FusionJob


def fuse_cluster_unit(config: FusionUnitConfig, key: str) -> dict:
    """Unit of work: one evolution cluster's debate and merge (key "fusion/g<g>/cluster-<c>").

    The LLM and the dataset are loaded once per worker process. The response cache is SQLite,
    which takes concurrent readers and writers on one machine, so workers that see the run
    folder share the driver's cache file; a worker on a node without it runs uncached (seeded
    replies are the same, only paid again).
    """
    from ctrlsim.agents.evolution.cluster_unit import FusionJob, fuse_cluster
    from ctrlsim.backends import load_llm
    from ctrlsim.data import load_dataset
    from ctrlsim.experiments.executor import worker_cache

    cache = config.cache if config.cache and Path(config.cache).parent.is_dir() else None
    llm = worker_cache(f"llm:{config.llm}|cache:{cache}", lambda: load_llm(config.llm, cache=cache))
    dataset = worker_cache(f"dataset:{config.dataset}", lambda: load_dataset(config.dataset))
    return fuse_cluster(llm, dataset, config.job, FusionJob.cluster_of(key))


class ExecutorFusion:
    """`EvolutionLoop.fuse_elsewhere` on an executor: cluster units run there, the driver stores
    their records (a rerun skips the clusters already stored) and the loop writes the artefacts."""

    def __init__(self, config: EvolveConfig, options: RunOptions, folder, *, show_progress: bool):
        self.config, self.options, self.folder, self.show_progress = config, options, folder, show_progress
        self.cache = str(folder.file("llm-cache.sqlite").resolve())
        self.executor: Executor | None = None

    def __call__(self, job) -> list[dict]:
        from ctrlsim.errors import ExecutorError
        from ctrlsim.experiments.executor import executor_from_options, is_failure

        store, keys = self.folder.store, job.unit_keys()
        todo = [k for k in keys if k not in store]
        failed: dict[str, str] = {}

        def on_record(key: str, record: dict) -> None:
            if is_failure(record):  # not stored: a rerun retries the cluster
                failed[key] = record["error"]
            else:
                store.add(key, record)

        if todo:
            if self.executor is None:
                self.executor = executor_from_options(self.options)
            unit_config = FusionUnitConfig(self.config.llm, self.config.dataset, self.cache, job)
            self.executor.run(fuse_cluster_unit, unit_config, todo, on_record,
                              progress=self.show_progress, desc=f"clusters g{job.generation}")
        if failed:
            raise ExecutorError(
                f"{len(failed)} cluster unit(s) of generation {job.generation} failed (rerun to retry): "
                + "; ".join(f"{k}: {e}" for k, e in failed.items())
            )
        return [store.get(k) for k in keys]

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None


def _record_phases(folder, phases: dict) -> None:
    for name, entry in phases.items():
        key = f"phase/{name}"
        if key not in folder.store:
            folder.store.add(key, {"phase": name, **entry})


def evaluate_roster(
    config: EvolveConfig,
    personas,
    recommender,
    llm,
    decisions,
    target_items: set[str],
    *,
    show_progress: bool = True,
) -> dict:
    """The super probes' t evaluation rounds: Task 1 curves, discoveries per round, popularity (eq. 3)."""
    from ctrlsim.agents import Population, play_population
    from ctrlsim.backends import TokenMeter
    from ctrlsim.envs import PopulationEnv
    from ctrlsim.experiments.ctrlbench_report import round_curves
    from ctrlsim.metrics import controllability as M
    from ctrlsim.seeding import derive_seed

    meter = TokenMeter()
    env = PopulationEnv(
        recommender,
        n_agents=len(personas),
        task="target-discovery",
        target=list(config.target),
        slate_size=config.slate,
        budget=config.eval_rounds,
        token_meter=meter,
    )
    population = Population(tuple(personas), "llm", prompt_variant=config.prompt_variant)
    started, cpu_started = time.perf_counter(), time.process_time()
    trace = play_population(
        env,
        population,
        seed=derive_seed(config.seed, "evaluate"),
        target=config.target,
        llm=llm,
        settings=decisions,
        meter=meter,
    )
    dataset = recommender.dataset
    popularity = dataset.items["popularity"].to_numpy(dtype=float)
    per_round = [[list(dataset.indices(r)) for r in p.likes_per_round] for p in trace.probes]
    return {
        "rounds": config.eval_rounds,
        "probes": len(personas),
        "prompt_variant": config.prompt_variant,
        "curves": round_curves(trace, target_items, config.eval_rounds),
        "new_discoveries": M.new_discoveries_per_round(
            [p.likes_per_round for p in trace.probes], target_items, config.eval_rounds
        ),
        "interaction_popularity": M.interaction_popularity(
            popularity, [i for p in per_round for r in p for i in r]
        ),
        "popularity_per_round": M.popularity_per_round(popularity, per_round, config.eval_rounds),
        "catalogue_popularity": float(popularity.mean()),
        "trace": trace.to_dict(),
        "seconds": round(time.perf_counter() - started, 2),
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "tokens": meter.total.to_dict(),
    }


def evaluate_level(config: EvolveConfig, name: str, personas, recommender, llm, decisions) -> dict:
    """Task 2 (Appendix D.7): the super probes, seeded with a level's history, steer for t rounds.

    Per round: the target similarity cos(V_t, V_target) (Acc.), the old-interest similarity
    cos(V_t, V_old) with V_old the centred centroid of the seed tags' items (Figure 7), and the
    smoothness per interval t0-t3 ... t18-t20 (Table 2); means over the probes.
    """
    import numpy as np

    from ctrlsim.agents import Population, play_population
    from ctrlsim.agents.evolution.levels import get_level, level_persona
    from ctrlsim.backends import TokenMeter
    from ctrlsim.envs import PopulationEnv, make_task
    from ctrlsim.metrics import controllability as M
    from ctrlsim.seeding import derive_rng, derive_seed

    preset = get_level(name)
    dataset = recommender.dataset
    rng = derive_rng(config.seed, "level", name)
    probes = [level_persona(p, dataset, preset, rng) for p in personas]
    task = make_task("profile-shaping", dataset, target=list(preset.target), item_vectors=config.encoder)
    meter = TokenMeter()
    env = PopulationEnv(
        recommender,
        n_agents=len(probes),
        task=task,
        slate_size=config.slate,
        budget=config.eval_rounds,
        token_meter=meter,
    )
    play_population(
        env,
        Population(tuple(probes), "llm", prompt_variant=config.prompt_variant),
        seed=derive_seed(config.seed, "level", name),
        target=preset.target,
        llm=llm,
        settings=decisions,
        meter=meter,
    )
    old_items = sorted({i for tag in preset.interests for i in dataset.items_with_tag(tag)})
    old = M.centred_profile_vector(task.vectors[dataset.indices(old_items)], task.global_mean)
    trajectories = [task.trajectory(env.probes[agent].record) for agent in env.possible_agents[: len(probes)]]

    def mean_curve(curves):
        width = max(len(c) for c in curves)
        return [float(np.mean([c[t] for c in curves if t < len(c)])) for t in range(width)]

    return {
        "level": name,
        "target": list(preset.target),
        "l_init": preset.l_init,
        "probes": len(probes),
        "accuracy": mean_curve([M.similarity_curve(t, task.target_vector) for t in trajectories]),
        "old_interest": mean_curve([M.similarity_curve(t, old) for t in trajectories]),
        "smoothness": mean_curve([M.interval_smoothness(t) for t in trajectories]),
        "intervals": [
            f"t{a}-t{b}"
            for a, b in zip(M.SMOOTHNESS_EDGES[:-1], M.SMOOTHNESS_EDGES[1:])
            if b <= config.eval_rounds
        ],
        "tokens": meter.total.to_dict(),
    }


def level_tables(levels: dict) -> str:
    from tabulate import tabulate

    first = next(iter(levels.values()))
    rows = [[name.capitalize(), *[_fmt(v) for v in rec["smoothness"]]] for name, rec in levels.items()]
    acc = [
        [
            name.capitalize(),
            _fmt(rec["accuracy"][0]),
            _fmt(rec["accuracy"][-1]),
            _fmt(rec["old_interest"][0]),
            _fmt(rec["old_interest"][-1]),
        ]
        for name, rec in levels.items()
    ]
    return (
        "Task 2: trajectory smoothness per interval (Table 2)\n"
        + (
            tabulate(rows, headers=["Level", *first["intervals"]])
            if first["intervals"]
            else "(no interval: Table 2's first interval t0-t3 needs eval-rounds >= 3)"
        )
        + "\n\n"
        + "Task 2: similarity to the target and to the old interest (Figure 7), start and end\n"
        + tabulate(acc, headers=["Level", "Acc. t0", "Acc. end", "Old t0", "Old end"])
        + "\n"
    )


def save_level_figure(folder, levels: dict) -> None:
    from ctrlsim.experiments.runfolder import new_figure

    fig, axes = new_figure((4 * len(levels), 3.2), 1, len(levels), squeeze=False)
    for ax, (name, rec) in zip(axes[0], levels.items()):
        ax.plot(range(len(rec["accuracy"])), rec["accuracy"], label="target")
        ax.plot(range(len(rec["old_interest"])), rec["old_interest"], label="old interest", linestyle="--")
        ax.set_title(name.capitalize())
        ax.set_xlabel("round t")
        ax.set_ylabel("cosine similarity")
        ax.legend()
    folder.save_figure(fig, "task2_levels")


# ----------------------------------------------------------------------------- report


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def render_tables(
    config: EvolveConfig, generations: list[dict], phases: dict, evaluation: dict | None
) -> str:
    from tabulate import tabulate

    parts = [
        f"Evolution: {config.agents} probes, {config.merges} fusion(s) every {config.rounds_per_merge} "
        f"round(s), k rule {config.k_rule}, fusion {config.fusion}, target {', '.join(config.target)}, "
        f"LLM {config.llm}, black box {config.recommender}.\n"
    ]
    rows = [
        [
            g["generation"],
            g["probes"],
            g["k"],
            _fmt(g["silhouette"]),
            max(g["sizes"]),
            sum(s == 1 for s in g["sizes"]),
            g["next_probes"],
            g["invalid_merges"],
        ]
        for g in generations
    ]
    parts.append(
        "Generations\n"
        + tabulate(
            rows,
            headers=[
                "gen",
                "probes",
                "k",
                "silhouette",
                "largest cluster",
                "singletons",
                "next probes",
                "fallbacks",
            ],
        )
        + "\n"
    )
    rows = [
        [
            name,
            _fmt(e.get("seconds"), 1),
            e.get("tokens", {}).get("total_tokens", 0),
            e.get("tokens", {}).get("calls", 0),
        ]
        for name, e in phases.items()
    ]
    total = [
        [
            "total",
            _fmt(sum(e.get("seconds", 0) for e in phases.values()), 1),
            sum(e.get("tokens", {}).get("total_tokens", 0) for e in phases.values()),
            sum(e.get("tokens", {}).get("calls", 0) for e in phases.values()),
        ]
    ]
    parts.append(
        "Cost per phase (wall seconds of the run that finished the phase)\n"
        + tabulate(rows + total, headers=["phase", "seconds", "tokens", "LLM calls"])
        + "\n"
    )
    if evaluation:
        t_all = evaluation["rounds"]
        marks = sorted({t for t in (5, 10, 15, 20, t_all) if t <= t_all})
        curves = evaluation["curves"]
        rows = [
            [
                t,
                _fmt(100 * curves["coverage"][t - 1], 2) if curves["coverage"][t - 1] is not None else "-",
                _fmt(curves["efficiency"][t - 1], 2),
                _fmt(curves["len"][t - 1], 2),
                _fmt(curves["tokens"][t - 1], 0),
                evaluation["new_discoveries"][t - 1],
            ]
            for t in marks
        ]
        parts.append(
            f"Evaluation of the {evaluation['probes']} super probes ({evaluation['prompt_variant']} prompt)\n"
            + tabulate(rows, headers=["t", "Cov. %", "Eff.", "Len.", "Tokens", "new targets at t"])
            + f"\nPopularity of liked items (eq. 3): {_fmt(evaluation['interaction_popularity'], 1)} "
            f"(catalogue mean {_fmt(evaluation['catalogue_popularity'], 1)})\n"
        )
    return "\n".join(parts)


def save_figures(folder, generations: list[dict], evaluation: dict | None) -> None:
    from ctrlsim.experiments.runfolder import new_figure

    fig, ax = new_figure((5, 3.2))
    sizes = [g["probes"] for g in generations] + ([generations[-1]["next_probes"]] if generations else [])
    ax.plot(range(len(sizes)), sizes, marker="o")
    ax.set_xlabel("generation")
    ax.set_ylabel("probes")
    ax.set_title("Population per generation")
    folder.save_figure(fig, "population")
    if not evaluation:
        return
    rounds = list(range(1, evaluation["rounds"] + 1))
    fig, (left, right) = new_figure((9, 3.2), 1, 2)
    left.plot(rounds, [100 * (c or 0) for c in evaluation["curves"]["coverage"]], marker=".")
    left.set_xlabel("round t")
    left.set_ylabel("coverage %")
    left.set_title("Coverage of the super probes")
    right.bar(rounds, evaluation["new_discoveries"])
    right.set_xlabel("round t")
    right.set_ylabel("new target items")
    right.set_title("New discoveries per round (Fig. 8)")
    folder.save_figure(fig, "evaluation")


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    return runner_parser("ctrlsim evolve", __doc__, EvolveConfig)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(EvolveConfig, args)  # validates every value before any model loads
    options = config_from_args(RunOptions, args)
    result = run_evolve(config, options)
    print(result["tables"])
    print(
        f"final roster: {Path(result['out']) / 'final_roster.json'} ({len(result['final'])} super probes); "
        f"{result['seconds']} s this session"
    )
    return 0
