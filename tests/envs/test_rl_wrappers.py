"""The RL-ready envs (`ctrlsim.envs.wrappers`): Stable-Baselines3's checker, a short PPO `learn()` on
each interactive task, Gymnasium's vector envs in sync and async mode, and the wrappers' values
against ones computed here from the dataset."""

from __future__ import annotations

import math
import warnings

import ctrlsim.envs  # noqa: F401 - registers the envs
import gymnasium as gym
import numpy as np
import pytest
from ctrlsim.envs import PROBE_ENV_IDS
from ctrlsim.envs.wrappers import LikesActions, NumericInfo, SlateFeatures, rl_env

from ctrlsim.errors import ConfigError, InvalidAction

sb3 = pytest.importorskip("stable_baselines3")

SMALL = {"recommender": "dial:1", "target": "War", "budget": 5}


def _kwargs(env_id: str) -> dict:
    return dict(SMALL) if "TargetDiscovery" in env_id else {"recommender": "dial:1", "budget": 5}


@pytest.mark.parametrize("menu", [None, "tags"])
@pytest.mark.parametrize("env_id", PROBE_ENV_IDS)
def test_sb3_check_env_passes_without_warnings(env_id, menu):
    from stable_baselines3.common.env_checker import check_env

    env = rl_env(env_id, search_menu=menu, **_kwargs(env_id))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, warn=True)
    assert [str(w.message) for w in caught] == []
    expected = gym.spaces.MultiDiscrete([2, 2, 2, 1 + 19]) if menu else gym.spaces.MultiBinary(3)
    assert env.action_space == expected


@pytest.mark.parametrize("env_id", PROBE_ENV_IDS)
def test_a_short_ppo_learn_runs_on_every_interactive_env(env_id):
    env = rl_env(env_id, **_kwargs(env_id))
    model = sb3.PPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.learn(64)
    assert model.num_timesteps == 64


def test_float_likes_from_a_policy_are_accepted_exactly_and_others_refused():
    env = rl_env(**SMALL)
    env.reset(seed=0)
    wrapper = env.env.env  # NumericInfo(ItemFeatures(LikesActions(...)))
    assert isinstance(wrapper, LikesActions)
    assert wrapper.action(np.array([1.0, 0.0, 1.0], dtype=np.float32))["likes"].tolist() == [1, 0, 1]
    assert wrapper.action([np.int64(1), np.int8(0), True])["likes"].tolist() == [1, 0, 1]
    with pytest.raises(InvalidAction, match="whole number"):
        wrapper.action(np.array([0.5, 0.0, 1.0]))
    with pytest.raises(InvalidAction, match="3 entries"):
        wrapper.action([1, 0])
    menu = rl_env(search_menu="tags", **SMALL).env.env
    assert menu.action([0, 1, 0, 0])["query"] == ""
    assert menu.action([0, 1, 0, 19])["query"] == menu.search_menu[18]
    with pytest.raises(InvalidAction, match=r"\[0, 19\]"):
        menu.action([0, 1, 0, 20])


def test_a_search_menu_needs_search_on():
    with pytest.raises(ConfigError, match="allow_search=True"):
        LikesActions(gym.make("ctrlsim/TargetDiscovery-v0", allow_search=False, **SMALL), search_menu="tags")


def test_slate_features_match_the_dataset(ml100k):
    features = SlateFeatures(ml100k, slate_size=3, budget=10)
    items = ml100k.items
    slate = np.array([0, 49, -1])
    vector = features.encode({"slate": slate, "source": 1, "round": 4})
    per = 1 + len(ml100k.tags) + 1  # present, tags, popularity
    assert vector.shape == (3 * per + 2,) and vector.dtype == np.float32
    top = items["popularity"].max()
    for position, index in enumerate(slate[:2]):
        block = vector[position * per : (position + 1) * per]
        assert block[0] == 1.0
        tags = {ml100k.tags[n] for n in np.flatnonzero(block[1:-1])}
        assert tags == set(items["tags"].iloc[index])
        assert block[-1] == pytest.approx(math.log1p(items["popularity"].iloc[index]) / math.log1p(top))
    assert not vector[2 * per : 3 * per].any()  # the padded position is all zeros
    assert vector[-2:].tolist() == pytest.approx([1.0, 0.4])  # from search; 4 of 10 rounds used
    assert features.space().contains(vector)


