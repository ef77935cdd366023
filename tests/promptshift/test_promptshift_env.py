"""PromptShiftEnv: the Gymnasium contract, hand-computed metrics on stored lists, and a real-LLM episode."""
import gymnasium as gym
import numpy as np
import pytest
from ctrlsim.envs.promptshift_env import ENGINE_ATTRIBUTES, PromptShiftEnv

from ctrlsim.errors import ConfigError, ResetNeededError
from ctrlsim.metrics.promptshift import EMPTY_SLOT, UNMATCHED_SLOT
from ctrlsim.recommenders.promptshift.data import PromptShiftData
from ctrlsim.recommenders.promptshift.generation import HISTORY_ONLY
from ctrlsim.recommenders.promptshift.rerankers import make_reranker

LOG2_3 = np.log2(3)


@pytest.fixture
def hand_env(hand_data, u1_lists):
    """N = 4, K = 3, p = 1/2; u1's lists preloaded, so no LLM ever loads."""
    env = PromptShiftEnv(data=hand_data, n_candidates=4, k=3, p=0.5, render_mode="ansi")
    for gen in u1_lists:
        env.engine.preload("u1", gen)
    return env


def test_observation_and_reset_info_by_hand(hand_env):
    obs, info = hand_env.reset(seed=0, options={"user_id": "u1", "scenario": "gender"})
    assert not hand_env.llm_loaded
    # Cue list i2, i5, (unmatched), i6 -> catalogue rows 1, 4, -1, 5.
    assert obs["candidates"].tolist() == [1, 4, UNMATCHED_SLOT, 5]
    assert obs["ranks"].tolist() == [1, 2, 3, 4]
    assert obs["history"].tolist() == [2, 3]  # H_u1 = i3, i4
    assert hand_env.slice_names[obs["slice"]] == "gender_F" == info["slice_id"]
    # phi(i3, F) = 1/30 + 29/30 * 0.5 = 31/60, phi(i4, F) = 1 -> phi_bar_u1 = 91/120.
    assert info["mainstreamness"] == pytest.approx(91 / 120)
    # phi_bar_s averages over the env's users: u2's H = i5, i6 in M: 31/60 each -> (91/120 + 62/120) / 2.
    assert info["scenario_mainstreamness"] == pytest.approx(153 / 240)
    assert hand_env.observation_space.contains(obs)


def test_scenario_mean_is_over_the_given_users(hand_data):
    env = PromptShiftEnv(data=hand_data, users=["u1"])
    assert env.slice_means["gender_F"] == pytest.approx(91 / 120)


def test_b0_step_by_hand(hand_env):
    obs, _ = hand_env.reset(options={"user_id": "u1", "scenario": "gender"})
    b0 = make_reranker("B0", hand_env.slice_table, slice_names=hand_env.slice_names)
    _, reward, terminated, truncated, info = hand_env.step(b0(obs))
    assert terminated is True and truncated is False
    assert info["reranked_item_ids"] == ["i2", "i5", None]
    # RBO_{1/2}(i5 i6 i2, i2 i5 ?): X = 0, 1, 2 -> 1/2 * 1/4 + 2/3 * 1/8 + 2/3 * 1/8 = 7/24.
    assert info["drift"] == pytest.approx(17 / 24) and info["cue_drift"] == pytest.approx(17 / 24)
    # mean dphi: cue (1/60 - 1/60 + 0) / 3 = 0; L^0 (-1/60 - 1/60 + 1/60) / 3 = -1/180.
    assert info["slice_shift"] == pytest.approx(1 / 180) and reward == pytest.approx(-1 / 180)
    # T^C = {i5}, hit at rank 2: phi(i5, F) = 29/60, w = 10 * 31/60 * (1 + 0.2 * 2/3) = 527/90.
    assert info["difficulty@3"] == pytest.approx(527 / 90)
    assert info["hit_rate@3"] == 1.0 and info["mrr@3"] == pytest.approx(0.5)
    assert info["ndcg@3"] == pytest.approx(1 / LOG2_3)
    # Paraphrases: P1 = L^0 (drift 0), P2 disjoint (1), P3 i6 i5 i2 (RBO 1/4 + 1/8 + 1/8 = 1/2).
    assert info["paraphrase_drifts"] == pytest.approx([0.0, 1.0, 0.5])
    assert info["paraphrase_drift"] == pytest.approx(0.5) and info["delta_d"] == pytest.approx(5 / 24)
    assert info["matches"]["cue:gender_F"]["unmatched"] == 1 and info["tokens"]["episode"]["calls"] == 0
    with pytest.raises(ResetNeededError, match="episode has ended"):
        hand_env.step(b0(obs))  # single-step episodes


