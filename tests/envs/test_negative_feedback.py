"""Explicit negative feedback: the env actions (not interested, dislike, block), what the box sees,
and what the embedding and dial boxes do with it, each checked by hand."""
import numpy as np
import pytest
from ctrlsim.envs import PopulationEnv, ProbeEnv
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test

from ctrlsim.errors import ConfigError, InvalidAction
from ctrlsim.recommenders import UserState, make_recommender


def test_feedback_reaches_the_box_state_once_per_item_and_tag(pop_rec):
    env = PopulationEnv(pop_rec, n_agents=1, target="War", negative_feedback=True)
    obs, infos = env.reset(seed=0)
    first = infos["probe_0"]["slate_item_ids"]
    env.step({"probe_0": {"likes": [1, 0, 0], "feedback": [0, 1, 2], "block": "Comedy"}})
    probe = env.probes["probe_0"]
    state = probe.state(env.dataset)
    assert state.not_interested == (first[1],) and state.disliked == (first[2],)
    assert state.blocked_tags == ("Comedy",) and state.history[-1] == first[0]
    tags = env.engine.block_tags
    env.step({"probe_0": {"likes": [0, 0, 0], "feedback": [0, 0, 0], "block": tags.index("Comedy") + 1}})
    assert probe.state(env.dataset).blocked_tags == ("Comedy",)  # blocking twice counts once
    assert probe.record.feedback_per_round[1] == {"not_interested": [], "disliked": [], "block": "Comedy"}
    assert env.config["negative_feedback"] is True


@pytest.mark.parametrize("action, message", [
    ({"likes": [1, 0, 0], "feedback": [1, 0, 0]}, r"position\(s\) \[0\] are both liked"),
    ({"likes": [0, 0, 0], "feedback": [0, 3, 0]}, "position 1 is 3"),
    ({"likes": [0, 0, 0], "feedback": [0, 1]}, "must have 3 entries"),
    ({"likes": [0, 0, 0], "block": "Westerns"}, "unknown tag 'Westerns'"),
    ({"likes": [0, 0, 0], "block": 99}, "tag index in 1..19"),
])
def test_bad_feedback_is_an_invalid_action_naming_the_problem(pop_rec, action, message):
    env = ProbeEnv(pop_rec, target="War", negative_feedback=True)
    env.reset(seed=0)
    with pytest.raises(InvalidAction, match=message):
        env.step(action)


def test_without_the_option_feedback_keys_are_refused_and_the_space_is_unchanged(pop_rec):
    plain = ProbeEnv(pop_rec, target="War")
    with_feedback = ProbeEnv(pop_rec, target="War", negative_feedback=True)
    assert set(plain.action_space.spaces) == {"likes", "query"}
    assert set(with_feedback.action_space.spaces) == {"likes", "query", "feedback", "block"}
    assert "negative_feedback" not in plain.config
    plain.reset(seed=0)
    with pytest.raises(InvalidAction, match="negative_feedback=True"):
        plain.step({"likes": [0, 0, 0], "feedback": [1, 0, 0]})
    sample = with_feedback.action_space.sample()
    assert not sample["feedback"].any() and sample["block"] == 0  # random probes give no feedback
    with pytest.raises(ConfigError, match="negative_feedback must be True or False"):
        ProbeEnv(pop_rec, target="War", negative_feedback="yes")


def test_env_checkers_pass_with_negative_feedback(pop_rec):
    check_env(ProbeEnv(pop_rec, target="War", negative_feedback=True).unwrapped, skip_render_check=True)
    parallel_api_test(PopulationEnv(pop_rec, n_agents=2, target="War", negative_feedback=True), num_cycles=4)


def test_dial_neg_removes_each_similar_item_with_its_strength(ml100k):
    tags = {str(i): set(t) for i, t in zip(ml100k.item_ids, ml100k.items["tags"])}
    item = "1"  # Toy Story: Animation, Children's, Comedy
    similar = {j for j, t in tags.items() if t & tags[item]}
    state = UserState(history=("50",), not_interested=(item,))
    full = make_recommender("dial:0:neg=1", ml100k)
    assert {str(ml100k.item_ids[i]) for i in np.flatnonzero(full.removed_by_feedback(state))} == similar
    assert not make_recommender("dial:0:neg=0", ml100k).removed_by_feedback(state).any()
    half = make_recommender("dial:0:neg=0.5", ml100k).removed_by_feedback(state)
    removed = {str(ml100k.item_ids[i]) for i in np.flatnonzero(half)}
    assert removed < similar and 0.4 < len(removed) / len(similar) < 0.6
    assert np.array_equal(half, make_recommender("dial:0:neg=0.5", ml100k).removed_by_feedback(state))
    slate = full.recommend([state], 20)[0].item_ids
    assert not set(slate) & similar
    assert make_recommender("dial:0:neg=0.5", ml100k).identity["neg"] == 0.5
    assert "neg" not in make_recommender("dial:0", ml100k).identity
    assert not make_recommender("dial:0", ml100k).reads_negative_feedback and full.reads_negative_feedback
    with pytest.raises(ConfigError, match="not a number in"):
        make_recommender("dial:0:neg=2", ml100k)


def test_embedding_box_moves_away_from_dismissed_items_and_drops_blocked_tags(ml100k):
    box = make_recommender("embedding", ml100k)
    base = UserState(history=("50", "172", "181"))
    away = UserState(history=("50", "172", "181"), disliked=("1", "71"))
    vectors = box.item_vectors
    q = vectors[ml100k.indices(base.history)].mean(0)
    q /= np.linalg.norm(q)
    neg = vectors[ml100k.indices(["1", "71"])].mean(0)
    q = q - 0.5 * neg / np.linalg.norm(neg)
    q /= np.linalg.norm(q)
    assert np.allclose(box.score_all([away])[0], vectors @ q)
    assert not np.allclose(box.score_all([base])[0], box.score_all([away])[0])
    blocked = box.recommend([UserState(history=base.history, blocked_tags=("Sci-Fi",))], 50)[0].item_ids
    assert not any("Sci-Fi" in ml100k.items["tags"].iat[ml100k.item_index[i]] for i in blocked)
    assert box.reads_negative_feedback and not make_recommender("popularity", ml100k).reads_negative_feedback
