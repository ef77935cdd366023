"""`dial-profile`, SteerEval's reference ranker: its reader, its score rule and its known answers
(lambda = 0: no edit moves anything; lambda = 1: template edits move AUC_t the requested way).

Expected values are written by hand or computed here with numpy, never by the code under test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from ctrlsim.agents.steering import TEMPLATES, TemplateAppend
from ctrlsim.envs.steereval_env import SteerEvalEnv

import ctrlsim.recommenders.steereval as steereval_module
from ctrlsim.errors import ConfigError, EmptyHistoryError
from ctrlsim.recommenders import make_recommender
from ctrlsim.recommenders.base import UserState
from ctrlsim.recommenders.dial_profile import NON_TAGS, DialProfileRanker
from ctrlsim.recommenders.steereval import SteerEvalEngine
from ctrlsim.seeding import derive_rng

GENRE_TEMPLATES = [(key, text) for key, text in TEMPLATES.items() if key[0] == "genre"]


@pytest.fixture(scope="module")
def ranker(ml100k):
    return DialProfileRanker(ml100k, lam=0.5)


def hand_popularity_scores(ds, idx) -> np.ndarray:
    """b_i = 1 - pos_i / (m - 1) over the m pool items `idx`: pos_i = pool items more popular than i,
    plus equally popular ones before it in the catalogue."""
    pop = ds.items["popularity"].to_numpy()[idx]
    m = len(idx)
    pos = np.array([(pop > pop[n]).sum() + ((pop == pop[n]) & (np.asarray(idx) < idx[n])).sum()
                    for n in range(m)])
    return 1.0 - pos / (m - 1)


# ------------------------------------------------------------------ the reader
@pytest.mark.parametrize("key,template", GENRE_TEMPLATES, ids=["-".join(k[1:]) for k, _ in GENRE_TEMPLATES])
def test_every_genre_template_reads_with_the_sign_it_asks_for(ranker, key, template):
    direction, emphasis = key[1], key[2]
    weight = {"default": 1.0, "stronger": 2.0, "weaker": 0.5}[emphasis]
    tags = [t for t in ranker.dataset.tags if t != "unknown"]
    assert len(tags) == 18
    for tag in tags:
        expected = {tag: weight if direction == "increase" else -weight}
        assert ranker.read_profile(template.format(tag=tag)) == expected, (template, tag)


def test_the_reader_rules(ranker):
    assert ranker.read_profile("I love film noir and comedies.") == {"Film-Noir": 1.0, "Comedy": 1.0}
    assert ranker.read_profile("The user does not like horror movies.") == {"Horror": -1.0}
    # the sign and the emphasis are per sentence; a tag's weights add up over sentences
    assert ranker.read_profile("I love comedies! I hate Horror. More comedy please") == \
        {"Comedy": 1.5, "Horror": -1.0}
    assert ranker.read_profile("Only westerns. Never horror.") == {"Western": 2.0, "Horror": -2.0}
    assert ranker.read_profile("Neither westerns nor war films; but SCI FI and childrens movies.") == \
        {"Western": -1.0, "War": -1.0, "Sci-Fi": 1.0, "Children's": 1.0}
    assert ranker.read_profile("Mysteries, scifi, film-noir, children\u2019s.") == \
        {"Mystery": 1.0, "Sci-Fi": 1.0, "Film-Noir": 1.0, "Children's": 1.0}
    # whole words only; double-quoted titles are skipped; "unknown" is never a tag
    text = 'Warm and dramatic. I enjoyed "Star Wars" and "No Escape". Unknown ones.'
    assert ranker.read_profile(text) == {}
    assert "unknown" in NON_TAGS and ranker.read_profile("unknown movies") == {}
    assert ranker.read_profile("") == {}


def test_template_profile_from_history_and_ratings(ranker):
    # 1 Toy Story (Animation, Children's, Comedy), 2 GoldenEye (Action, Adventure, Thriller),
    # 4 Get Shorty (Action, Comedy, Drama), 50 Star Wars (Action, Adventure, Romance, Sci-Fi, War)
    state = UserState(history=("1", "2", "4", "50"), attributes={"ratings": (3, 5, 4, 2)})
    # rating-weighted tag counts: Action 5+4+2=11, Adventure 5+2=7, Comedy 3+4=7, ... (tie: tag order)
    expected = ('The user has enjoyed: "GoldenEye" (1995), "Get Shorty" (1995), "Toy Story" (1995), '
                '"Star Wars" (1977). The user likes Action, Adventure and Comedy movies.')
    assert ranker.profiles([state]) == [expected]
    assert ranker.read_profile(expected) == {"Action": 1.0, "Adventure": 1.0, "Comedy": 1.0}
    # no ratings: history order, plain counts (Action 3, Adventure 2, Comedy 2)
    plain = ranker.profiles([UserState(history=("1", "2", "4", "50"))])[0]
    assert plain.startswith('The user has enjoyed: "Toy Story" (1995), "GoldenEye" (1995)')
    assert plain.endswith("The user likes Action, Adventure and Comedy movies.")
    assert ranker.profiles([UserState(profile="given text", history=("1",))]) == ["given text"]
    with pytest.raises(EmptyHistoryError):
        ranker.profiles([UserState()])
    with pytest.raises(ConfigError, match="ratings"):
        ranker.profiles([UserState(history=("1", "2"), attributes={"ratings": (5,)})])


# ------------------------------------------------------------------ the score rule
def test_lambda_zero_ignores_the_profile(ml100k):
    rec = DialProfileRanker(ml100k, lam=0)
    pool = [str(i) for i in range(1, 200)]
    a, b = rec.score_candidates([UserState(profile="I love film noir and comedies."),
                                 UserState(profile="The user *does not want* to see Drama movies.")],
                                [ml100k.indices(pool)] * 2)
    assert np.array_equal(a, b)
    assert np.array_equal(a, hand_popularity_scores(ml100k, ml100k.indices(pool)))


def test_lambda_one_ranks_every_tagged_item_first(ml100k):
    rec = DialProfileRanker(ml100k, lam=1)
    noir = ml100k.items_with_tag("Film-Noir")
    others = [i for i in ml100k.item_ids[:60] if i not in set(noir)]
    pool = [x for pair in zip(others, noir) for x in pair] + others[len(noir):]  # mixed order
    state = UserState(profile="Please show the user movies that satisfy: Film-Noir.")
    slate = rec.recommend([state], k=len(pool), candidates=pool)[0]
    assert set(slate.item_ids[:len(noir)]) == set(noir)
    assert np.allclose(slate.scores[:len(noir)], math.tanh(1)) and np.all(slate.scores[len(noir):] == 0)


def test_the_score_formula_by_hand_at_lambda_one_half(ml100k):
    rec = DialProfileRanker(ml100k, lam=0.5)
    profile = "I love film noir and comedies. I also like crime movies."
    # 302 L.A. Confidential (Crime, Film-Noir, Mystery, Thriller): 2 named tags; 1 Toy Story: Comedy only
    idx = ml100k.indices(["302", "1", "6"])  # 6 Shanghai Triad: Drama, not named
    # base ranks within this pool of three: Toy Story (452 ratings) > L.A. Confidential (297) > Shanghai
    # Triad (26), so b = 0.5, 1, 0
    pop = ml100k.items["popularity"].to_numpy()[idx]
    assert pop[1] > pop[0] > pop[2]
    expected = [0.5 * 0.5 + 0.5 * math.tanh(2), 0.5 * 1.0 + 0.5 * math.tanh(1), 0.5 * 0.0]
    got = rec.score_candidates([UserState(profile=profile)], [idx])[0]
    assert np.allclose(got, expected, rtol=0, atol=1e-12)
    # over the whole catalogue the base is the catalogue rank
    b = hand_popularity_scores(ml100k, np.arange(len(ml100k.items)))
    whole = [0.5 * b[idx[0]] + 0.5 * math.tanh(2), 0.5 * b[idx[1]] + 0.5 * math.tanh(1), 0.5 * b[idx[2]]]
    assert np.allclose(rec.score_all([UserState(profile=profile)])[0, idx], whole, rtol=0, atol=1e-12)


def test_random_base_and_string_options(ml100k):
    rec = make_recommender("dial-profile:0:base=random:seed=3:exclude_history=false", ml100k)
    assert isinstance(rec, DialProfileRanker) and rec.seed == 3 and rec.exclude_history is False
    perm = derive_rng(3, "dial-base").permutation(len(ml100k.items))
    expected = np.empty(len(perm))
    expected[perm] = 1 - np.arange(len(perm)) / (len(perm) - 1)
    assert np.array_equal(rec.score_all([UserState(profile="horror")])[0], expected)
    assert rec.identity == {"recommender": "dial-profile", "dataset": "ml-100k", "lambda": 0.0,
                            "base": "random", "seed": 3, "reader": "lexical-tags"}


def test_bad_input_is_a_config_error(ml100k):
    for kwargs, word in [({"lam": 1.5}, "lam"), ({"lam": "abc"}, "lam"),
                         ({"lam": 0.5, "base": "nope"}, "base"), ({"lam": 0.5, "seed": "x"}, "seed"),
                         ({"lam": 0.5, "mix": "scores"}, "mix"),
                         ({"lam": 0.5, "mask_shown": "maybe"}, "mask_shown")]:
        with pytest.raises(ConfigError, match=word):
            DialProfileRanker(ml100k, **kwargs)
    with pytest.raises(ConfigError):
        make_recommender("dial-profile:abc", ml100k)
    for ranker in ("dial:abc", "dial:1.5", "dial:0.5:base=nope"):
        with pytest.raises(ConfigError):
            SteerEvalEnv(dataset=ml100k, llm="qwen2.5-0.5b", ranker=ranker, tags=["Film-Noir"], pool_size=20)


# ------------------------------------------------------------------ through SteerEval, no LLM
def _episode(ml100k, ranker: str, direction: str, emphasis: str = "default"):
    env = SteerEvalEnv(dataset=ml100k, llm="qwen2.5-0.5b", ranker=ranker, tags=["Film-Noir"], pool_size=20)
    sc = next(s for u in env.users if (s := env.build(u, "Film-Noir", direction)) is not None)
    obs, info = env.reset(seed=0, options={"scenario": sc})
    _, reward, terminated, _, out = env.step(TemplateAppend(emphasis).act(obs, info))
    assert terminated and env.engine._llm is None
    return obs, reward, out


@pytest.fixture
def no_llm(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a dial ranker must never load an LLM")

    monkeypatch.setattr(steereval_module, "resolve_llm", refuse)


@pytest.mark.parametrize("emphasis", ["default", "stronger", "weaker"])
def test_steereval_known_answers(ml100k, no_llm, emphasis):
    for direction in ("increase", "decrease"):
        _, reward, out = _episode(ml100k, "dial:0", direction, emphasis)
        assert out["delta_auc"] == 0.0 and reward == 0.0
        assert out["rank_set_after"] == out["rank_set_before"]
    obs, up, out_up = _episode(ml100k, "dial:1", "increase", emphasis)
    assert out_up["delta_auc"] > 0 and up == out_up["delta_auc"]
    assert obs["profile"].startswith("The user has enjoyed: ") and "Film-Noir" not in obs["profile"]
    _, down, out_down = _episode(ml100k, "dial:1", "decrease", emphasis)
    assert out_down["delta_auc"] < 0 and down == -out_down["delta_auc"]


def test_the_engine_builds_the_dial_ranker_for_both_prefixes(ml100k, no_llm):
    for spec in ("dial:0.25:base=random:seed=2", "dial-profile:0.25:base=random:seed=2"):
        engine = SteerEvalEngine(dataset=ml100k, llm="qwen2.5-0.5b", ranker=spec, oracle=True,
                                 show_tags=True, tags=["Film-Noir"], pool_size=20)
        rec = engine.recommender("Film-Noir")
        assert isinstance(rec, DialProfileRanker) and rec is engine.recommender()  # oracle ignored
        assert (rec.lam, rec.base, rec.seed) == (0.25, "random", 2)
        sc = next(s for u in engine.users if (s := engine.build(u, "Film-Noir", "increase")) is not None)
        assert engine.original_profile(sc).startswith("The user has enjoyed: ")
        assert sorted(engine.original_ranking(sc)) == sorted(sc.pool)
        assert engine._llm is None
