"""`ctrlsim probe`: a population of random probes (CtrlBench-Rec's Base) against one black box.

Prints Coverage and Exploration Efficiency at the checkpoints in the layout of CtrlBench-Rec's
Table 1, plus the controllability ceiling (the share of the target any probe could reach at
all, see `ctrlsim.envs.ceiling`). Two units of work, each a pure function of (config, key):

  episode   the population episode: metrics at each checkpoint, dropped probes, the roster
  ceiling   the beam-search ceiling from the same roster (rebuilt from the seed)

Both go to the run folder (`config.json`, `records.jsonl`, `tables.md`) as soon as each is
done, so an interrupted or failed run keeps what it finished and a rerun resumes (the default
folder is `results/probe`). Every flag is checked, and the output folder created, before any
model loads. Totals printed (tokens, failures) are read
back from the stored records, so a resumed run reports the whole run, not the last process.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from ctrlsim.envs import PopulationEnv, ProbeSpec
from ctrlsim.envs.registration import check_plain_data
from ctrlsim.envs.tasks import TASKS
from ctrlsim.errors import PROBE_FAILURES, ConfigError
from ctrlsim.experiments.config import (
    MAX_AGENTS,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SLATE,
    MAX_STATES,
    RunOptions,
    bound,
    check_choice,
    check_range,
    config_to_dict,
)
from ctrlsim.experiments.runner import ProgressPayload, Runner, payload_with_progress

# Slate sizes of the CtrlBench-Rec reference runs: 20 for NARM, 3 for the others.
PAPER_SLATE_SIZE = {"narm": 20}
PAPER_CHECKPOINTS = (5, 10, 15, 20)
UNITS = ("episode", "ceiling")


def _check_int(name: str, value, *, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    check_range(name, value, low=low, high=high)


@dataclass(frozen=True)
class ProbeRunConfig:
    """What identifies a `ctrlsim probe` run (validated on construction, before any model loads)."""

    recommender: str = field(default="narm", metadata={
        "help": "black box: narm, sasrec, embedding, bge, twhin-bert, popularity, ... or recbole:<Model>"})
    task: str = field(default="target-discovery", metadata={"help": "controllability task",
                                                            "choices": list(TASKS)})
    target: str = field(default="Film-Noir", metadata={"help": "target tag (a genre on MovieLens)"})
    agents: int = field(default=26, metadata={"help": f"probes in the population (K; {bound(MAX_AGENTS)})"})
    rounds: int = field(default=20, metadata={
        "help": f"interaction rounds per probe (t; {bound(MAX_ROUNDS)})"})
    slate_size: int | None = field(default=None, metadata={"help": "items per slate; none = 20 for narm, "
                                                                   "3 otherwise (the paper's runs; "
                                                                   f"{bound(MAX_SLATE)})"})
    like_prob: float = field(default=0.3, metadata={"help": "chance a random probe likes a slate item"})
    seed: int = field(default=0, metadata={
        "help": f"seed of the episode (roster, probe coins; {bound(MAX_SEED)})"})
    checkpoints: tuple[int, ...] | None = field(default=None, metadata={
        "help": "rounds at which metrics are reported; none = 5,10,15,20 up to --rounds"})
    ceiling_states: int = field(default=300, metadata={"help": "ceiling exploration bound per probe "
                                                               "(states; at least --rounds, "
                                                               f"{bound(MAX_STATES)})"})
    dataset: str = field(default="ml-100k", metadata={"help": "built-in dataset name or path"})
    recommender_options: dict[str, Any] = field(default_factory=dict)  # API only (no flag)

    def __post_init__(self):
        from ctrlsim.recommenders.registry import check_recommender_name

        try:
            check_recommender_name(self.recommender)
        except ConfigError as exc:
            raise ConfigError(f"recommender: {exc}") from None
        check_choice("task", self.task, TASKS)
        if not isinstance(self.target, str) or not self.target.strip():
            raise ConfigError(f"target must be a tag name, got {self.target!r}")
        _check_int("agents", self.agents, low=1, high=MAX_AGENTS)
        _check_int("rounds", self.rounds, low=1, high=MAX_ROUNDS)
        if self.slate_size is not None:
            _check_int("slate_size", self.slate_size, low=1, high=MAX_SLATE)
        check_range("like_prob", self.like_prob, low=0.0, high=1.0)
        _check_int("seed", self.seed, low=0, high=MAX_SEED)
        _check_int("ceiling_states", self.ceiling_states, low=1, high=MAX_STATES)
        if self.ceiling_states < self.rounds:
            raise ConfigError(f"ceiling_states must be at least rounds ({self.rounds}): the ceiling's beam "
                              f"keeps ceiling_states // rounds nodes per round; got {self.ceiling_states}")
        if self.checkpoints is not None:
            if not self.checkpoints:
                raise ConfigError("checkpoints needs at least one round")
            for t in self.checkpoints:
                _check_int("checkpoints", t, low=1)
                if t > self.rounds:
                    raise ConfigError(f"checkpoints: round {t} is beyond --rounds {self.rounds}")
            if list(self.checkpoints) != sorted(set(self.checkpoints)):
                raise ConfigError(f"checkpoints must be increasing and distinct, got {self.checkpoints!r}")
        if not isinstance(self.dataset, str) or not self.dataset:
            raise ConfigError(f"dataset must be a name or path, got {self.dataset!r}")
        if not isinstance(self.recommender_options, dict):
            raise ConfigError(f"recommender_options must be a dict, got {self.recommender_options!r}")
        # Stored in config.json and keyed into the model cache: plain JSON data only.
        check_plain_data(self.recommender_options, "recommender_options")

    @property
    def resolved_slate_size(self) -> int:
        return self.slate_size or PAPER_SLATE_SIZE.get(self.recommender, 3)

    @property
    def resolved_checkpoints(self) -> tuple[int, ...]:
        if self.checkpoints is not None:
            return tuple(self.checkpoints)
        return tuple(t for t in PAPER_CHECKPOINTS if t <= self.rounds) or (self.rounds,)

    def to_dict(self) -> dict:
        """The run's identity, with defaults resolved (stored as the run folder's config)."""
        d = config_to_dict(self)
        d["slate_size"], d["checkpoints"] = self.resolved_slate_size, list(self.resolved_checkpoints)
        return d


# ----------------------------------------------------------------------------- the episode

def run_population(env: PopulationEnv, policy_for: Callable, *, seed: int, checkpoints: tuple[int, ...],
                   show_progress: bool = True, roster: list[ProbeSpec] | None = None) -> dict[int, dict]:
    """Run one episode; `policy_for(agent, rng)` builds each agent's policy. Returns metrics per checkpoint.

    A policy that raises is reported to the env with `env.drop(agent, reason)`: that probe
    ends, the others go on.
    """
    obs, infos = env.reset(seed=seed, options={"roster": roster} if roster is not None else None)
    policies = {a: policy_for(a, env.agent_rngs[a]) for a in env.agents}
    results: dict[int, dict] = {}
    bar = tqdm(range(1, env.engine.budget + 1), desc="rounds", disable=not show_progress)
    for t in bar:
        if not env.agents:
            break
        actions = {}
        for agent in env.agents:
            try:
                actions[agent] = policies[agent].act(obs[agent], infos[agent])
            except PROBE_FAILURES as exc:  # the probe's own failure drops it; anything else fails the unit
                env.drop(agent, f"{type(exc).__name__}: {exc}")
        obs, _, _, _, infos = env.step(actions)
        if t in checkpoints:
            results[t] = env.population_metrics()
            bar.set_postfix({k: f"{v:.3g}" for k, v in results[t].items() if k in ("coverage", "efficiency")})
    return results


def _black_box(config: ProbeRunConfig):
    """The run's black box, built once per process (the episode and the ceiling share it)."""
    from ctrlsim.data import load_dataset
    from ctrlsim.experiments.executor import worker_cache
    from ctrlsim.recommenders import make_recommender

    options = json.dumps(config.recommender_options, sort_keys=True)
    name = f"probe-run:{config.recommender}:{config.dataset}:{options}"
    return worker_cache(name, lambda: make_recommender(config.recommender, load_dataset(config.dataset),
                                                       mask_shown=True, **config.recommender_options))