def test_reordering_action_by_hand(hand_env):
    hand_env.reset(options={"user_id": "u1", "scenario": "gender"})
    _, reward, _, _, info = hand_env.step(np.array([0.0, 0.5, -1.0, 1.0], dtype=np.float32))
    # Slots by score: 3 (i6), 1 (i5), 0 (i2): the same list as P3.
    assert info["reranked_item_ids"] == ["i6", "i5", "i2"]
    assert info["drift"] == pytest.approx(0.5) and info["slice_shift"] == pytest.approx(0.0) and reward == 0.0
    assert info["mrr@3"] == pytest.approx(0.5)


def test_actions_and_options_are_checked(hand_env):
    hand_env.reset(options={"user_id": "u1", "scenario": "gender"})
    with pytest.raises(ConfigError):
        hand_env.step(np.zeros(3, dtype=np.float32))
    with pytest.raises(ConfigError):
        hand_env.step(np.array(["a", "b", "c", "d"]))
    with pytest.raises(ConfigError):
        hand_env.reset(options={"user_id": "u1", "scenario": "age"})
    with pytest.raises(ConfigError):
        hand_env.reset(options={"user_id": "no-such-user", "scenario": "gender"})


def test_render_modes(hand_data, hand_env):
    assert PromptShiftEnv(data=hand_data).render() is None  # no render mode: nothing
    with pytest.raises(ResetNeededError, match="not been reset"):
        hand_env.render()
    hand_env.reset(options={"user_id": "u1", "scenario": "gender"})
    cue_list = ["user u1 | gender: gender_F", " 1. Bravo (1991)  [i2]", " 2. Echo (1994)  [i5]",
                " 3. Unknown Film (2001)  [unmatched]", " 4. Foxtrot (1995)  [i6]"]
    assert hand_env.render().splitlines() == cue_list
    hand_env.step(np.zeros(4, dtype=np.float32))
    assert hand_env.render().splitlines() == cue_list  # the finished episode still renders
    with pytest.warns(UserWarning, match=r"render_mode='human'.*\['ansi', 'rgb_array'\]"):
        unsupported = PromptShiftEnv(data=hand_data, render_mode="human")  # as gymnasium.make does
    assert unsupported.render() is None
    with pytest.raises(ConfigError, match="render_mode"):
        PromptShiftEnv(data=hand_data, render_mode=5)


def test_rgb_array_draws_the_cue_list(hand_data, u1_lists):
    env = PromptShiftEnv(data=hand_data, n_candidates=4, k=3, p=0.5, render_mode="rgb_array")
    for gen in u1_lists:
        env.engine.preload("u1", gen)
    env.reset(options={"user_id": "u1", "scenario": "gender"})
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) >= 5  # text drawn, not a blank frame


def test_step_before_reset_is_a_reset_needed_error(hand_env):
    with pytest.raises(ResetNeededError, match="not been reset"):
        hand_env.step(np.zeros(4, dtype=np.float32))
    assert hand_env.episode is None


def test_engine_attributes_read_through_the_env(hand_data):
    env = PromptShiftEnv(data=hand_data, n_candidates=4, k=3, users=["u1"])
    assert (env.k, env.n_candidates, env.users) == (3, 4, ["u1"])
    assert env.data is hand_data and env.slice_table is hand_data.table
    assert env.slice_names == hand_data.slice_names and "gender_F" in env.slice_names
    assert env.slice_means["gender_F"] == pytest.approx(91 / 120)  # u1 only, as computed above
    assert env.llm_loaded is False and env.token_meter is None
    assert set(ENGINE_ATTRIBUTES) <= set(dir(env))
    with pytest.raises(AttributeError, match="no_such_thing"):
        env.no_such_thing  # noqa: B018
    with pytest.raises(AttributeError):
        env.generator  # noqa: B018 - an engine attribute that is not on the list stays the engine's


def test_bad_arguments_are_named(hand_data):
    with pytest.raises(ConfigError, match="^llm must be"):
        PromptShiftEnv(llm=42, data=hand_data)
    with pytest.raises(ConfigError, match="n_candidates"):
        PromptShiftEnv(data=hand_data, n_candidates=0)
    with pytest.raises(ConfigError, match="seed"):
        PromptShiftEnv(data=hand_data).reset(seed=-1)


