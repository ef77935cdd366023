"""Population runs of scripted/random probes with checkpointed metrics (the first main job)."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from ctrlsim.envs import PopulationEnv
from ctrlsim.envs.ceiling import CeilingResult, controllability_ceiling

# Slate sizes of the CtrlBench-Rec reference runs: 20 for NARM, 3 for the others.
PAPER_SLATE_SIZE = {"narm": 20}


@dataclass
class ProbeRunConfig:
    recommender: str = "narm"
    task: str = "target-discovery"
    target: str = "Film-Noir"
    agents: int = 26
    rounds: int = 20
    slate_size: int | None = None
    like_prob: float = 0.3
    seed: int = 0
    checkpoints: tuple[int, ...] = (5, 10, 15, 20)
    ceiling_states_per_probe: int = 300
    dataset: str = "ml-100k"
    recommender_options: dict = field(default_factory=dict)

    def resolved_slate_size(self) -> int:
        return self.slate_size or PAPER_SLATE_SIZE.get(self.recommender, 3)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["checkpoints"] = list(self.checkpoints)
        d["slate_size"] = self.resolved_slate_size()
        return d


def run_population(env: PopulationEnv, policy_for: Callable, *, seed: int, checkpoints: tuple[int, ...],
                   show_progress: bool = True) -> dict[int, dict]:
    """Run one episode; `policy_for(agent, rng)` builds each agent's policy. Returns metrics per checkpoint."""
    obs, infos = env.reset(seed=seed)
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
            except Exception as exc:  # noqa: BLE001 - a failing policy drops its probe, not the run
                actions[agent] = exc
        obs, _, _, _, infos = env.step(actions)
        if t in checkpoints:
            results[t] = env.population_metrics()
            bar.set_postfix({k: f"{v:.3g}" for k, v in results[t].items() if k in ("coverage", "efficiency")})
    return results


def probe_job(config: ProbeRunConfig, *, show_progress: bool = True) -> dict:
    """The `ctrlsim probe` job: random probes (Base) on a black box, plus the ceiling."""
    from ctrlsim.agents import RandomProbe

    started = time.time()
    env = PopulationEnv(config.recommender, n_agents=config.agents, dataset=config.dataset, task=config.task,
                        target=config.target, slate_size=config.resolved_slate_size(), budget=config.rounds,
                        recommender_options=config.recommender_options)
    metrics = run_population(env, lambda agent, rng: RandomProbe(rng, config.like_prob), seed=config.seed,
                             checkpoints=config.checkpoints, show_progress=show_progress)
    ceiling = None
    if getattr(env.task, "target", None):
        roster = [p.spec for p in env.probes.values()]
        bar = tqdm(desc="ceiling (states)", disable=not show_progress, unit="state")

        def tick(total: int) -> None:
            bar.update(total - bar.n)

        ceiling = controllability_ceiling(env.recommender, roster, env.task.target,
                                          slate_size=config.resolved_slate_size(), budget=config.rounds,
                                          max_states_per_probe=config.ceiling_states_per_probe, progress=tick)
        bar.close()
    return {
        "config": config.to_dict(),
        "recommender": env.recommender.identity,
        "task": env.task.config,
        "metrics": {str(t): m for t, m in metrics.items()},
        "failures": env.failures,
        "ceiling": _ceiling_dict(ceiling, config.checkpoints) if ceiling else None,
        "seconds": round(time.time() - started, 2),
    }


def _ceiling_dict(ceiling: CeilingResult, checkpoints) -> dict:
    return {"coverage": ceiling.coverage_ceiling, "at": {str(t): ceiling.ceiling_at(t) for t in checkpoints},
            "states_expanded": ceiling.states_expanded, "exhaustive": ceiling.exhaustive,
            "max_states_per_probe": ceiling.max_states_per_probe,
            "bound": "lower bound (beam search)" if not ceiling.exhaustive else "exact"}


def table1(result: dict) -> str:
    """CtrlBench-Rec Table 1 layout: Coverage (%) and Exploration Efficiency at each checkpoint."""
    from tabulate import tabulate

    cps = result["config"]["checkpoints"]
    met = result["metrics"]

    def fmt(v):
        return "-" if v is None else ("inf" if np.isinf(v) else f"{v:.2f}")

    header = ["Black-Box", "Method"] + [f"Cov% t={t}" for t in cps] + [f"Eff t={t}" for t in cps]
    name = result["config"]["recommender"]
    row = [name, f"Base (random, K={result['config']['agents']})"]
    row += [fmt(100 * met[str(t)]["coverage"]) if str(t) in met else "-" for t in cps]
    row += [fmt(met[str(t)]["efficiency"]) if str(t) in met else "-" for t in cps]
    rows = [row]
    if result.get("ceiling"):
        ceil = result["ceiling"]
        rows.append([name, f"Ceiling ({ceil['bound']})"] + [fmt(100 * ceil["at"][str(t)]) for t in cps]
                    + ["" for _ in cps])
    return tabulate(rows, headers=header)


def save(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float))
    return path
