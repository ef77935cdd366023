"""The probe validity card (issue 42): the fixed checks for scripted probes with known rules, the
question heads on a stand-in LLM whose probabilities the test sets, and their cache keys and errors.

Adherence and fidelity are recomputed here with pandas from the stored decisions, independently of
`ctrlsim.metrics.validity`."""

import json

import numpy as np
import pandas as pd
import pytest
from ctrlsim.agents import Population
from ctrlsim.agents.episode import EpisodeSpec, play_episode
from ctrlsim.agents.llm_probe import DecisionSettings, LLMPopulationPolicy
from ctrlsim.agents.methods import CustomPolicy
from ctrlsim.agents.profiles import ProfileGenerator
from ctrlsim.agents.random_probe import RandomProbe, TargetSeekingProbe
from ctrlsim.agents.validity import CHECK_ITEMS, adherence_items, fidelity_items, run_checks

from ctrlsim.backends import ResponseCache
from ctrlsim.backends.llm import LLM, DigitScores
from ctrlsim.errors import ConfigError
from ctrlsim.experiments import validity_card as VC

TARGET = "War+Film-Noir"


@pytest.fixture(scope="module")
def personas(ml100k):
    gen = ProfileGenerator(ml100k, None)
    return tuple(gen.template_persona(u, gen.seed_items(u, 0)) for u in ("1", "2", "3", "5", "7", "13"))


@pytest.fixture(scope="module")
def war_items(ml100k):
    return frozenset(ml100k.items_with_tag("War")) | frozenset(ml100k.items_with_tag("Film-Noir"))


class LikeAll:
    def act(self, observation, info):
        return {"likes": (observation["slate"] >= 0).astype(np.int8), "query": ""}


def _checks(ml100k, population, items, seed=0):
    return run_checks(
        population,
        ml100k,
        target_items=items,
        target_name=TARGET,
        target_tags=("War", "Film-Noir"),
        seed=seed,
        slate_size=3,
        budget=4,
        like_prob=0.5,
    )


def _hand_adherence(check) -> float:
    df = pd.DataFrame(check)
    rates = df.groupby("target")["liked"].mean()
    return float(rates[True] - rates[False])


def test_the_adherence_check_is_fixed_mixed_and_the_same_for_every_box(ml100k, war_items):
    items = adherence_items(ml100k, war_items, TARGET, seed=0)
    assert len(items) == CHECK_ITEMS and sum(t for _, t in items) == CHECK_ITEMS // 2
    assert all((i in war_items) == t for i, t in items)
    assert items == adherence_items(ml100k, war_items, TARGET, seed=0)  # nothing of the box in it
    assert items != adherence_items(ml100k, war_items, TARGET, seed=1)


def test_the_fidelity_check_uses_the_users_own_ratings_outside_the_seed_history(ml100k, personas):
    persona = personas[0]
    items = fidelity_items(ml100k, persona, seed=0)
    ratings = ml100k.history("1").set_index("item_id")["rating"]
    assert items and all(ratings[i] == r and (r >= 4 or r <= 2) for i, r in items)
    assert not set(i for i, _ in items) & set(persona.behaviour)


def test_target_only_liker_scores_one_and_like_everything_scores_zero(ml100k, personas, war_items):
    oracle = Population(
        personas, CustomPolicy.per_probe("oracle", lambda p, rng: TargetSeekingProbe(war_items))
    )
    result = _checks(ml100k, oracle, war_items)
    assert _hand_adherence(result["check"]) == 1.0
    card = VC.card_for("oracle", [{"method": "oracle", "seed": 0, "validity": result}])
    assert card.adherence.adherence.value == 1.0 and card.passes
    everything = Population(personas, CustomPolicy.per_probe("all", lambda p, rng: LikeAll()))
    result = _checks(ml100k, everything, war_items)
    assert _hand_adherence(result["check"]) == 0.0
    card = VC.card_for("all", [{"method": "all", "seed": 0, "validity": result}])
    assert card.adherence.adherence.value == 0.0 and not card.passes
    # Liking everything ranks nothing: the fidelity AUC is one half.
    assert card.fidelity.value == pytest.approx(0.5)


def test_a_coin_flip_probes_adherence_interval_contains_zero(ml100k, personas, war_items):
    coin = Population(personas, CustomPolicy.per_probe("coin", lambda p, rng: RandomProbe(rng, 0.5)))
    records = [
        {"method": "coin", "seed": s, "validity": _checks(ml100k, coin, war_items, seed=s)} for s in range(4)
    ]
    card = VC.card_for("coin", records)
    assert card.adherence.adherence.low <= 0.0 <= card.adherence.adherence.high
    assert not card.passes
    pooled = pd.DataFrame([d for r in records for d in r["validity"]["check"]])
    assert card.adherence.adherence.value == pytest.approx(_hand_adherence(pooled.to_dict("records")))


