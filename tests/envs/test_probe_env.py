import numpy as np
import pytest
from ctrlsim.envs import ProbeEnv, ProbeSpec

from ctrlsim.backends import TokenMeter
from ctrlsim.errors import InvalidAction, ResetNeededError, UnknownItemError


def test_likes_feed_the_black_box_and_rewards_count_new_targets(emb_rec, ml100k):
    horror = ml100k.items_with_tag("Horror")
    env = ProbeEnv(emb_rec, budget=10, target="Horror")
    obs, info = env.reset(seed=0, options={"probe": ProbeSpec(history=tuple(horror[:4]))})
    total, liked = 0.0, []
    for _ in range(10):
        likes = np.array([i in set(horror) for i in info["slate_item_ids"]] + [False] * 3)[:3].astype(int)
        obs, reward, term, trunc, info = env.step({"likes": likes, "query": ""})
        liked += info["new_likes"]
        total += reward
        if not trunc:  # the next slate never repeats a liked item
            assert not set(info["slate_item_ids"]) & set(env.probe.record.history)
    assert trunc and not term
    assert total == len(set(liked) & set(horror)) > 0
    assert info["metrics"]["targets_discovered"] == total
    assert env.probe.record.history[:4] == tuple(horror[:4])


def test_shown_items_are_masked_and_skips_change_the_slate(emb_rec, ml100k):
    env = ProbeEnv(emb_rec, budget=5, target="Horror")
    obs, info = env.reset(seed=1)
    seen = set(info["slate_item_ids"])
    for _ in range(4):
        obs, _, _, _, info = env.step({"likes": [0, 0, 0], "query": ""})
        assert not seen & set(info["slate_item_ids"])
        seen |= set(info["slate_item_ids"])


def test_search_returns_matching_items_then_click(emb_rec):
    env = ProbeEnv(emb_rec, budget=4, target="Film-Noir")
    env.reset(seed=2)
    obs, reward, _, _, info = env.step({"likes": [0, 0, 0], "query": "noir detective"})
    assert obs["source"] == 1 and info["slate_source"] == "search"
    assert any("noir" in t.lower() or "detective" in t.lower() for t in info["slate_items"])
    noir = set(env.task.target)
    liked_from_search = [i for i in info["slate_item_ids"] if i in noir][:1] or info["slate_item_ids"][:1]
    likes = [int(i in liked_from_search) for i in info["slate_item_ids"]]
    obs, reward, _, _, info = env.step({"likes": likes, "query": ""})
    # The like shapes the history the box sees, but search results are not the recommender's doing:
    # no reward, no coverage, counted apart.
    assert info["new_likes"] == liked_from_search and obs["source"] == 0
    assert env.probe.record.history[-1] == liked_from_search[0]
    assert reward == 0.0 and info["metrics"]["coverage"] == 0.0 and info["metrics"]["search_likes"] == 1
    assert env.probe.record.sources == ["recommender", "search"]
    assert env.probe.record.queries == ["noir detective", ""]


def test_search_can_be_switched_off(emb_rec):
    env = ProbeEnv(emb_rec, budget=2, allow_search=False)
    env.reset(seed=2)
    with pytest.raises(InvalidAction, match="allow_search=False"):
        env.step({"likes": [0, 0, 0], "query": "noir"})


def test_token_usage_in_info_is_keyed_by_the_probe_name(emb_rec):
    meter = TokenMeter()
    env = ProbeEnv(emb_rec, budget=2, token_meter=meter)
    _, info = env.reset(seed=0, options={"probe": ProbeSpec(history=("1", "2"), name="p7")})
    assert info["probe"] == "p7" and info["tokens"]["total_tokens"] == 0
    meter.add(100, 20, key="p7")  # what an LLM probe's calls charge under its id
    meter.add(50, 5, key="someone-else")
    _, _, _, _, info = env.step({"likes": [0, 0, 0], "query": ""})
    assert info["tokens"]["total_tokens"] == 120 and info["tokens"]["calls"] == 1
    # A new episode of the same probe counts from zero; the meter keeps the probe's total.
    _, info = env.reset(seed=0, options={"probe": ProbeSpec(history=("1", "2"), name="p7")})
    assert info["tokens"]["total_tokens"] == 0 and meter.usage("p7").total_tokens == 120


def test_unnamed_specs_are_named_after_their_seed_history():
    a, b = ProbeSpec(history=("1", "2")), ProbeSpec(history=["1", "2"])
    assert a.name == b.name and a.name.startswith("probe-")
    assert ProbeSpec(history=("2", "1")).name != a.name
    assert ProbeSpec(history=("1",), name="user-9").name == "user-9"


def test_query_within_the_action_space_is_accepted(emb_rec):
    env = ProbeEnv(emb_rec, budget=3)
    env.reset(seed=0)
    longest = ("noir detective " * 5)[:64]  # the Text space's max_length, all from its charset
    assert len(longest) == 64
    assert env.action_space["query"].contains(longest)
    obs, _, _, _, info = env.step({"likes": np.array([0, 0, 0], dtype=np.int8), "query": longest})
    assert obs["source"] == 1
    obs, _, _, _, info = env.step({"likes": [True, False, False], "query": None})  # bools; None = no query
    assert obs["source"] == 0 and len(info["new_likes"]) == 1


def test_bad_actions_and_inputs(emb_rec):
    env = ProbeEnv(emb_rec, budget=2)
    env.reset(seed=0)
    with pytest.raises(InvalidAction, match=r"3 entries"):
        env.step({"likes": [1, 0]})
    with pytest.raises(InvalidAction, match=r"position 0 is 2"):
        env.step({"likes": [2, 0, 0]})
    with pytest.raises(InvalidAction, match="like the first one"):
        env.step("like the first one")
    assert env.probe.rounds == 0  # rejected actions cost no round
    with pytest.raises(UnknownItemError, match="not-an-item"):
        env.reset(options={"probe": ProbeSpec(history=("not-an-item",))})
    with pytest.raises(ResetNeededError):
        ProbeEnv(emb_rec).step({"likes": [0, 0, 0]})


def test_render_modes(emb_rec, capsys):
    env = ProbeEnv(emb_rec, budget=2, render_mode="ansi")
    _, info = env.reset(seed=0)
    text = env.render()
    assert info["slate_items"][0] in text and "round 0/2" in text
    assert capsys.readouterr().out == ""

    human = ProbeEnv(emb_rec, budget=2, render_mode="human")
    human.reset(seed=0)
    _, _, _, _, info = human.step({"likes": [0, 0, 0], "query": ""})
    printed = capsys.readouterr().out
    # One slate printed per step, and not the return value of render() ("None") after it.
    assert printed.count("round 1/2") == 1 and "None" not in printed
    assert info["slate_items"][2] in printed
    with pytest.warns(UserWarning, match="render_mode"):
        assert ProbeEnv(emb_rec, budget=2).render() is None  # no render mode: nothing to render
