"""SteerEval as a single-step episode: edit a profile, measure how the ranking moves.

The protocol itself (scenarios, pools, original profiles and rankings, the measurement of an
edit) is `ctrlsim.recommenders.steereval.SteerEvalEngine`; this env is its Gymnasium face: the
spaces, seeding through `reset`, and one `step` that measures the steered profile.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from ctrlsim.errors import ConfigError, DataError, InvalidAction
from ctrlsim.recommenders.steereval import (  # noqa: F401 - the protocol's names, re-exported for env users
    DIRECTIONS,
    MAX_PROFILE_CHARS,
    NON_TAGS,
    PROFILE_CHARSET,
    Scenario,
    SteerEvalEngine,
    build_scenario,
    edit_problems,
    eligible_users,
    oracle_descriptions,
    rank_pool,
    to_observation_text,
)

from .checks import check_options, check_render_mode, check_reset, check_seed
from .registration import PlainSpec
from .rendering import supported, text_frame

# What the env serves from its engine (`env.users`, `env.original_profile(sc)`, ...).
ENGINE_ATTRIBUTES = ("dataset", "tags", "tag_phrases", "items", "users", "pool_size", "history_len", "k",
                     "oracle", "tie_seed", "recommender_options", "config", "llm", "recommender",
                     "tag_phrase", "build", "original_profile", "rank", "original_ranking")


class SteerEvalEnv(PlainSpec, gym.Env[dict, str]):
    """SteerEval steering scenario as a one-step episode.

    Observation (Dict): `profile` - the original profile (Text, ASCII);
    `tag` - index into `env.tags`; `direction` - 0 increase, 1 decrease.
    Action: the steered profile (Text, ASCII, at most 4000 characters); anything the
    action space does not contain raises `InvalidAction`. `to_observation_text`
    turns free LLM text into a valid action.
    Reward: signed ΔAUC_t = AUC_t(steered) - AUC_t(original) for increase, and
    its negation for decrease, so higher is always better steering.
    Episode end: `terminated=True` after the one step.
    Info: auc_before/after, delta_auc, rank_set before/after and the next item's
    relevance, coverage@k and ndcg@k (tag items as relevant) before/after,
    edit_problems (refusal/misreading flags), the scenario and the raw texts.
    Seeding: `reset(seed=...)`; the scenario (user, tag, direction) is drawn
    from `self.np_random` unless `options={"scenario": Scenario}`. Equal scores
    are ranked in a random order drawn from (`tie_seed`, user, tag), the same
    order for the original and the steered profile.
    Options: ranker "llm" | "embedding" | a dial spec "dial:<lambda>[:key=value...]" or
    "dial-profile:<lambda>[...]" (`ctrlsim.recommenders.dial_profile.DialProfileRanker`, a
    reference ranker of known controllability that never loads the LLM and ignores oracle and
    show_tags; a bad spec is a `ConfigError` at construction); llm spec or LLM; encoder; profile_style
    "paragraph" | "sentence"; rating "digits" | "generate"; oracle (item texts
    state the steered tag's relevance); show_tags (item texts list their tags:
    leaks relevance, a named variant only); tag_phrases (tag -> the phrase the
    templates use, e.g. a renamed trigger); items (the catalogue items scenarios
    may use, e.g. those with a description).
    Render: mode "ansi" returns a one-line summary of the current (or just finished)
    scenario, "rgb_array" an image of it; without a mode (or with one it does not support,
    which is warned about at construction), None. Stepping before `reset`, or again after the one step,
    and rendering before the first `reset` raise `ResetNeededError`.
    The LLM loads on first use (construction is cheap).
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 1}

    def __init__(self, *, render_mode: str | None = None, **engine_options: Any):
        check_render_mode(render_mode, self.metadata, type(self).__name__)
        self.engine = SteerEvalEngine(**engine_options)
        self.render_mode = render_mode
        self.observation_space = spaces.Dict({
            "profile": spaces.Text(max_length=MAX_PROFILE_CHARS, min_length=0, charset=PROFILE_CHARSET),
            "tag": spaces.Discrete(len(self.engine.tags)),
            "direction": spaces.Discrete(2),
        })
        self.action_space = spaces.Text(max_length=MAX_PROFILE_CHARS, min_length=0, charset=PROFILE_CHARSET)
        self.scenario: Scenario | None = None  # the current episode's, kept after its step for render
        self._stepped = False

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the env itself lacks; `engine` is set first in __init__.
        if name in ENGINE_ATTRIBUTES and "engine" in self.__dict__:
            return getattr(self.__dict__["engine"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *ENGINE_ATTRIBUTES})

    # -------------------------------------------------------------- episode
    def sample_scenario(self) -> Scenario:
        engine = self.engine
        for _ in range(200):
            user = engine.users[int(self.np_random.integers(len(engine.users)))]
            tag = engine.tags[int(self.np_random.integers(len(engine.tags)))]
            direction = DIRECTIONS[int(self.np_random.integers(2))]
            sc = engine.build(user, tag, direction)
            if sc is not None:
                return sc
        raise DataError(f"no feasible scenario found in 200 draws (pool_size={engine.pool_size}); "
                        "use a smaller pool or tags with more items")

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=check_seed(seed))
        sc = check_options(options, ("scenario",)).get("scenario") or self.sample_scenario()
        if not isinstance(sc, Scenario):
            raise ConfigError(f"options['scenario'] must be a Scenario, got {type(sc).__name__}")
        if sc.tag not in self.engine.tags:
            raise ConfigError(f"scenario tag {sc.tag!r} is not one of this env's tags")
        self.scenario, self._stepped = sc, False
        profile = self.engine.original_profile(sc)
        obs = {"profile": profile, "tag": self.engine.tags.index(sc.tag),
               "direction": DIRECTIONS.index(sc.direction)}
        info = {"scenario": {**asdict(sc), "relevant": sorted(sc.relevant)}, "tag_name": sc.tag,
                "tag_phrase": self.engine.tag_phrase(sc.tag), "tag_kind": sc.tag_kind,
                "direction_name": sc.direction, "original_profile": profile}
        return obs, info

    def step(self, action: str) -> tuple[dict, float, bool, bool, dict]:
        sc = check_reset(self.scenario, "step", ended=self._stepped)
        if not isinstance(action, str):
            raise InvalidAction(f"the action is the steered profile text, got {type(action).__name__}")
        if not self.action_space.contains(action):
            bad = sorted({c for c in action if c not in PROFILE_CHARSET})[:5]
            why = f"{len(action)} characters (max {MAX_PROFILE_CHARS})" if len(action) > MAX_PROFILE_CHARS \
                else f"characters outside the action charset: {bad!r}"
            raise InvalidAction(f"steered profile is not in the action space: {why}; "
                                "to_observation_text() makes free text valid")
        reward, info = self.engine.measure(sc, action)
        self._stepped = True
        obs = {"profile": action, "tag": self.engine.tags.index(sc.tag),
               "direction": DIRECTIONS.index(sc.direction)}
        return obs, reward, True, False, info

    def render(self) -> Any:  # str ("ansi"), an RGB array ("rgb_array") or None
        if not supported(self):
            return None
        sc = check_reset(self.scenario, "render")
        text = f"user {sc.user_id}: {sc.direction} {sc.tag!r} over {len(sc.pool)} items"
        return text_frame(text, 1) if self.render_mode == "rgb_array" else text
