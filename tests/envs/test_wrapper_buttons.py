"""`LikesActions(..., not_interested=True)` / `rl_env(..., not_interested=True)`: a per-position choice
among skip, like and not interested for RL libraries, mapped to the env's likes and feedback; off by
default, so trained policies and their records stay as they were."""

from __future__ import annotations

import warnings

import ctrlsim.envs  # noqa: F401 - registers the envs
import gymnasium as gym
import numpy as np
import pytest
from ctrlsim.envs.wrappers import ItemFeatures, LikesActions, NumericInfo, choice_action, rl_env

from ctrlsim.errors import ConfigError, InvalidAction

sb3 = pytest.importorskip("stable_baselines3")

SMALL = {"recommender": "dial:1", "target": "War", "budget": 5}


def test_the_choice_is_off_by_default_and_needs_an_env_with_negative_feedback():
    assert rl_env(**SMALL).action_space == gym.spaces.MultiBinary(3)
    assert "negative_feedback" not in rl_env(**SMALL).unwrapped.spec.kwargs  # the made env is as before
    on = rl_env(**SMALL, not_interested=True)
    assert on.action_space == gym.spaces.MultiDiscrete([3, 3, 3])
    assert on.unwrapped.engine.negative_feedback
    menu = rl_env(**SMALL, not_interested=True, search_menu="tags")
    assert menu.action_space == gym.spaces.MultiDiscrete([3, 3, 3, 1 + 19])
    with pytest.raises(ConfigError, match="negative_feedback=True"):
        LikesActions(gym.make("ctrlsim/TargetDiscovery-v0", **SMALL), not_interested=True)
    with_feedback = gym.make("ctrlsim/TargetDiscovery-v0", **SMALL, negative_feedback=True)
    with pytest.raises(ConfigError, match="True or False"):
        LikesActions(with_feedback, not_interested=1)


def test_each_choice_maps_to_likes_and_feedback_and_reaches_the_box():
    assert {k: v.tolist() for k, v in choice_action([1, 2, 0]).items()} == {"likes": [1, 0, 0],
                                                                          "feedback": [0, 1, 0]}
    env = rl_env(**SMALL, not_interested=True)
    wrapper = env.env.env  # NumericInfo(ItemFeatures(LikesActions(...)))
    assert isinstance(wrapper, LikesActions)
    action = wrapper.action(np.array([2.0, 1.0, 0.0], dtype=np.float32))  # floats, as SB3 sends them
    assert action["likes"].tolist() == [0, 1, 0] and action["feedback"].tolist() == [1, 0, 0]
    assert action["query"] == ""
    for bad, why in (([3, 0, 0], "0 \\(skip\\), 1 \\(like\\) or 2"), ([0.5, 0, 0], "whole number"),
                     ([1, 0], "3 entries")):
        with pytest.raises(InvalidAction, match=why):
            wrapper.action(bad)
    env.reset(seed=0)
    raw = env.unwrapped
    slate = [str(raw.dataset.item_ids[i]) for i in raw.probe.slate]
    env.step(np.array([2, 1, 2]))
    record = raw.probe.record
    assert record.likes_per_round[-1] == [slate[1]]
    assert record.feedback_per_round[-1] == {"not_interested": [slate[0], slate[2]], "disliked": [],
                                             "block": None}
    assert raw.probe.state(raw.dataset).not_interested == (slate[0], slate[2])


def test_sb3_checks_it_and_a_random_rollout_plays_what_it_sampled():
    from stable_baselines3.common.env_checker import check_env

    env = rl_env(**SMALL, not_interested=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, warn=True)
    assert [str(w.message) for w in caught] == []
    env.action_space.seed(3)
    _, info = env.reset(seed=1)
    raw, done, steps = env.unwrapped, False, 0
    seen = set()
    while not done:
        slate = [str(raw.dataset.item_ids[i]) for i in raw.probe.slate]
        choice = env.action_space.sample()
        _, reward, terminated, truncated, info = env.step(choice)
        done, steps = terminated or truncated, steps + 1
        record = raw.probe.record
        assert record.likes_per_round[-1] == [i for i, c in zip(slate, choice) if c == 1]
        assert record.feedback_per_round[-1]["not_interested"] == [i for i, c in zip(slate, choice) if c == 2]
        assert set(info) >= {"round", "new_likes", "metric/coverage"} and np.isfinite(reward)
        seen |= set(choice.tolist())
    assert steps == SMALL["budget"] and seen == {0, 1, 2}


class Played(gym.Wrapper):
    """Keeps every action dict the wrapped env was given."""

    def __init__(self, env):
        super().__init__(env)
        self.actions: list[dict] = []

    def step(self, action):
        self.actions.append(action)
        return self.env.step(action)


def test_a_short_ppo_learn_presses_the_button():
    played = Played(gym.make("ctrlsim/TargetDiscovery-v0", **SMALL, negative_feedback=True))
    env = NumericInfo(ItemFeatures(LikesActions(played, not_interested=True)))
    model = sb3.PPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.learn(64)
    assert model.num_timesteps == 64 and len(played.actions) >= 64
    likes = np.array([a["likes"] for a in played.actions])
    feedback = np.array([a["feedback"] for a in played.actions])
    assert likes.any() and feedback.any() and not (likes.astype(bool) & (feedback > 0)).any()
    assert set(np.unique(feedback).tolist()) <= {0, 1}