def _env(config: ProbeRunConfig) -> PopulationEnv:
    return PopulationEnv(_black_box(config), n_agents=config.agents, task=config.task, target=config.target,
                         slate_size=config.resolved_slate_size, budget=config.rounds)


def spec_to_dict(spec: ProbeSpec) -> dict:
    return {"name": spec.name, "history": list(spec.history), "profile": spec.profile,
            "attributes": dict(spec.attributes)}


def run_unit(config: ProbeRunConfig, key: str, *, show_progress: bool = False) -> dict:
    """One unit of work: "episode" or "ceiling" (both pure functions of the config)."""
    from ctrlsim.agents import RandomProbe

    started = time.time()
    env = _env(config)
    if key == "episode":
        metrics = run_population(env, lambda agent, rng: RandomProbe(rng, config.like_prob), seed=config.seed,
                                 checkpoints=config.resolved_checkpoints, show_progress=show_progress)
        records = [p.record for p in env.probes.values()]
        return {"recommender": env.recommender.identity, "task": env.task.config,
                "metrics": {str(t): m for t, m in metrics.items()}, "failures": dict(env.failures),
                "tokens": int(sum(r.tokens for r in records)),
                "likes": int(sum(len(r.likes) for r in records)),
                "roster": [spec_to_dict(p.spec) for p in env.probes.values()],
                "seconds": round(time.time() - started, 2)}
    if key == "ceiling":
        from ctrlsim.envs.ceiling import controllability_ceiling

        target = getattr(env.task, "target", None)
        if not target:
            return {"skipped": f"task {config.task!r} has no target set"}
        env.reset(seed=config.seed)  # the same roster the episode played
        roster = [p.spec for p in env.probes.values()]
        bar = tqdm(desc="ceiling (states)", disable=not show_progress, unit="state")
        ceiling = controllability_ceiling(env.recommender, roster, target,
                                          slate_size=config.resolved_slate_size, budget=config.rounds,
                                          max_states_per_probe=config.ceiling_states,
                                          progress=lambda total: bar.update(total - bar.n))
        bar.close()
        return {"coverage": ceiling.coverage_ceiling,
                "at": {str(t): ceiling.ceiling_at(t) for t in config.resolved_checkpoints},
                "states_expanded": ceiling.states_expanded, "exhaustive": ceiling.exhaustive,
                "max_states_per_probe": ceiling.max_states_per_probe,
                "bound": "exact" if ceiling.exhaustive else "lower bound (beam search)",
                "seconds": round(time.time() - started, 2)}
    raise ConfigError(f"unknown probe-run unit {key!r}; units: {', '.join(UNITS)}")


