"""PromptShiftEnv: Gymnasium API compliance and behaviour with the smallest bundled LLM."""
import gymnasium as gym
import numpy as np
import pytest

from ctrlsim.agents.rerankers import make_reranker
from ctrlsim.envs.promptshift_env import EMPTY, UNMATCHED, PromptShiftData, PromptShiftEnv
from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import slice_shift
from ctrlsim.metrics.ranking import drift
from ctrlsim.recommenders.llm_lists import HISTORY_ONLY

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def ps_data(ml100k):
    return PromptShiftData.build(ml100k)


@pytest.fixture(scope="module")
def ps_env(smol, ps_data):
    # Small pool (N = 6, K = 4), short replies and one user keep the smallest LLM fast.
    return PromptShiftEnv(smol, data=ps_data, n_candidates=6, k=4, users=ps_data.eligible[:1], max_tokens=80)


def test_data_follows_the_protocol(ps_data, ml100k):
    assert len(ps_data.eligible) == 527  # >= 25 fit positives and >= 1 test positive (ratings >= 4)
    user = ps_data.eligible[0]
    assert len(ps_data.fit_positives[user]) >= 25 and ps_data.positives(user)
    hist = ps_data.history(user)
    assert hist == ps_data.fit_positives[user][-25:]  # last 25 fit positives, oldest first
    assert set(ps_data.slice_names) >= {"gender_F", "age_older", "cross_M_young_adult"}
    assert all(0 < v < 1 for v in ps_data.scenario_means.values())
    assert not ps_data.positives(user) & set(ps_data.fit_positives[user])


def test_construction_is_lazy(ps_data):
    env = PromptShiftEnv(data=ps_data)  # default LLM: qwen2.5-1.5b, never loaded here
    assert not env.llm_loaded and env.episode is None
    assert env.action_space.shape == (30,) and env.observation_space["candidates"].shape == (30,)
    with pytest.raises(ConfigError):
        PromptShiftEnv(data=ps_data, k=40)


def test_entry_point_makes_the_env(ps_data):
    # The entry point the registration uses ("ctrlsim/PromptShift-v0"), under a test-only id.
    env_id = "ctrlsim-test/PromptShift-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point="ctrlsim.envs.promptshift_env:PromptShiftEnv")
    env = gym.make(env_id, data=ps_data, n_candidates=10, k=5)
    assert isinstance(env.unwrapped, PromptShiftEnv) and not env.unwrapped.llm_loaded
    assert env.action_space.shape == (10,)


# check_env runs for every registered env in tests/envs/test_api_compliance.py


def test_episode_behaviour(ps_env, ps_data):
    user = ps_data.eligible[0]
    meter = ps_env.llm.meter
    obs, info = ps_env.reset(seed=3, options={"user_id": user, "scenario": "gender"})
    ep = ps_env.episode
    # The observation is the cue list, matched to the catalogue, in LLM order.
    n = len(ep.cue.item_ids)
    assert 1 <= n <= 6 and info["cue_item_ids"] == ep.cue.item_ids
    expected = [ps_env.dataset.item_index[i] if i is not None else UNMATCHED for i in ep.cue.item_ids]
    assert obs["candidates"][:n].tolist() == expected and np.all(obs["candidates"][n:] == EMPTY)
    assert obs["ranks"][:n].tolist() == list(range(1, n + 1))
    assert ps_env.slice_names[obs["slice"]] == info["slice_id"] == ps_data.slice_of(user, "gender")
    assert obs["history"].tolist() == ps_env.dataset.indices(ps_data.history(user)).tolist()
    # The model read the prompt: its lists name real catalogue movies.
    assert info["cue_titles"] and ep.reference.titles
    assert sum(i is not None for i in ep.reference.item_ids) >= 1

    # Lists are cached per (user, condition): another episode of the same pair calls no LLM;
    # another scenario for the same user generates only its cue list.
    calls = meter.total.calls
    ps_env.reset(options={"user_id": user, "scenario": "gender"})
    assert meter.total.calls == calls
    ps_env.reset(options={"user_id": user, "scenario": "age"})
    assert meter.total.calls - calls <= 1
    assert ps_env.cached_list(user, HISTORY_ONLY) is ep.reference

    # B0 keeps the LLM order: its metrics are the cue list's, computed from the slice table.
    obs, info = ps_env.reset(options={"user_id": user, "scenario": "gender"})
    b0 = make_reranker("B0", ps_env.slice_table, slice_names=ps_env.slice_names)
    _, reward, terminated, truncated, step_info = ps_env.step(b0(obs))
    assert terminated is True and truncated is False
    assert step_info["reranked_item_ids"] == ep.cue.item_ids[:4]
    assert step_info["drift"] == pytest.approx(step_info["cue_drift"])
    assert step_info["drift"] == pytest.approx(drift(ep.reference.keys[:4], ep.cue.keys[:4]))
    ss = slice_shift(ps_env.slice_table, ep.cue.item_ids[:4], ep.reference.item_ids[:4], info["slice_id"])
    assert step_info["slice_shift"] == pytest.approx(ss) and reward == pytest.approx(-abs(ss))
    assert len(step_info["paraphrase_drifts"]) == 3 and all(0 <= d <= 1 for d in step_info["paraphrase_drifts"])
    assert step_info["delta_d"] == pytest.approx(step_info["cue_drift"] - step_info["paraphrase_drift"])
    for key in ("difficulty@4", "hit_rate@4", "mrr@4", "ndcg@4"):
        assert step_info[key] >= 0
    assert set(step_info["matches"]) == {"cue:" + info["slice_id"], "history", "p1", "p2", "p3"}
    assert step_info["tokens"]["lists"]["completion_tokens"] > 0 and step_info["tokens"]["episode"]["calls"] == 0
    with pytest.raises(RuntimeError):
        ps_env.step(b0(obs))  # single-step episodes

    # Reversing the order changes the reranked list accordingly.
    if n >= 2:
        ps_env.reset(options={"user_id": user, "scenario": "gender"})
        action = np.linspace(-1, 1, 6).astype(np.float32)  # last slot best
        _, _, _, _, rev = ps_env.step(action)
        assert rev["reranked_item_ids"] == list(reversed(ep.cue.item_ids))[:4]


def test_reset_validates_options(ps_env, ps_data):
    with pytest.raises(ConfigError):
        ps_env.reset(options={"user_id": ps_data.eligible[0], "scenario": "occupation"})
    with pytest.raises(ConfigError):
        ps_env.reset(options={"user_id": "no-such-user", "scenario": "gender"})
