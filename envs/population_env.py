"""`PopulationEnv`: K probes against the same black box (a PettingZoo `ParallelEnv`)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import gymnasium
import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset
from ctrlsim.errors import PROBE_FAILURES, ConfigError, InvalidAction, ResetNeededError
from ctrlsim.recommenders import Recommender
from ctrlsim.seeding import rng_child

from ._build import DEFAULT_RECOMMENDER, build_engine
from .checks import check_l_init, check_options, check_positive_int, check_render_mode, check_seed
from .engine import Probe, ProbeSpec, observation_space
from .phases import PhasePlan
from .rendering import supported, text_frame
from .roster import default_roster
from .tasks import Task

AgentID = str
RENDERED_PROBES = 3  # live probes whose slates `render()` shows
ObsType = dict[str, Any]
ActType = dict[str, Any]


class PopulationEnv(ParallelEnv[AgentID, ObsType, ActType]):
    """A population of probes sharing one black box; one batched `recommend` per step.

    Search: `allow_search=False` makes a non-empty query an `InvalidAction` (the probe is
    dropped); with search on, search-result rounds are recorded (`record.sources`) and the
    task's metrics count likes on recommender slates only.

    Agents: `possible_agents` is "probe_0" ... "probe_{n_agents-1}", fixed at construction;
    `n_agents` is the largest roster this env takes. Each `reset` fills the first
    len(roster) slots (`agents`), so a smaller roster leaves the last slots unused; a
    larger one is a `ConfigError`. Observation, action, reward and info per agent are as
    in `ProbeEnv`; `infos[agent]["probe"]` is the probe's stable id (`ProbeSpec.name`),
    which keys its tokens in the `token_meter`, so a probe keeps its tokens across
    roster swaps and a newcomer in a reused slot starts from zero.

    Seeding: `reset(seed=...)` sets `self.np_random` (Gymnasium's seeding); the default
    roster's seed lengths and each agent's generator (`agent_rngs[agent]`, for
    policies) derive from it. Episode end: `truncations[agent]` when its round budget is
    spent (`budget`, 20 unless given).

    Negative feedback: with `negative_feedback=True` the action also takes `feedback` (per slate
    position 0 nothing, 1 not interested, 2 dislike) and `block` (0, or a tag index / name), which
    the box sees in every later `UserState` (`ctrlsim.envs.feedback`); without it both keys are
    an `InvalidAction` and nothing changes.
    Phases: `phases=PhasePlan(baseline, steer, release)` (or its dict) makes a steer-then-release
    episode of `phases.total` rounds (a `budget` that differs is a `ConfigError`). Every info
    then also holds `"phase"`, the phase of the round the probe acts in next ("baseline",
    "steer" or "release"; once the budget is spent, the last round's), and `"goal"`, the target
    tags in "steer" rounds and [] otherwise, and `"direction"`, the plan's ("toward": see more of
    the goal; "away": see less of it). The env only announces the phase: policies follow it (see
    `ctrlsim.agents.population.play_population`). Without phases infos have none of these keys.

    Failures: a policy that fails on its own (a probe failure, `ctrlsim.errors.PROBE_FAILURES`)
    is reported with `env.drop(agent, reason)` before the next `step`; that step takes no
    action from it and returns `terminations[agent]=True` with `infos[agent]["failure"] =
    reason`. A malformed or missing action (`InvalidAction`) or one past the budget
    (`BudgetExceededError`) drops its agent the same way (the reason names the bad value); the
    others go on. `failures` maps every dropped agent to its reason. Any other error raised
    in a step (the black box, the task, the search) propagates: it is not one probe's fault.

    `reset(options={"roster": [ProbeSpec, ...]})` replaces the population (the
    evolution loop swaps clusters for super probes this way); the default roster is
    the dataset's first `n_agents` users with seed histories of L_init in `l_init`
    liked items. `population_metrics()` gives the task's aggregate figures so far.

    Rendering: "ansi" returns a summary and the first three live slates as text, "human" prints
    it each step, "rgb_array" an image of that text ((H, W, 3) uint8, the same H every step);
    another mode is warned about and `render()` returns None. Actions sampled from
    `action_space(agent)` are mostly recommender rounds (see `QuerySpace`). The env, its token
    meter included, survives `pickle` and `copy.deepcopy`; a copy continues the same episode.
    """

    metadata = {"render_modes": ["ansi", "human", "rgb_array"], "render_fps": 4,
                "name": "ctrlsim_population_v0", "is_parallelizable": True}

    def __init__(self, recommender: Recommender | str = DEFAULT_RECOMMENDER, *, n_agents: int = 26,
                 dataset: Dataset | str = "ml-100k", task: Task | str = "target-discovery",
                 target: str | Sequence[str] | Mapping[str, float] | None = None, slate_size: int = 3,
                 budget: int | None = None, l_init: tuple[int, int] = (4, 6), mask_shown: bool = True,
                 recommender_options: Mapping | None = None, task_options: Mapping | None = None,
                 token_meter: TokenMeter | None = None, render_mode: str | None = None,
                 allow_search: bool = True, phases: PhasePlan | Mapping | None = None,
                 negative_feedback: bool = False):
        check_render_mode(render_mode, self.metadata, type(self).__name__)
        self.n_agents = check_positive_int("n_agents", n_agents)
        self.l_init = check_l_init(l_init)
        self.engine = build_engine(recommender, dataset, task, target, recommender_options, task_options,
                                   mask_shown, slate_size=slate_size, budget=budget, token_meter=token_meter,
                                   allow_search=allow_search, phases=phases,
                                   negative_feedback=negative_feedback)
        self.recommender, self.task = self.engine.recommender, self.engine.task
        self.phases: PhasePlan | None = self.engine.phases
        self.dataset = self.engine.dataset
        self.render_mode = render_mode
        self.possible_agents: list[AgentID] = [f"probe_{i}" for i in range(self.n_agents)]
        self.agents: list[AgentID] = []
        self.probes: dict[AgentID, Probe] = {}
        self.failures: dict[AgentID, str] = {}
        self.agent_rngs: dict[AgentID, np.random.Generator] = {}
        self.np_random: np.random.Generator | None = None
        self._pending_drops: dict[AgentID, str] = {}
        self._observation_space = observation_space(len(self.dataset.items), self.engine.slate_size,
                                                    self.engine.budget)
        self._action_space = self.engine.action_space()

    def observation_space(self, agent: AgentID) -> gymnasium.spaces.Dict:
        """The same space object for every agent (PettingZoo expects it not to change)."""
        return self._observation_space

    def action_space(self, agent: AgentID) -> gymnasium.spaces.Dict:
        return self._action_space

    @property
    def config(self) -> dict:
        config = {"recommender": self.recommender.identity, "task": self.task.config,
                  "n_agents": self.n_agents, "slate_size": self.engine.slate_size,
                  "budget": self.engine.budget, "l_init": list(self.l_init)}
        if self.phases is not None:
            config["phases"] = self.phases.to_dict()
        if self.engine.negative_feedback:
            config["negative_feedback"] = True
        return config

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[AgentID, ObsType], dict[AgentID, dict]]:
        seed = check_seed(seed)
        if seed is not None or self.np_random is None:
            self.np_random, _ = seeding.np_random(seed)
        roster: Sequence[ProbeSpec] | None = check_options(options, ("roster",)).get("roster")
        if roster is None:
            roster = default_roster(self.dataset, self.n_agents, self.np_random, self.l_init)
        roster = list(roster)
        if not 1 <= len(roster) <= self.n_agents:
            raise ConfigError(f"a roster must hold 1 to n_agents={self.n_agents} probes (possible_agents is "
                              f"fixed at construction), got {len(roster)}")
        self.agents = self.possible_agents[: len(roster)]
        self.agent_rngs = {a: rng_child(self.np_random, "agent", i) for i, a in enumerate(self.agents)}
        self.failures, self._pending_drops = {}, {}
        self.probes = {p.agent: p for p in self.engine.start(list(zip(self.agents, roster)))}
        observations = {a: self.engine.observation(self.probes[a]) for a in self.agents}
        infos = {a: self.engine.info(self.probes[a]) for a in self.agents}
        return observations, infos

    def drop(self, agent: AgentID, reason: str) -> None:
        """Report that `agent`'s policy failed: the next `step` terminates it with this reason."""
        if agent not in self.agents:
            raise ConfigError(f"cannot drop {agent!r}: not a live agent (live: {self.agents})")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"drop({agent!r}) needs a non-empty reason string, got {reason!r}")
        self._pending_drops[agent] = reason

    def step(self, actions: Mapping[AgentID, ActType]) -> tuple[
            dict[AgentID, ObsType], dict[AgentID, float], dict[AgentID, bool], dict[AgentID, bool],
            dict[AgentID, dict]]:
        if not self.probes:
            raise ResetNeededError("call reset() before step()")
        unknown = sorted(set(actions) - set(self.agents))
        if unknown:
            raise ConfigError(f"actions for agents that are not live: {unknown} (live: {self.agents})")
        rewards, terms, truncs, infos, new_likes, queries, acted = {}, {}, {}, {}, {}, {}, []
        for agent in self.agents:
            if agent in self._pending_drops:
                self.failures[agent] = self._pending_drops[agent]
                rewards[agent] = 0.0
                continue
            try:
                if agent not in actions or actions[agent] is None:
                    raise InvalidAction("no action given (report a failed policy with "
                                        "env.drop(agent, reason))")
                likes, query, feedback = self.engine.validate(actions[agent])
                new_likes[agent], rewards[agent] = self.engine.act(self.probes[agent], likes, query, feedback)
            except PROBE_FAILURES as exc:  # a bad action drops its probe; the population goes on
                self.failures[agent] = f"{type(exc).__name__}: {exc}"
                rewards[agent] = 0.0
                continue
            queries[agent] = query
            acted.append(agent)
        self._pending_drops = {}
        self.engine.advance([self.probes[a] for a in acted], [queries[a] for a in acted])
        observations = {}
        for agent in self.agents:
            probe = self.probes[agent]
            observations[agent] = self.engine.observation(probe)
            infos[agent] = self.engine.info(probe, new_likes.get(agent, ()))
            terms[agent] = agent in self.failures
            truncs[agent] = not terms[agent] and probe.rounds >= self.engine.budget
            if terms[agent]:
                infos[agent]["failure"] = self.failures[agent]
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        if self.render_mode == "human":
            self.render()
        return observations, rewards, terms, truncs, infos

    def population_metrics(self) -> dict[str, float]:
        """The task's aggregate metrics over every probe of this episode (dropped ones included)."""
        for probe in self.probes.values():
            probe.record.tokens = self.engine.episode_tokens(probe).total_tokens
        return self.task.population_metrics([p.record for p in self.probes.values()])

    def render(self) -> str | np.ndarray | None:
        """"ansi": a summary and the first three live slates as text; "human": print it;
        "rgb_array": an image of the text; no mode or an unsupported one: None."""
        if self.render_mode is None:
            gymnasium.logger.warn("PopulationEnv.render() called without a render_mode")
            return None
        if not supported(self):
            return None
        if not self.probes:
            text = "(not reset yet)"
        else:
            metrics = ", ".join(f"{k}={v:.4g}" for k, v in self.population_metrics().items() if v is not None)
            lines = [f"{len(self.agents)}/{len(self.probes)} probes active; {metrics}"]
            text = "\n".join(lines + [self.engine.render_text(self.probes[a])
                                      for a in self.agents[:RENDERED_PROBES]])
        if self.render_mode == "human":
            print(text)
            return None
        if self.render_mode == "rgb_array":
            return text_frame(text, 1 + RENDERED_PROBES * (1 + self.engine.slate_size))
        return text

    def close(self) -> None:
        """Nothing to release: the black box belongs to whoever built it."""
