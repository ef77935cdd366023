import numpy as np
import pytest

from ctrlsim.backends import TokenMeter
from ctrlsim.envs import ProbeEnv, ProbeSpec
from ctrlsim.envs.engine import InvalidAction
from ctrlsim.errors import UnknownItemError


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
    obs, reward, _, _, info = env.step({"likes": [1, 0, 0], "query": ""})
    assert info["new_likes"] and obs["source"] == 0


def test_token_usage_in_info(emb_rec):
    meter = TokenMeter()
    env = ProbeEnv(emb_rec, budget=2, token_meter=meter, probe_key="p7")
    env.reset(seed=0)
    meter.add(100, 20, key="p7")  # what an LLM probe's calls charge under its key
    _, _, _, _, info = env.step({"likes": [0, 0, 0], "query": ""})
    assert info["tokens"]["total_tokens"] == 120


def test_bad_actions_and_inputs(emb_rec):
    env = ProbeEnv(emb_rec, budget=2)
    env.reset(seed=0)
    with pytest.raises(InvalidAction):
        env.step({"likes": [1, 0]})
    with pytest.raises(InvalidAction):
        env.step({"likes": [2, 0, 0]})
    with pytest.raises(InvalidAction):
        env.step("like the first one")
    with pytest.raises(UnknownItemError):
        env.reset(options={"probe": ProbeSpec(history=("not-an-item",))})
    with pytest.raises(RuntimeError):
        ProbeEnv(emb_rec).step({"likes": [0, 0, 0]})


def test_render_shows_the_slate(emb_rec):
    env = ProbeEnv(emb_rec, budget=2, render_mode="ansi")
    _, info = env.reset(seed=0)
    text = env.render()
    assert info["slate_items"][0] in text and "round 0/2" in text
