"""Every registered env id with the RL libraries' own adapters, checkers and random rollouts
(issue 49): they see recommender slates, not search results for sampled query strings, because the
registered ids' defaults are the protocols' evaluation setting (search off unless asked).

Stable-Baselines3 has its own file (tests/envs/test_rl_wrappers.py); here: Gymnasium's checker,
wrappers and vector envs, TorchRL's `GymWrapper` with `check_env_specs` and a rollout, and
PettingZoo's parallel-to-AEC conversion with its API test."""
from __future__ import annotations

import ctrlsim.envs  # noqa: F401 - registers the envs
import gymnasium as gym
import pytest
from ctrlsim.envs import PROBE_ENV_IDS
from ctrlsim.envs.wrappers import rl_env


def _kwargs(env_id: str) -> dict:
    target = {"target": "War"} if "TargetDiscovery" in env_id else {}
    return {"recommender": "dial:1", "budget": 6, **target}


@pytest.mark.parametrize("env_id", PROBE_ENV_IDS)
def test_random_rollouts_of_every_registered_id_see_recommender_slates(env_id):
    from gymnasium.utils.env_checker import check_env

    env = gym.make(env_id, **_kwargs(env_id))
    assert env.unwrapped.engine.allow_search is False  # the evaluation setting, by default
    check_env(env.unwrapped, skip_render_check=True)
    env.action_space.seed(0)
    _, info = env.reset(seed=0)
    sources, done = [], False
    while not done:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        sources.append(info["slate_source"])
        done = terminated or truncated
    assert sources and set(sources) == {"recommender"}
    searching = gym.make(env_id, allow_search=True, **_kwargs(env_id))  # still there when asked
    assert searching.unwrapped.engine.allow_search is True


@pytest.mark.parametrize("env_id", PROBE_ENV_IDS)
def test_gymnasium_wrappers_and_vector_envs_run_the_rl_env(env_id):
    env = gym.wrappers.RecordEpisodeStatistics(rl_env(env_id, **_kwargs(env_id)))
    env.reset(seed=1)
    done = False
    while not done:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        done = terminated or truncated
    assert info["episode"]["l"] == 6
    envs = gym.vector.SyncVectorEnv([lambda: rl_env(env_id, **_kwargs(env_id))] * 2)
    obs, _ = envs.reset(seed=[0, 1])
    obs, rewards, *_ = envs.step(envs.action_space.sample())
    assert obs.shape[0] == 2 and rewards.shape == (2,)
    envs.close()


@pytest.mark.parametrize("env_id", PROBE_ENV_IDS)
def test_torchrl_wraps_checks_and_rolls_out_every_id(env_id):
    pytest.importorskip("torchrl")
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import check_env_specs

    env = GymWrapper(rl_env(env_id, **_kwargs(env_id)))
    check_env_specs(env)
    rollout = env.rollout(max_steps=6)
    assert rollout.batch_size[0] == 6
    assert rollout["next", "done"][-1].item()  # the budget ends the episode
    slate_features = env.observation_spec["observation"].shape[-1]
    assert rollout["observation"].shape == (6, slate_features)


def test_pettingzoo_aec_conversion_of_the_population_env_passes_its_api_test(pop_rec):
    from ctrlsim.envs import PopulationEnv
    from pettingzoo.test import api_test
    from pettingzoo.utils.conversions import parallel_to_aec

    aec = parallel_to_aec(PopulationEnv(pop_rec, n_agents=2, target="War", budget=4, allow_search=False))
    api_test(aec, num_cycles=6)
    aec.reset(seed=0)
    for agent in aec.agent_iter():
        _, _, terminated, truncated, info = aec.last()
        action = None if terminated or truncated else aec.action_space(agent).sample()
        if action is not None:
            assert action["query"] == ""  # a sampled action never searches with search off
        aec.step(action)
