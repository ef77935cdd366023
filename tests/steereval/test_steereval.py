
import numpy as np
import pandas as pd
import pytest
from ctrlsim.agents.steering import LLMAppend, LLMRewrite, TemplateAppend, template_sentence
from ctrlsim.envs.steereval_env import (
    MAX_PROFILE_CHARS,
    SteerEvalEnv,
    build_scenario,
    edit_problems,
    eligible_users,
    oracle_descriptions,
    to_observation_text,
)

from ctrlsim.backends import Completion
from ctrlsim.errors import ConfigError, InvalidAction, ResetNeededError


@pytest.fixture(scope="module")
def scenario(ml100k):
    user = eligible_users(ml100k)[0]
    return build_scenario(ml100k, user, "Horror", "decrease", pool_size=100)


def test_scenario_follows_section_4_1(ml100k, scenario):
    sc = scenario
    hist = ml100k.history(sc.user_id)
    assert len(sc.history) == 50 and sc.history == tuple(hist["item_id"][:50])
    assert sc.next_item == hist["item_id"][50] and sc.next_item in sc.pool
    assert len(sc.pool) == 100 and len(set(sc.pool)) == 100
    assert len(sc.relevant) == 50 and sc.relevant <= set(sc.pool)
    assert sc.relevant == set(sc.pool) & set(ml100k.items_with_tag("Horror"))
    rated = set(hist["item_id"]) - {sc.next_item}
    assert not rated & set(sc.pool)
    # quotas are filled with the items closest in popularity to the next item
    pop = ml100k.items.set_index("item_id")["popularity"]
    target = pop[sc.next_item]
    irrelevant_pool = [i for i in sc.pool if i not in sc.relevant and i != sc.next_item]
    others = [i for i in ml100k.item_ids if i not in sc.pool and i not in rated
              and i not in set(ml100k.items_with_tag("Horror"))]
    assert max(abs(pop[i] - target) for i in irrelevant_pool) <= min(abs(pop[i] - target) for i in others)


def test_infeasible_scenarios_are_skipped_and_bad_input_raises(ml100k):
    user = eligible_users(ml100k)[0]
    assert build_scenario(ml100k, user, "Film-Noir", "increase", pool_size=100) is None  # 24 items only
    with pytest.raises(ConfigError):
        build_scenario(ml100k, user, "Horror", "sideways")
    with pytest.raises(ConfigError):
        build_scenario(ml100k, user, "Horror", "increase", pool_size=7)


def test_templates_and_edit_problem_detection():
    assert template_sentence("the dog dies", "trigger", "decrease", "stronger") == \
        "The user wants to see *no* movies where the dog dies."
    with pytest.raises(ConfigError):
        TemplateAppend("loudest")
    refusal = "I'm sorry, but I can't help with that."
    assert edit_problems("a", refusal, "Horror") == ["refusal", "tag_missing"]
    assert edit_problems("a", "", "Horror") == ["empty"]
    assert edit_problems("Likes films.", "Likes films.", "Horror") == ["unchanged", "tag_missing"]
    assert edit_problems("Likes films.", "Likes films but avoids horror.", "Horror") == []


def test_oracle_text_states_tag_relevance(ml100k):
    notes = oracle_descriptions(ml100k, "Horror")
    horror = ml100k.items_with_tag("Horror")[0]
    comedy = [i for i in ml100k.items_with_tag("Comedy") if i not in set(ml100k.items_with_tag("Horror"))][0]
    assert notes[horror].endswith("This movie is about: Horror.")
    assert notes[comedy].endswith("This movie is not about: Horror.")
    # ml-100k has no descriptions: the oracle sentence is the whole (tag-free) description
    assert notes[comedy] == "This movie is not about: Horror." and "Comedy" not in notes[comedy]
    described = ml100k.with_descriptions(pd.Series({comedy: "Two friends take a road trip."}))
    assert oracle_descriptions(described, "Horror")[comedy] == \
        "Two friends take a road trip. This movie is not about: Horror."


@pytest.fixture(scope="module")
def small_env(ml100k, smol):
    return SteerEvalEnv(dataset=ml100k, llm=smol, pool_size=6, history_len=8, tags=["Horror", "Romance"])


# check_env runs for every registered env in tests/envs/test_api_compliance.py