def test_a_duck_typed_llm_is_kept_by_the_engine(hand_data):
    class Scripted:
        def chat(self, conversations, **kwargs):
            raise AssertionError("not called here")

    llm = Scripted()
    env = PromptShiftEnv(llm, data=hand_data)
    assert env.llm is llm and env.llm_loaded


def test_construction_is_lazy_and_checked(hand_data):
    env = PromptShiftEnv(data=hand_data)  # default LLM: qwen2.5-1.5b, never loaded here
    assert not env.llm_loaded and env.episode is None
    assert env.action_space.shape == (30,) and env.observation_space["candidates"].shape == (30,)
    assert env.observation_space["candidates"].low.min() == EMPTY_SLOT
    with pytest.raises(ConfigError):
        PromptShiftEnv(data=hand_data, k=40)
    with pytest.raises(ConfigError):
        PromptShiftEnv(data=hand_data, users=["u3"])


def test_entry_point_makes_the_env(hand_data):
    # The entry point the registration uses ("ctrlsim/PromptShift-v0"), under a test-only id.
    env_id = "ctrlsim-test/PromptShift-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point="ctrlsim.envs.promptshift_env:PromptShiftEnv")
    env = gym.make(env_id, data=hand_data, n_candidates=10, k=5)
    assert isinstance(env.unwrapped, PromptShiftEnv) and not env.unwrapped.llm_loaded
    assert env.action_space.shape == (10,)


# check_env runs for every registered env in tests/envs/test_api_compliance.py


def test_data_follows_the_protocol(ml100k):
    data = PromptShiftData.build(ml100k)
    assert len(data.eligible) == 527  # >= 25 fit positives and >= 1 test positive (ratings >= 4)
    user = data.eligible[0]
    profile = data.user(user)
    assert len(data.fit_positives[user]) >= 25 and profile.positives()
    assert list(profile.history) == data.fit_positives[user][-25:]  # last 25 fit positives, oldest first
    assert set(data.slice_names) >= {"gender_F", "age_older", "cross_M_young_adult"}
    assert set(profile.slices) == set(data.scenarios) and profile.slice_of("gender") in data.slice_names
    assert not profile.positives() & set(data.fit_positives[user])


@pytest.mark.llm
def test_real_llm_episode(smol, ml100k):
    # Small pool (N = 6, K = 4), a 5-item history, short replies and one user keep the smallest LLM fast.
    data = PromptShiftData.build(ml100k, history_len=5)
    user = data.eligible[0]
    env = PromptShiftEnv(smol, data=data, n_candidates=6, k=4, users=[user], max_tokens=56)
    meter = env.llm.meter
    obs, info = env.reset(seed=3, options={"user_id": user, "scenario": "gender"})
    ep = env.episode
    n = len(ep.cue.item_ids)
    assert 1 <= n <= 6 and np.all(obs["candidates"][n:] == EMPTY_SLOT)
    # The model read the prompt: its lists name real catalogue movies.
    assert info["cue_titles"] and sum(i is not None for i in ep.reference.item_ids) >= 1
    # Lists are cached per (user, condition): the same pair calls no LLM; another scenario
    # generates only its cue list.
    calls = meter.total.calls
    env.reset(options={"user_id": user, "scenario": "gender"})
    assert meter.total.calls == calls
    env.reset(options={"user_id": user, "scenario": "age"})
    assert meter.total.calls - calls == 1
    assert env.engine.cached_list(user, HISTORY_ONLY) is ep.reference
    env.reset(options={"user_id": user, "scenario": "gender"})
    _, _, _, _, step_info = env.step(np.linspace(1, -1, 6).astype(np.float32))  # keep the LLM order
    assert step_info["reranked_item_ids"] == ep.cue.item_ids[:4]
    assert step_info["drift"] == pytest.approx(step_info["cue_drift"])
    assert step_info["tokens"]["lists"]["completion_tokens"] > 0


def test_env_and_runner_config_share_one_set_of_defaults():
    import inspect

    from ctrlsim.experiments.promptshift.config import PromptShiftConfig

    env_defaults = inspect.signature(PromptShiftEnv.__init__).parameters
    cfg = PromptShiftConfig()
    for name in ("n_candidates", "k", "history_len", "min_fit_positives", "p", "rho", "temperature"):
        assert env_defaults[name].default == getattr(cfg, name), name
