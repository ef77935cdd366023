"""`ProbeEnv`: one probe against one black-box recommender (a `gymnasium.Env`)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders import Recommender

from ._build import DEFAULT_RECOMMENDER, build_engine
from .checks import check_l_init, check_options, check_render_mode, check_reset, check_seed
from .engine import SOURCE_SEARCH, Probe, ProbeSpec, observation_space
from .phases import PhasePlan
from .registration import PlainSpec
from .rendering import supported, text_frame
from .roster import probe_from_user, user_order
from .tasks import Task

ObsType = dict[str, Any]   # {"slate": int64 array, "source": int, "round": int}
ActType = dict[str, Any]   # {"likes": 0/1 per slate position, "query": str}


class ProbeEnv(PlainSpec, gym.Env[ObsType, ActType]):
    """One probe, one black box, a round budget.

    Observation (Dict): `slate` - catalogue indices of the current slate, best
    first, -1 padding a short slate; `source` - 0 recommender, 1 search results;
    `round` - rounds used.
    Action (Dict): `likes` - MultiBinary(slate_size), integers or bools 0/1 (or floats
    exactly 0.0/1.0, as RL libraries send them), 1 = like that position (all zeros = skip);
    `query` - Text of at most 64 characters from `QUERY_CHARSET` (a `QuerySpace`: its
    `sample()` is "" unless search is on, then a catalogue tag name 10% of the time, so a
    sampled episode is mostly recommender rounds); when non-empty the next slate is BM25 search results for it
    instead of recommendations (register-search-click); with `allow_search=False` a
    non-empty query is an `InvalidAction` (Appendix B's evaluation setting: a_t in
    L_t or a skip). Anything else (0.9, "1", an
    unknown key, a character outside the charset) is an `InvalidAction` naming it.
    Liked items are appended to the probe's history in the black box, which then
    builds the next slate. Items already liked never return; with
    `mask_shown=True` (default) items already shown do not either.
    Reward: the task's step reward (new target likes; change in profile
    accuracy; minus slate popularity), for likes on recommender slates only: a
    search-result round earns 0, and the task's metrics count only what the
    recommender surfaced (search likes are reported apart, `search_likes`).
    Episode end: `truncated=True` when the
    round budget (`budget`, 20 unless given) is spent (`terminated` stays False: the budget is
    a time limit).
    Info: the probe's id (`probe`), slate item ids and texts (what an LLM probe
    reads), new likes, the task's per-probe metrics, and, with a `token_meter`, the
    tokens charged to the probe's id since this episode began.
    Negative feedback: with `negative_feedback=True` the action also takes `feedback` (per slate
    position 0 nothing, 1 not interested, 2 dislike) and `block` (0, or a tag index / name), which
    the box sees in every later `UserState` (`ctrlsim.envs.feedback`); without it both keys are
    an `InvalidAction` and nothing changes.
    Phases: with `phases=PhasePlan(...)` (a dict through `gymnasium.make`) the budget is the
    plan's total (a `budget` that differs is a `ConfigError`) and the info also holds `phase`
    (of the round the probe acts in next; the last round's once done), `goal` (the target
    tags in "steer" rounds, [] otherwise) and `direction` (the plan's, "toward" or "away");
    without phases it has none of these keys.
    Seeding: `reset(seed=...)` only; the seed picks the user whose first
    L_init liked items (L_init drawn in `l_init`) seed the history, unless
    `options={"probe": ProbeSpec(...)}` or `options={"user_id": ...}` is given.
    Rendering: "ansi" returns the slate as text, "human" prints it each step, "rgb_array"
    returns an image of that text ((H, W, 3) uint8, H fixed by `slate_size`). Another mode is
    warned about (as `gymnasium.make` does) and `render()` returns None.
    Copies: the env (its black box, caches and search index included) survives `pickle` and
    `copy.deepcopy`; a copy continues the same episode.

    Through `gymnasium.make` the black box and dataset are given by name (strings, so
    the env's spec can be serialised and re-made); the constructor also takes live
    `Recommender` / `Dataset` objects.
    """

    metadata = {"render_modes": ["ansi", "human", "rgb_array"], "render_fps": 4}

    def __init__(self, recommender: Recommender | str = DEFAULT_RECOMMENDER, *,
                 dataset: Dataset | str = "ml-100k", task: Task | str = "target-discovery",
                 target: str | Sequence[str] | Mapping[str, float] | None = None,
                 slate_size: int = 3, budget: int | None = None, l_init: tuple[int, int] = (4, 6),
                 mask_shown: bool = True,
                 recommender_options: Mapping | None = None, task_options: Mapping | None = None,
                 token_meter: TokenMeter | None = None, render_mode: str | None = None,
                 allow_search: bool = True, phases: PhasePlan | Mapping | None = None,
                 negative_feedback: bool = False):
        check_render_mode(render_mode, self.metadata, type(self).__name__)
        self.l_init = check_l_init(l_init)
        self.engine = build_engine(recommender, dataset, task, target, recommender_options, task_options,
                                   mask_shown, slate_size=slate_size, budget=budget, token_meter=token_meter,
                                   allow_search=allow_search, phases=phases,
                                   negative_feedback=negative_feedback)
        self.recommender, self.task = self.engine.recommender, self.engine.task
        self.phases: PhasePlan | None = self.engine.phases
        self.dataset = self.engine.dataset
        self.render_mode = render_mode
        self.observation_space = observation_space(len(self.dataset.items), self.engine.slate_size,
                                                   self.engine.budget)
        self.action_space = self.engine.action_space()
        self._users = user_order(self.dataset)
        self.probe: Probe | None = None

    @property
    def config(self) -> dict:
        config = {"recommender": self.recommender.identity, "task": self.task.config,
                  "slate_size": self.engine.slate_size, "budget": self.engine.budget,
                  "l_init": list(self.l_init)}
        if self.phases is not None:
            config["phases"] = self.phases.to_dict()
        if self.engine.negative_feedback:
            config["negative_feedback"] = True
        return config

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[ObsType, dict]:
        seed = check_seed(seed)
        super().reset(seed=seed)
        options = check_options(options, ("probe", "user_id"))
        spec = options.get("probe")
        if spec is not None and options.get("user_id") is not None:
            raise ConfigError("reset options: give either 'probe' or 'user_id', not both")
        if spec is not None and not isinstance(spec, ProbeSpec):
            raise ConfigError(f"reset option 'probe' must be a ProbeSpec, got {spec!r}")
        if spec is None:
            user = options.get("user_id") or self._users[int(self.np_random.integers(len(self._users)))]
            length = int(self.np_random.integers(self.l_init[0], self.l_init[1] + 1))
            spec = probe_from_user(self.dataset, str(user), length)
        self.probe = self.engine.start([(str(spec.name), spec)])[0]
        return self.engine.observation(self.probe), self.engine.info(self.probe)

    def step(self, action: ActType) -> tuple[ObsType, float, bool, bool, dict]:
        probe = check_reset(self.probe, "step")
        likes, query, feedback = self.engine.validate(action)
        new, reward = self.engine.act(probe, likes, query, feedback)
        self.engine.advance([probe], [query])
        truncated = probe.rounds >= self.engine.budget
        info = self.engine.info(probe, new)
        if self.render_mode == "human":
            self.render()
        return self.engine.observation(probe), float(reward), False, truncated, info

    def render(self) -> str | np.ndarray | None:
        """"ansi": the current slate as text; "human": print it and return None; "rgb_array": an
        (H, W, 3) uint8 image of the text; no mode or an unsupported one: None."""
        if self.render_mode is None:
            gym.logger.warn("ProbeEnv.render() called without a render_mode; "
                            "pass render_mode='ansi', 'human' or 'rgb_array'")
            return None
        if not supported(self):
            return None
        text = self.engine.render_text(self.probe) if self.probe is not None else "(not reset yet)"
        if self.render_mode == "human":
            print(text)
            return None
        if self.render_mode == "rgb_array":
            search = self.probe is not None and self.probe.source == SOURCE_SEARCH
            return text_frame(text, 1 + self.engine.slate_size, search=search)
        return text