def test_every_episode_record_carries_its_validity(ml100k, personas, war_items):
    from ctrlsim.recommenders import make_recommender

    box = make_recommender("popularity", ml100k, mask_shown=True)
    oracle = Population(
        personas, CustomPolicy.per_probe("oracle", lambda p, rng: TargetSeekingProbe(war_items))
    )
    spec = EpisodeSpec("oracle", "Oracle", "popularity", TARGET, 0, 3, 3, True, 0.3, ("War", "Film-Noir"))
    record = play_episode(spec, oracle, box, war_items, show_progress=False)
    validity = record["validity"]
    assert validity["adherence"]["value"] == 1.0
    assert {"item", "liked"} <= set(validity["check"][0])
    # The box's own slates: every target shown was liked, nothing else.
    rounds = [r for p in record["probes"] for r in p["rounds"]]
    shown_targets = sum(i in war_items for r in rounds for i in r["slate"])
    assert validity["slate_counts"]["target"] == shown_targets
    assert (
        validity["slate_counts"]["target_liked"] == shown_targets
        and validity["slate_counts"]["other_liked"] == 0
    )
    assert record["decision"] is None  # scripted probes have no decision head


class QuestionLLM(LLM):
    """Answers "yes" with a probability set by the test: P(yes) = 0.9 when the question names a War
    movie, 0.2 otherwise (so fit and goal both follow the genre), as log-probs of (yes, no)."""

    runtime = "question-stand-in"

    def __init__(self, **kwargs):
        super().__init__("stand-in", **kwargs)
        self.readings = 0

    def _generate(self, conversations, params):
        raise AssertionError("question heads do not generate")

    def _digit_logprobs(self, conversations, prefix):
        raise AssertionError("not used")

    def _choice_logprobs(self, conversations, prefix, choices):
        self.readings += len(conversations)
        out = []
        for conv in conversations:
            question = conv[-1]["content"].rsplit("Question:", 1)[1]
            p = 0.9 if "War" in question.split("?")[0] else 0.2
            out.append(DigitScores(np.log([p, 1 - p]), 100))
        return out


def _slate(ml100k, war_items):
    war = sorted(ml100k.items_with_tag("War"))[:2]
    other = [i for i in ml100k.item_ids.astype(str) if i not in war_items][:1]
    return [war[0], other[0], war[1]]


@pytest.mark.parametrize("head", ["yesno", "twostep"])
def test_question_head_likes_equal_a_threshold_over_the_logged_probabilities(
    ml100k, personas, war_items, head
):
    llm = QuestionLLM()
    settings = DecisionSettings(decision=head, threshold=0.6)
    policy = LLMPopulationPolicy(llm, ml100k, {"probe_0": personas[0]}, target=["War"], settings=settings)
    ids = _slate(ml100k, war_items)
    obs = {"probe_0": {"slate": ml100k.indices(ids), "source": 0, "round": 0}}
    info = {"probe_0": {"slate_item_ids": ids, "round": 0, "slate_source": "recommender"}}
    actions, failed = policy.act(obs, info, slate_size=3, budget=4)
    assert not failed
    logged = json.loads(policy.reply("probe_0", 1))
    p = np.column_stack([logged[k] for k in logged])  # item x question
    assert p.shape == (3, 1 if head == "yesno" else 2)
    assert list(actions["probe_0"]["likes"]) == list((p >= 0.6).all(axis=1).astype(int))
    assert list(actions["probe_0"]["likes"]) == [1, 0, 1]
    assert llm.readings == 3 * p.shape[1]  # one reading per question, no generation
    assert policy.meter.usage(personas[0].probe_id).prompt_tokens == 100 * llm.readings


def test_head_and_threshold_change_the_cache_key(tmp_path, ml100k, personas, war_items):
    cache = ResponseCache(tmp_path / "c.sqlite")
    ids = _slate(ml100k, war_items)
    obs = {"probe_0": {"slate": ml100k.indices(ids), "source": 0, "round": 0}}
    info = {"probe_0": {"slate_item_ids": ids, "round": 0, "slate_source": "recommender"}}
    counts = []
    for head, threshold in (("yesno", 0.5), ("yesno", 0.5), ("yesno", 0.7), ("twostep", 0.5)):
        llm = QuestionLLM(cache=cache)
        policy = LLMPopulationPolicy(
            llm,
            ml100k,
            {"probe_0": personas[0]},
            target=["War"],
            settings=DecisionSettings(decision=head, threshold=threshold),
        )
        policy.act(obs, info, slate_size=3, budget=4)
        counts.append(llm.readings)
    assert counts == [3, 0, 3, 6]  # the same head and threshold replay; another of either is a new key


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"decision": "xml"}, "decision must be one of"),
        ({"decision_threshold": 1.5}, "strictly between 0 and 1"),
        ({"decision_threshold": 0.0}, "strictly between 0 and 1"),
        ({"decision": "yesno", "allow_search": True}, "no search tool"),
    ],
)
def test_bad_decisions_are_config_errors_before_any_model_loads(kwargs, message):
    from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig

    with pytest.raises(ConfigError, match=message):
        CtrlBenchConfig(llm="no-such-model-is-loaded", **kwargs)
