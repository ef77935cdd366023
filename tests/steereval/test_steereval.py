import json

import pytest

from ctrlsim.agents.steering import LLMAppend, LLMRewrite, TemplateAppend, template_sentence
from ctrlsim.envs.steereval_env import (
    SteerEvalEnv,
    build_scenario,
    edit_problems,
    eligible_users,
    oracle_descriptions,
    steereval_figures,
)
from ctrlsim.errors import ConfigError


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


def test_figures_hook_by_hand(scenario):
    rel = sorted(scenario.relevant, key=scenario.pool.index)
    irr = [i for i in scenario.pool if i not in scenario.relevant]
    before = rel + irr  # perfect
    after = irr + rel   # reversed
    f = steereval_figures(before, after, scenario, k=10)
    assert f["auc_before"] == 1.0 and f["auc_after"] == 0.0 and f["delta_auc"] == -1.0
    assert f["coverage@10_before"] == 1.0 and f["coverage@10_after"] == 0.0
    own = rel if scenario.next_item in scenario.relevant else irr
    assert f["rank_set_before"] == own.index(scenario.next_item) + 1 == f["rank_set_after"]


def test_templates_and_edit_problem_detection():
    assert template_sentence("Mystery", "genre", "increase") == "Please show the user movies that satisfy: Mystery."
    assert template_sentence("Mystery", "genre", "decrease") == "The user *does not want* to see Mystery movies."
    assert template_sentence("the dog dies", "trigger", "decrease", "stronger") == \
        "The user wants to see *no* movies where the dog dies."
    with pytest.raises(ConfigError):
        TemplateAppend("loudest")
    assert edit_problems("a", "I'm sorry, but I can't help with that.", "Horror") == ["refusal", "tag_missing"]
    assert edit_problems("a", "", "Horror") == ["empty"]
    assert edit_problems("Likes films.", "Likes films.", "Horror") == ["unchanged", "tag_missing"]
    assert edit_problems("Likes films.", "Likes films but avoids horror.", "Horror") == []


def test_oracle_text_states_tag_relevance(ml100k):
    notes = oracle_descriptions(ml100k, "Horror")
    horror = ml100k.items_with_tag("Horror")[0]
    comedy = [i for i in ml100k.items_with_tag("Comedy") if i not in set(ml100k.items_with_tag("Horror"))][0]
    assert notes[horror].endswith("This movie is about: Horror.")
    assert notes[comedy].endswith("This movie is not about: Horror.")
    # the usual description (year, genres on ml-100k) stays: only the tag sentence is added
    assert "Comedy" in notes[comedy] and notes[comedy].startswith("Released ")


@pytest.fixture(scope="module")
def small_env(ml100k, smol):
    return SteerEvalEnv(dataset=ml100k, llm=smol, pool_size=6, tags=["Horror", "Romance"])


# check_env runs for every registered env in tests/envs/test_api_compliance.py


def test_episode_and_policies(small_env, ml100k, smol):
    obs, info = small_env.reset(seed=3)
    assert small_env.observation_space.contains(obs)
    assert info["original_profile"] and info["tag_name"] in ("Horror", "Romance")
    for policy in (TemplateAppend(), LLMAppend(smol), LLMRewrite(smol, max_tokens=60)):
        obs, info = small_env.reset(seed=3)
        steered = policy.act(obs, info)
        assert isinstance(steered, str) and steered
        _, reward, term, trunc, figures = small_env.step(steered)
        assert term and not trunc
        sign = 1 if info["direction_name"] == "increase" else -1
        assert reward == pytest.approx(sign * figures["delta_auc"])
        assert isinstance(figures["edit_problems"], list)
    with pytest.raises(RuntimeError):
        small_env.step("x")  # the episode ended


def test_runner_writes_incrementally_and_resumes(tmp_path, monkeypatch):
    from ctrlsim.experiments import steereval_tables as T

    cfg = T.SteerEvalRunConfig(llm="smollm2-135m", users=1, tags=("Horror",), pool_size=6,
                               conditions=("default", "embedding"), out=str(tmp_path / "se"))
    first = T.run(cfg, show_progress=False)
    assert len(first["records"]) == 4  # 2 conditions x 2 directions
    lines = (tmp_path / "se" / "records.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["config"]["llm"] == "smollm2-135m" and len(lines) == 5
    # an interrupted run: drop the last record, rerun -> only that one is recomputed
    (tmp_path / "se" / "records.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    calls = []
    original_step = T.__dict__.get("SteerEvalEnv")
    from ctrlsim.envs import steereval_env

    real_step = steereval_env.SteerEvalEnv.step
    monkeypatch.setattr(steereval_env.SteerEvalEnv, "step", lambda self, a: calls.append(1) or real_step(self, a))
    second = T.run(cfg, show_progress=False)
    assert len(calls) == 1 and len(second["records"]) == 4 and original_step is None
    text = T.format_tables(second)
    assert "Table 1" in text and "Table 8" in text and "LLM scoring" in text