@pytest.mark.llm
def test_episode_and_policies(small_env, ml100k, smol):
    obs, info = small_env.reset(seed=3)
    assert small_env.observation_space.contains(obs)
    assert info["original_profile"] and info["tag_name"] in ("Horror", "Romance")
    for policy in (TemplateAppend(), LLMAppend(smol), LLMRewrite(smol, max_tokens=60)):
        obs, info = small_env.reset(seed=3)
        steered = to_observation_text(policy.act(obs, info))  # LLM text may hold non-ASCII characters
        assert steered
        _, reward, term, trunc, figures = small_env.step(steered)
        assert term and not trunc
        sign = 1 if info["direction_name"] == "increase" else -1
        assert reward == pytest.approx(sign * figures["delta_auc"])
        assert isinstance(figures["edit_problems"], list)
    with pytest.raises(ResetNeededError, match="episode has ended"):
        small_env.step("x")


@pytest.mark.llm
def test_invalid_actions_and_render_modes(small_env, ml100k):
    small_env.reset(seed=4)
    too_long = "x" * (MAX_PROFILE_CHARS + 1)
    for bad, message in ((b"bytes", "bytes"), ("caf\u00e9", "charset"), (too_long, "max")):
        with pytest.raises(InvalidAction, match=message):
            small_env.step(bad)
    assert small_env.render() is None  # no render mode
    with pytest.warns(UserWarning, match="render_mode='human'"):  # as gymnasium.make does
        assert SteerEvalEnv(dataset=ml100k, render_mode="human").render() is None
    ansi = SteerEvalEnv(dataset=ml100k, render_mode="ansi", tags=["Horror"])
    with pytest.raises(ResetNeededError, match="not been reset"):
        ansi.render()


def test_unknown_tag_is_a_config_error(ml100k):
    with pytest.raises(ConfigError, match="Nope"):
        SteerEvalEnv(dataset=ml100k, tags=["Horror", "Nope"])


def test_scenarios_can_be_restricted_to_described_items(ml100k, scenario):
    items = frozenset(i for i in ml100k.item_ids if i not in set(scenario.pool[:10]) | {scenario.history[0]})
    sc = build_scenario(ml100k, scenario.user_id, "Horror", "decrease", pool_size=100, items=items)
    assert set(sc.pool) <= items and scenario.history[0] not in sc.history
    hist = [i for i in ml100k.history(sc.user_id)["item_id"] if i in items]
    assert sc.history == tuple(hist[:50]) and sc.next_item == hist[50]


class ConstantLLM:
    """Writes one fixed profile and rates every item 3: no model, every number known in advance."""

    identity = {"runtime": "constant"}

    def __init__(self):
        self.rated = 0

    def chat(self, conversations, **kwargs):
        return [Completion("Enjoys films of every kind.", 10, 5) for _ in conversations]

    def rate(self, conversations, **kwargs):
        self.rated += len(conversations)
        return np.full(len(conversations), 3.0)


def test_episode_lifecycle_raises_reset_needed_error(ml100k):
    llm = ConstantLLM()
    env = SteerEvalEnv(dataset=ml100k, llm=llm, pool_size=6, history_len=8, tags=["Horror"],
                       render_mode="ansi")
    with pytest.raises(ResetNeededError, match="not been reset"):
        env.step("Likes horror.")
    with pytest.raises(ResetNeededError, match="not been reset"):
        env.render()
    obs, info = env.reset(seed=0)
    sc = env.scenario
    assert obs["profile"] == "Enjoys films of every kind." == info["original_profile"]
    summary = f"user {sc.user_id}: {sc.direction} 'Horror' over 6 items"
    assert env.render() == summary
    _, reward, terminated, _, figures = env.step("Enjoys films of every kind, above all horror.")
    # Every item scores 3 for both profiles: the rankings are the same seeded tie order, so AUC is unchanged.
    assert terminated and reward == 0.0 and figures["delta_auc"] == 0.0
    assert llm.rated == 2 * 6  # the pool rated once for the original profile and once for the steered one
    assert env.render() == summary  # the finished episode still renders
    with pytest.raises(ResetNeededError, match="episode has ended"):
        env.step("again")
    env.reset(seed=0)
    assert env.step("Enjoys films of every kind.")[2]  # a new episode steps again


@pytest.mark.parametrize("kwargs, message", [
    ({"llm": 42}, "^llm must be"), ({"pool_size": 7}, "pool_size"), ({"k": 0}, "k must be"),
    ({"history_len": -1}, "history_len"), ({"render_mode": 5}, "render_mode"),
])
def test_bad_arguments_are_named_before_any_work(ml100k, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SteerEvalEnv(dataset=ml100k, **kwargs)


def test_reset_checks_its_seed(ml100k):
    with pytest.raises(ConfigError, match="seed"):
        SteerEvalEnv(dataset=ml100k, llm=ConstantLLM(), tags=["Horror"]).reset(seed=-1)
