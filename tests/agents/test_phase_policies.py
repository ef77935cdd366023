"""Policies in steer-then-release episodes: the oracle, random and LLM probes follow the phase the
env announces, and "skip" releases like nothing; checked against hand simulations."""
import pytest
from ctrlsim.agents import DecisionSettings, LLMPopulationPolicy, Population, play_population
from ctrlsim.agents.methods import MethodContext, build_oracle
from ctrlsim.agents.profiles import ProfileGenerator, ProfileSettings
from ctrlsim.envs import PhasePlan, PopulationEnv
from stand_in_llm import StandInLLM

from ctrlsim.backends.llm import Completion

B, S, R = "baseline", "steer", "release"
TARGET = "Horror"
ROUND_KEYS = {"slate", "source", "liked", "query", "reply"}


@pytest.fixture(scope="module")
def personas(ml100k):
    gen = ProfileGenerator(ml100k, None)
    return [gen.template_persona(u, gen.seed_items(u, 0)) for u in ("1", "2", "3")]


def oracle_population(ml100k, pop_rec):
    context = MethodContext(ml100k, pop_rec, (TARGET,), frozenset(ml100k.items_with_tag(TARGET)), seed=0,
                            k_large=3, k_small=3, rounds=7, slate_size=3,
                            decision_settings=DecisionSettings(), profile_settings=ProfileSettings(),
                            llm_factory=lambda: None)
    return build_oracle(context)


def by_hand(ml100k, seed_history, plan: PhasePlan, slate_size: int = 3):
    """Slates and likes of the oracle on the popularity box (shown items masked), from the item table:
    targets while steering, items sharing a tag with the seed history otherwise, nothing in a skip."""
    ids, tags, pop = (ml100k.items[c].tolist() for c in ("item_id", "tags", "popularity"))
    order = [ids[i] for i in sorted(range(len(ids)), key=lambda i: (-pop[i], i))]
    tags_of = dict(zip(ids, tags))
    seed_tags = {t for i in seed_history for t in tags_of[i]}
    persona = {i for i in ids if seed_tags & set(tags_of[i])}
    target = {i for i in ids if TARGET in tags_of[i]}
    history, shown, slates, likes = list(seed_history), set(), [], []
    for round_no in range(1, plan.total + 1):
        slate = [i for i in order if i not in history and i not in shown][:slate_size]
        phase = plan.phase_of(round_no)
        wanted = set() if plan.skips(round_no) else target if phase == S else persona
        liked = [i for i in slate if i in wanted]
        slates.append(slate)
        likes.append(liked)
        history += liked
        shown |= set(slate)
    return slates, likes


@pytest.mark.parametrize("mode", ["baseline", "skip"])
def test_oracle_seeks_targets_only_while_steering(ml100k, pop_rec, mode):
    plan = PhasePlan(2, 3, 2, mode)
    population = oracle_population(ml100k, pop_rec)
    env = PopulationEnv(pop_rec, n_agents=3, target=TARGET, phases=plan)
    trace = play_population(env, population, seed=0)
    target = set(ml100k.items_with_tag(TARGET))
    steer_targets = other_likes = 0
    for probe in trace.probes:
        slates, likes = by_hand(ml100k, probe.seed_history, plan)
        assert [r["slate"] for r in probe.rounds] == slates
        assert [r["liked"] for r in probe.rounds] == likes
        assert [r["phase"] for r in probe.rounds] == [B, B, S, S, S, R, R]
        steer_targets += sum(len(x) for x in likes[2:5])
        other_likes += sum(len(x) for x in likes[:2] + likes[5:])
        if mode == "skip":
            assert likes[5:] == [[], []] and all(len(s) == 3 for s in slates[5:])
    assert steer_targets > 0 and other_likes > 0  # both rules were exercised
    # the persona rule is not the target rule: some baseline like is not a target
    assert any(i not in target for p in trace.probes for r in p.rounds[:2] for i in r["liked"])


def test_random_probes_flip_the_same_coins_in_every_phase(ml100k, pop_rec, personas):
    population = Population(tuple(personas), "random")
    phased = play_population(PopulationEnv(pop_rec, n_agents=3, target=TARGET, phases=PhasePlan(2, 3, 2)),
                             population, seed=4, like_prob=0.5)
    plain = play_population(PopulationEnv(pop_rec, n_agents=3, target=TARGET, budget=7), population,
                            seed=4, like_prob=0.5)
    assert [p.likes_per_round for p in phased.probes] == [p.likes_per_round for p in plain.probes]
    assert any(x for p in plain.probes for x in p.likes_per_round)
    for probe in plain.probes:  # records without phases are as before: no "phase"
        assert all(set(r) == ROUND_KEYS for r in probe.rounds)
    for probe in phased.probes:
        assert all(set(r) == ROUND_KEYS | {"phase"} for r in probe.rounds)