# ----------------------------------------------------------------------------- checks and tables

def preflight(config: ProbeRunConfig) -> None:
    """What can be checked from the dataset alone, before the black box loads or trains."""
    from ctrlsim.data import load_dataset
    from ctrlsim.envs.roster import user_order

    ds = load_dataset(config.dataset)
    size = len(ds.items_with_tag(config.target))  # an unknown tag raises DataError naming it
    if config.task == "target-discovery" and size == 0:
        raise ConfigError(f"target {config.target!r} has no items in {ds.name}; choose another tag")
    users = len(user_order(ds))
    if config.agents > users:
        raise ConfigError(f"agents: {config.agents} probes need as many users; {ds.name} has {users}")


def format_tables(config: ProbeRunConfig, records: dict[str, dict]) -> str:
    """CtrlBench-Rec Table 1 layout: Coverage (%) and Exploration Efficiency at each checkpoint."""
    from tabulate import tabulate

    cps = config.resolved_checkpoints

    def fmt(v):
        return "-" if v is None else ("inf" if np.isinf(v) else f"{v:.2f}")

    header = ["Black-Box", "Method"] + [f"Cov% t={t}" for t in cps] + [f"Eff t={t}" for t in cps]
    rows = []
    episode, ceiling = records.get("episode"), records.get("ceiling")
    if episode:
        met = episode["metrics"]
        row = [config.recommender, f"Base (random, K={config.agents})"]
        row += [fmt(100 * met[str(t)]["coverage"]) if str(t) in met else "-" for t in cps]
        row += [fmt(met[str(t)]["efficiency"]) if str(t) in met else "-" for t in cps]
        rows.append(row)
    if ceiling and "at" in ceiling:
        rows.append([config.recommender, f"Ceiling ({ceiling['bound']})"]
                    + [fmt(100 * ceiling["at"][str(t)]) for t in cps] + ["" for _ in cps])
    table = tabulate(rows, headers=header, tablefmt="github", disable_numparse=True)
    title = f"## Table 1 layout: {config.recommender}, target {config.target}, task {config.task}"
    lines = [title, "", table, ""]
    if episode:
        lines += [f"- recommender: {json.dumps(episode['recommender'], default=str)}",
                  f"- task: {json.dumps(episode['task'], default=str)}",
                  f"- failed probes: {len(episode['failures'])} of {config.agents}",
                  f"- tokens (from the stored records): {episode['tokens']} (random probes use no LLM)"]
    missing = [u for u in UNITS if u not in records]
    if missing:
        lines.append(f"- not finished yet: {', '.join(missing)} (rerun the same command to resume)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the runner

def _check(ctx) -> None:
    preflight(ctx.config)


def _plan(ctx, finished) -> list[str]:
    return list(UNITS)


def _report(ctx, records) -> str:
    return format_tables(ctx.config, dict(records))


def _figures(ctx, records) -> None:
    """Coverage and efficiency at each checkpoint (the episode), with the ceiling's coverage."""
    from ctrlsim.experiments.runfolder import new_figure

    episode, ceiling = records.get("episode"), records.get("ceiling")
    if not episode:
        return
    cps = [t for t in ctx.config.resolved_checkpoints if str(t) in episode["metrics"]]
    fig, (left, right) = new_figure((9, 3.5), 1, 2)
    left.plot(cps, [100 * episode["metrics"][str(t)]["coverage"] for t in cps], marker="o",
              label=f"Base (random, K={ctx.config.agents})")
    if ceiling and "at" in ceiling:
        left.plot(cps, [100 * ceiling["at"][str(t)] for t in cps], marker="s", linestyle="--",
                  label=f"ceiling ({ceiling['bound']})")
    left.set_xlabel("round t")
    left.set_ylabel("target coverage (%)")
    left.set_title(f"{ctx.config.recommender}, target {ctx.config.target}")
    left.legend()
    effs = [episode["metrics"][str(t)]["efficiency"] for t in cps]
    right.plot(cps, [e if np.isfinite(e) else np.nan for e in effs], marker="o")
    right.set_xlabel("round t")
    right.set_ylabel("exploration efficiency")
    right.set_title("Efficiency (lower is better)")
    ctx.folder.save_figure(fig, "coverage")


def probe_unit(unit: ProgressPayload, key: str) -> dict:
    """The executor's unit: `run_unit` with progress bars when it runs in the driver's process."""
    return run_unit(unit.config, key, show_progress=unit.show_progress)


def _identity(ctx) -> dict:
    return ctx.config.to_dict()


def _from_identity(identity) -> ProbeRunConfig:
    from ctrlsim.experiments.config import config_from_dict

    return config_from_dict(ProbeRunConfig, identity)


RUNNER = Runner(name="probe", config_cls=ProbeRunConfig, description=__doc__, unit_fn=probe_unit,
                plan=_plan, report=_report, figures=_figures, check=_check, payload=payload_with_progress,
                identity=_identity, from_identity=_from_identity, default_out="results/probe")


def run(config: ProbeRunConfig, options: RunOptions, *, show_progress: bool = True) -> tuple[dict, Path]:
    """Run (or resume) the job into its run folder; returns (records by unit, folder).

    Failed units raise `RunFailedError` after the finished ones are stored."""
    from ctrlsim.experiments.driver import RunFailedError, drive

    result = drive(RUNNER, config, options, show_progress=show_progress)
    if result.failed:
        raise RunFailedError(result)
    return result.records_by_key, result.out


def main(argv: list[str] | None = None) -> int:
    from ctrlsim.experiments.commands import runner_main

    return runner_main("probe", argv)


if __name__ == "__main__":
    sys.exit(main())