def test_numeric_info_has_the_same_float_keys_every_step():
    env = rl_env(**SMALL)
    _, first = env.reset(seed=0)
    assert all(isinstance(v, float) for v in first.values())
    for _ in range(5):
        _, _, _, _, info = env.step(np.ones(3, dtype=np.int8))
        assert list(info) == list(first)
    assert info["metric/coverage"] > 0  # dial:1 following War likes surfaces War items


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs_of_the_wrapped_env_step_in_sync_with_single_envs(mode):
    def make():
        return rl_env(**SMALL)

    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    envs = cls([make, make])
    try:
        observations, infos = envs.reset(seed=[3, 4])
        singles = [make(), make()]
        expected = [s.reset(seed=seed)[0] for s, seed in zip(singles, (3, 4))]
        np.testing.assert_array_equal(observations, np.stack(expected))
        actions = np.array([[1, 1, 1], [0, 1, 0]], dtype=np.int8)
        for _ in range(4):
            observations, rewards, _, _, infos = envs.step(actions)
            steps = [s.step(a) for s, a in zip(singles, actions)]
            np.testing.assert_array_equal(observations, np.stack([s[0] for s in steps]))
            np.testing.assert_array_equal(rewards, [s[1] for s in steps])
        assert infos["metric/coverage"].dtype == np.float64  # stacked into an array
    finally:
        envs.close()


def test_sb3_vector_envs_train_on_the_wrapped_env():
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    envs = make_vec_env(lambda: rl_env(**SMALL), n_envs=2, seed=0, vec_env_cls=SubprocVecEnv)
    try:
        model = sb3.PPO("MlpPolicy", envs, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu")
        model.learn(32)
        assert model.num_timesteps == 32
    finally:
        envs.close()


def test_numeric_info_keeps_what_it_can_read():
    info = {
        "round": 2,
        "slate_item_ids": ["1", "2"],
        "new_likes": ["1"],
        "slate_source": "search",
        "metrics": {"coverage": 0.25, "name": "x"},
        "tokens": {"total_tokens": 7},
    }
    assert NumericInfo.numeric(info) == {
        "round": 2.0,
        "slate_items": 2.0,
        "new_likes": 1.0,
        "from_search": 1.0,
        "metric/coverage": 0.25,
        "tokens/total_tokens": 7.0,
    }


def test_embedding_features_are_the_encoders_item_vectors(ml100k, minilm):
    features = SlateFeatures(ml100k, slate_size=2, budget=4, tags=False, popularity=False, embedding=minilm)
    vector = features.encode({"slate": np.array([10, -1]), "source": 0, "round": 0})
    expected = minilm.encode([ml100k.items["text"].iloc[10]])[0]
    assert vector.shape == (2 * (1 + expected.size) + 2,)
    np.testing.assert_allclose(vector[1 : 1 + expected.size], expected, atol=1e-6)
    assert features.settings()["embedding"] == "minilm"


def test_a_copied_wrapped_env_continues_the_same_episode():
    import copy
    import pickle

    env = rl_env(**SMALL)
    env.reset(seed=5)
    env.step(np.array([1, 0, 1]))
    twins = [copy.deepcopy(env), pickle.loads(pickle.dumps(env))]
    for action in ([1, 1, 0], [0, 0, 1], [1, 1, 1]):
        steps = [e.step(np.array(action)) for e in (env, *twins)]
        for other in steps[1:]:
            np.testing.assert_array_equal(other[0], steps[0][0])
            assert other[1:] == steps[0][1:]
