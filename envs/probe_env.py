"""`ProbeEnv`: one probe against one black-box recommender (a `gymnasium.Env`)."""
from __future__ import annotations

from typing import Mapping, Sequence

import gymnasium as gym

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset
from ctrlsim.recommenders import Recommender

from ._build import DEFAULT_RECOMMENDER, build_engine
from .engine import action_space, observation_space
from .roster import probe_from_user, user_order
from .tasks import Task


class ProbeEnv(gym.Env):
    """One probe, one black box, a round budget.

    Observation (Dict): `slate` - catalogue indices of the current slate, best
    first, -1 padding a short slate; `source` - 0 recommender, 1 search results;
    `round` - rounds used.
    Action (Dict): `likes` - MultiBinary(slate_size), 1 = like that position (all
    zeros = skip); `query` - Text; when non-empty the next slate is BM25 search
    results for it instead of recommendations (register-search-click).
    Liked items are appended to the probe's history in the black box, which then
    builds the next slate. Items already liked never return; with
    `mask_shown=True` (default) items already shown do not either.
    Reward: the task's step reward (new target likes; change in profile
    accuracy; minus slate popularity). Episode end: `truncated=True` when the
    round budget is spent (`terminated` stays False: the budget is a time limit).
    Info: slate item ids and texts (what an LLM probe reads), new likes, the
    task's per-probe metrics, and the probe's token usage when a `token_meter`
    is given (charged under key `probe_key`).
    Seeding: `reset(seed=...)` only; the seed picks the user whose first
    L_init liked items (L_init drawn in `l_init`) seed the history, unless
    `options={"probe": ProbeSpec(...)}` or `options={"user_id": ...}` is given.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(self, recommender: Recommender | str = DEFAULT_RECOMMENDER, *, dataset: Dataset | str = "ml-100k",
                 task: Task | str = "target-discovery", target: str | Sequence[str] | Mapping[str, float] | None = None,
                 slate_size: int = 3, budget: int = 20, l_init: tuple[int, int] = (4, 6), mask_shown: bool = True,
                 recommender_options: Mapping | None = None, task_options: Mapping | None = None,
                 token_meter: TokenMeter | None = None, probe_key: str = "probe_0", render_mode: str | None = None):
        self.engine = build_engine(recommender, dataset, task, target, recommender_options, task_options,
                                   mask_shown, slate_size=slate_size, budget=budget, token_meter=token_meter)
        self.recommender, self.task, self.dataset = self.engine.recommender, self.engine.task, self.engine.dataset
        self.l_init, self.probe_key, self.render_mode = l_init, probe_key, render_mode
        self.observation_space = observation_space(len(self.dataset.items), slate_size, budget)
        self.action_space = action_space(slate_size)
        self._users = user_order(self.dataset)
        self.probe = None

    @property
    def config(self) -> dict:
        return {"recommender": self.recommender.identity, "task": self.task.config,
                "slate_size": self.engine.slate_size, "budget": self.engine.budget, "l_init": list(self.l_init)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        spec = options.get("probe")
        if spec is None:
            user = options.get("user_id") or self._users[int(self.np_random.integers(len(self._users)))]
            length = int(self.np_random.integers(self.l_init[0], self.l_init[1] + 1))
            spec = probe_from_user(self.dataset, str(user), length)
        self.probe = self.engine.start([(self.probe_key, spec)])[0]
        return self.engine.observation(self.probe), self.engine.info(self.probe)

    def step(self, action):
        if self.probe is None:
            raise RuntimeError("call reset() before step()")
        likes, query = self.engine.validate(action)
        new, reward = self.engine.act(self.probe, likes, query)
        self.engine.advance([self.probe], [query])
        truncated = self.probe.rounds >= self.engine.budget
        info = self.engine.info(self.probe, new)
        if self.render_mode == "human":
            print(self.render())
        return self.engine.observation(self.probe), float(reward), False, truncated, info

    def render(self):
        if self.probe is None:
            return ""
        text = self.engine.render_text(self.probe)
        if self.render_mode == "human":
            print(text)
            return None
        return text
