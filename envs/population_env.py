"""`PopulationEnv`: K probes against the same black box (a PettingZoo `ParallelEnv`)."""
from __future__ import annotations

import functools
from typing import Mapping, Sequence

import numpy as np
from pettingzoo import ParallelEnv

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset
from ctrlsim.errors import CtrlsimError
from ctrlsim.recommenders import Recommender
from ctrlsim.seeding import rng_child

from ._build import DEFAULT_RECOMMENDER, build_engine
from .engine import ProbeSpec, action_space, observation_space
from .roster import default_roster
from .tasks import Task


class PopulationEnv(ParallelEnv):
    """A population of probes sharing one black box; one batched `recommend` per step.

    Agents are "probe_0" ... "probe_{K-1}". Observation, action, reward and
    info per agent are as in `ProbeEnv`. Each probe has its own round budget
    and its own generator (`agent_rngs[name]`, derived from the reset seed) for
    policies to use. A probe whose action is an exception (its policy failed)
    or malformed is dropped: `terminations[name]=True` and `infos[name]["failure"]`
    holds the reason; the others go on. `reset(options={"roster": [ProbeSpec,
    ...]})` replaces the population (the evolution loop swaps clusters for
    super probes this way); the default roster is the dataset's first K users
    with seed histories of L_init in [4, 6] liked items.
    `population_metrics()` gives the task's aggregate figures so far.
    """

    metadata = {"render_modes": ["ansi"], "name": "ctrlsim_population_v0"}

    def __init__(self, recommender: Recommender | str = DEFAULT_RECOMMENDER, *, n_agents: int = 26,
                 dataset: Dataset | str = "ml-100k", task: Task | str = "target-discovery",
                 target: str | Sequence[str] | Mapping[str, float] | None = None, slate_size: int = 3,
                 budget: int = 20, l_init: tuple[int, int] = (4, 6), mask_shown: bool = True,
                 recommender_options: Mapping | None = None, task_options: Mapping | None = None,
                 token_meter: TokenMeter | None = None, render_mode: str | None = None):
        self.engine = build_engine(recommender, dataset, task, target, recommender_options, task_options,
                                   mask_shown, slate_size=slate_size, budget=budget, token_meter=token_meter)
        self.recommender, self.task, self.dataset = self.engine.recommender, self.engine.task, self.engine.dataset
        self.n_agents, self.l_init, self.render_mode = n_agents, l_init, render_mode
        self.possible_agents = [f"probe_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self.probes: dict = {}
        self.failures: dict[str, str] = {}
        self.agent_rngs: dict[str, np.random.Generator] = {}
        self._np_random = np.random.default_rng()

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return observation_space(len(self.dataset.items), self.engine.slate_size, self.engine.budget)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return action_space(self.engine.slate_size)

    @property
    def config(self) -> dict:
        return {"recommender": self.recommender.identity, "task": self.task.config, "n_agents": self.n_agents,
                "slate_size": self.engine.slate_size, "budget": self.engine.budget, "l_init": list(self.l_init)}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None or not hasattr(self, "_seeded"):
            self._np_random = np.random.default_rng(seed)
            self._seeded = True
        roster: list[ProbeSpec] | None = (options or {}).get("roster")
        if roster is None:
            roster = default_roster(self.dataset, self.n_agents, self._np_random, self.l_init)
        self.possible_agents = [f"probe_{i}" for i in range(len(roster))]
        self.agents = list(self.possible_agents)
        self.agent_rngs = {a: rng_child(self._np_random, "agent", i) for i, a in enumerate(self.agents)}
        self.failures = {}
        self.probes = {p.key: p for p in self.engine.start(list(zip(self.agents, roster)))}
        observations = {a: self.engine.observation(self.probes[a]) for a in self.agents}
        infos = {a: self.engine.info(self.probes[a]) for a in self.agents}
        return observations, infos

    def step(self, actions: Mapping[str, object]):
        rewards, terms, truncs, infos, new_likes, queries, acted = {}, {}, {}, {}, {}, {}, []
        for agent in self.agents:
            action = actions.get(agent)
            try:
                if isinstance(action, BaseException):
                    raise action
                if action is None:
                    raise CtrlsimError("no action given")
                likes, query = self.engine.validate(action)
                new_likes[agent], rewards[agent] = self.engine.act(self.probes[agent], likes, query)
                queries[agent] = query
                acted.append(agent)
            except Exception as exc:  # noqa: BLE001 - a failing probe is recorded and dropped, never fatal
                self.failures[agent] = f"{type(exc).__name__}: {exc}"
                rewards[agent], terms[agent], truncs[agent] = 0.0, True, False
        self.engine.advance([self.probes[a] for a in acted], [queries[a] for a in acted])
        observations = {}
        for agent in self.agents:
            probe = self.probes[agent]
            observations[agent] = self.engine.observation(probe)
            infos[agent] = self.engine.info(probe, new_likes.get(agent, ()))
            if agent in self.failures:
                infos[agent]["failure"] = self.failures[agent]
            else:
                terms[agent] = False
                truncs[agent] = probe.rounds >= self.engine.budget
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return observations, rewards, terms, truncs, infos

    def population_metrics(self) -> dict[str, float]:
        """The task's aggregate metrics over every probe of this episode (dropped ones included)."""
        if self.engine.token_meter is not None:
            for key, probe in self.probes.items():
                probe.record.tokens = self.engine.token_meter.usage(key).total_tokens
        return self.task.population_metrics([p.record for p in self.probes.values()])

    def render(self):
        lines = [f"{len(self.agents)}/{len(self.possible_agents)} probes active; "
                 + ", ".join(f"{k}={v:.4g}" for k, v in self.population_metrics().items())]
        lines += [self.engine.render_text(self.probes[a]) for a in self.agents[:3]]
        return "\n".join(lines)

    def close(self):
        pass