class RecordingLLM(StandInLLM):
    """Likes the first item of every slate and keeps each call's distinct system texts."""

    def __init__(self):
        super().__init__("recorder", 0.5, 0.5)
        self.systems: list[set[str]] = []

    def _generate(self, conversations, params):
        self.systems.append({c[0]["content"] for c in conversations})
        return [Completion('{"like": [1], "search": ""}', 10, 5) for _ in conversations]


@pytest.mark.parametrize("mode", ["baseline", "skip"])
def test_llm_probes_see_the_goal_only_while_steering(ml100k, pop_rec, personas, mode):
    llm = RecordingLLM()
    env = PopulationEnv(pop_rec, n_agents=3, target=TARGET, phases=PhasePlan(2, 3, 2, mode))
    trace = play_population(env, Population(tuple(personas)), seed=0, target=(TARGET,), llm=llm)
    agents = {f"probe_{n}": p for n, p in enumerate(personas)}
    shown = LLMPopulationPolicy(None, ml100k, agents, target=[TARGET]).system_text(3)
    hidden = LLMPopulationPolicy(None, ml100k, agents, target=[TARGET],
                                 settings=DecisionSettings(target_visible=False)).system_text(3)
    assert shown != hidden and TARGET in shown and TARGET not in hidden
    asked = [B, B, S, S, S] + ([R, R] if mode == "baseline" else [])
    assert llm.systems == [{shown if phase == S else hidden} for phase in asked]  # one text per call
    for probe in trace.probes:
        released = probe.rounds[5:]
        if mode == "skip":  # no LLM call: nothing liked, no reply, the slate still shown
            assert [(r["liked"], r["reply"], len(r["slate"])) for r in released] == [([], None, 3)] * 2
        else:
            assert [r["liked"] for r in released] == [[r["slate"][0]] for r in released]


def test_question_heads_ask_the_goal_question_only_while_steering(ml100k, personas):
    policy = LLMPopulationPolicy(None, ml100k, {"probe_0": personas[0]}, target=[TARGET],
                                 settings=DecisionSettings(decision="twostep"))

    def info(phase):
        return {"slate_item_ids": ["1", "2", "3"], "round": 0, "slate_source": "recommender", "phase": phase}

    assert [len(policy.questions("probe_0", info(p), 3, 7)) for p in (B, S, R)] == [3, 6, 3]
    assert len(policy.questions("probe_0", {k: v for k, v in info(B).items() if k != "phase"}, 3, 7)) == 6


def test_oracle_steering_away_likes_its_persona_without_the_target(ml100k, pop_rec):
    plan = PhasePlan(1, 3, 1, direction="away")
    env = PopulationEnv(pop_rec, n_agents=3, target=TARGET, phases=plan)
    trace = play_population(env, oracle_population(ml100k, pop_rec), seed=0)
    ids, tags = ml100k.items["item_id"].tolist(), ml100k.items["tags"].tolist()
    tags_of = dict(zip(ids, tags))
    steered = 0
    for probe in trace.probes:
        seed_tags = {t for i in probe.seed_history for t in tags_of[i]}
        for r in probe.rounds:
            persona = [i for i in r["slate"] if seed_tags & set(tags_of[i])]
            want = [i for i in persona if TARGET not in tags_of[i]] if r["phase"] == S else persona
            assert r["liked"] == want
            steered += r["phase"] == S and len(want) < len(persona)
    assert steered  # a persona item that is a target was left unliked while steering away


def test_llm_probes_steering_away_are_asked_to_see_less(ml100k, personas):
    from ctrlsim.agents import prompts

    agents = {"probe_0": personas[0]}
    policy = LLMPopulationPolicy(None, ml100k, agents, target=[TARGET])
    away = {"slate_item_ids": ["1", "2"], "round": 0, "slate_source": "recommender", "phase": S,
            "direction": "away"}
    text = policy.system_text(2, away)
    assert prompts.GOAL_AWAY.format(target=TARGET, **policy.nouns) in text
    assert text != policy.system_text(2, {**away, "direction": "toward"})
    assert policy.system_text(2, {**away, "phase": R}) == policy.system_text(2, {**away, "phase": R,
                                                                                  "direction": "toward"})
    twostep = LLMPopulationPolicy(None, ml100k, agents, target=[TARGET],
                                  settings=DecisionSettings(decision="twostep"))
    questions = [c[-1]["content"] for c in twostep.questions("probe_0", away, 2, 5)]
    assert len(questions) == 4 and "free of Horror" in questions[1] and "free of" not in questions[0]
