"""LLM probes press "not interested" themselves (issue 48, `--negative-feedback`): prompts and schema
show the button only when enabled, replies parse into likes + feedback by hand, a stand-in probe
model that dismisses items drives a ctrlbench episode whose records and box states show the
dismissals, and without the option every prompt is the text it was before the button."""
import json

import pytest
from ctrlsim.agents import DecisionSettings, LLMPopulationPolicy, Population, play_population
from ctrlsim.agents.persona import Persona
from ctrlsim.agents.replies import decision_schema, parse_decision
from ctrlsim.envs import PopulationEnv
from stand_in_llm import StandInLLM

from ctrlsim.backends.llm import Completion
from ctrlsim.errors import ConfigError, LLMOutputError
from ctrlsim.experiments.config import config_to_dict
from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig

# The system texts (ml-100k, slates of 3, target War shown) as they were before the buttons existed,
# stored: without --negative-feedback the probes must be asked exactly these.
BEFORE_NO_SEARCH = (
    "You play one user of a movie recommender website. You are shown your persona, what happened in "
    "your last rounds, and the 3 movies the website shows you now.\nYour goal: help the website discover "
    "as many different War movies as possible, by liking movies that fit your persona and that steer its "
    "recommendations towards War.\nEach round you may:\n- like any of the shown movies (give their "
    "numbers), or none of them (a skip).\nRules:\n1. Like only movies that fit your persona. Never like "
    "movies unrelated to your interests, even to reach the goal.\n2. Liking a movie tells the website "
    "what to recommend next.\nReply with one JSON object and nothing else, for example {\"like\": [2]}. "
    "\"like\" lists the numbers of the movies you like ([] to skip).")
BEFORE_SEARCH = (
    "You play one user of a movie recommender website. You are shown your persona, what happened in "
    "your last rounds, and the 3 movies the website shows you now.\nYour goal: help the website discover "
    "as many different War movies as possible, by liking movies that fit your persona and that steer its "
    "recommendations towards War.\nEach round you may:\n- like any of the shown movies (give their "
    "numbers), or none of them (a skip);\n- optionally type a short search query; then the next list "
    "shows search results instead of recommendations.\nRules:\n1. Like only movies that fit your "
    "persona. Never like movies unrelated to your interests, even to reach the goal.\n2. Liking a movie "
    "tells the website what to recommend next.\nReply with one JSON object and nothing else, for example "
    "{\"like\": [2], \"search\": \"\"}. \"like\" lists the numbers of the movies you like ([] to skip); "
    "\"search\" is a few words to search for, or \"\" to keep getting recommendations.")
# Ann's user text in round 2 after liking item 3 in round 1 (a reply that also pressed buttons,
# which a like-only probe ignores), as it was before.
BEFORE_USER = (
    "Your persona: Ann. Ann likes old war films.\nYour interests: war, drama\nMovies you liked before: "
    "Toy Story (1995), (Animation, Children's, Comedy); GoldenEye (1995), (Action, Adventure, Thriller)\n"
    "Your last rounds:\n- Round 1 (recommender) showed: Four Rooms (1995), (Thriller); Get Shorty (1995), "
    "(Action, Comedy, Drama); Copycat (1995), (Crime, Drama, Thriller). You liked: Four Rooms (1995).\n"
    "Round 2 of 10. The website now shows (recommender):\n1. Shanghai Triad (Yao a yao yao dao waipo qiao) "
    "(1995), (Drama)\n2. Twelve Monkeys (1995), (Drama, Sci-Fi)\n3. Babe (1995), (Children's, Comedy, "
    "Drama)\nWhich do you like?")
BEFORE_SCHEMA = {"type": "object",
                 "properties": {"like": {"type": "array", "items": {"type": "integer", "enum": [1, 2, 3]},
                                         "maxItems": 3}},
                 "required": ["like"], "additionalProperties": False}
ANN = Persona("p-ann", "Ann", "Ann likes old war films.", ("war", "drama"), ("1", "2"))
PRESSED = '{"like": [1], "not_interested": [2]}'


def info(ids, round_no=0, source="recommender"):
    return {"slate_item_ids": list(ids), "round": round_no, "slate_source": source}


def policy(ml100k, **settings):
    return LLMPopulationPolicy(None, ml100k, {"probe_0": ANN}, target=["War"],
                               settings=DecisionSettings(**settings))


# ----------------------------------------------------------------------------- prompts and schema

def test_without_the_option_prompts_schema_and_actions_are_as_before(ml100k):
    assert policy(ml100k, allow_search=False).system_text(3) == BEFORE_NO_SEARCH
    assert policy(ml100k).system_text(3) == BEFORE_SEARCH
    assert policy(ml100k, negative_feedback=False).system_text(3) == BEFORE_SEARCH
    plain = policy(ml100k, allow_search=False)
    action = plain._decide("probe_0", PRESSED, info(["3", "4", "5"]), 3)
    assert set(action) == {"likes", "query"} and action["likes"].tolist() == [1, 0, 0]
    assert plain.user_text(plain.probes["probe_0"], info(["6", "7", "8"], 1), 10) == BEFORE_USER
    assert set(plain.probe_stats("probe_0")) == {"decisions", "parse_failures", "searches",
                                                 "searches_refused", "failure_examples"}
    assert decision_schema(3, search=False) == BEFORE_SCHEMA


@pytest.mark.parametrize("search", [False, True])
def test_the_button_is_offered_only_when_enabled(ml100k, search):
    off = policy(ml100k, allow_search=search).system_text(3)
    on = policy(ml100k, allow_search=search, negative_feedback=True).system_text(3)
    for word in ("not_interested", "not interested"):
        assert word in on and word not in off
    assert ('"search"' in on) == search and "block" not in on and "dislike" not in on
    assert on.startswith(off[:off.index("Each round you may:")])  # role and goal as before
    schema = decision_schema(3, search=search, buttons=True)
    assert list(schema["properties"]) == ["like", "not_interested"] + (["search"] if search else [])
    assert schema["required"] == list(schema["properties"])
    assert schema["properties"]["not_interested"] == schema["properties"]["like"]
    assert decision_schema(3, search=search, buttons=False) == decision_schema(3, search=search)


def test_question_heads_stay_like_only():
    for head in ("yesno", "twostep"):
        with pytest.raises(ConfigError, match="--decision json with --negative-feedback"):
            DecisionSettings(decision=head, negative_feedback=True)
        with pytest.raises(ConfigError, match="--decision json with --negative-feedback"):
            CtrlBenchConfig(decision=head, negative_feedback=True)
    with pytest.raises(ConfigError, match="responsiveness presses them by script"):
        CtrlBenchConfig(task="responsiveness", decision="json", negative_feedback=True)
    assert "negative_feedback" not in config_to_dict(CtrlBenchConfig())  # stored configs unchanged
    on = CtrlBenchConfig(decision="json", negative_feedback=True)
    assert config_to_dict(on)["negative_feedback"] is True and on.decision_settings().negative_feedback


# ----------------------------------------------------------------------------- replies by hand

def test_replies_parse_into_likes_and_feedback():
    decision = parse_decision('```json\n{"like": [3], "not_interested": [2, "1"]}\n```', 3, buttons=True)
    assert (decision.likes, decision.not_interested, decision.conflicts) == ((2,), (0, 1), ())
    # the like wins: position 2 stays liked, its mark is dropped and named
    both = parse_decision('{"like": [2], "not_interested": [2, 3]}', 3, buttons=True)
    assert (both.likes, both.not_interested, both.conflicts) == ((1,), (2,), (1,))
    assert parse_decision('{"like": [], "not interested": 3}', 3, buttons=True).not_interested == (2,)
    assert parse_decision('{"like": [1]}', 3, buttons=True).not_interested == ()  # the key may be left out
    assert parse_decision(PRESSED, 3) == parse_decision('{"like": [1]}', 3)  # without the button: ignored
    for bad, why in (('{"like": [], "not_interested": [4]}', "outside 1..3"),
                     ('{"like": [], "not_interested": [2, 2]}', "repeated"),
                     ('{"like": [], "not_interested": ["x"]}', "whole number"),
                     ('{"like": [], "not_interested": [true]}', "not a number"),
                     ('{"not_interested": [1]}', 'no "like" key')):
        with pytest.raises(LLMOutputError, match=why):
            parse_decision(bad, 3, buttons=True)


def test_a_probe_with_the_button_acts_counts_and_remembers_it(ml100k):
    probe = policy(ml100k, allow_search=False, negative_feedback=True)
    action = probe._decide("probe_0", '{"like": [1], "not_interested": [2, 1], "search": "noir"}',
                           info(["3", "4", "5"]), 3)
    assert set(action) == {"likes", "query", "feedback"} and action["query"] == ""
    assert action["likes"].tolist() == [1, 0, 0] and action["feedback"].tolist() == [0, 1, 0]
    failed = probe._decide("probe_0", '{"like": [1], "not_interested": [5]}', info(["6", "7", "8"], 1), 3)
    assert failed["likes"].tolist() == failed["feedback"].tolist() == [0, 0, 0]  # a skipped round
    stats = probe.probe_stats("probe_0")
    assert {k: stats[k] for k in ("decisions", "parse_failures", "searches_refused", "dismissals",
                                  "feedback_conflicts")} == {"decisions": 2, "parse_failures": 1,
                                                             "searches_refused": 1, "dismissals": 1,
                                                             "feedback_conflicts": 1}
    assert "outside 1..3" in stats["failure_examples"][0]
    memory = probe.user_text(probe.probes["probe_0"], info(["9", "10", "11"], 2), 10)
    assert "You liked: Four Rooms (1995). You marked not interested: Get Shorty (1995).\n" in memory
    assert "Round 2 (recommender) showed: Shanghai Triad" in memory and "You liked: nothing.\n" in memory


# ----------------------------------------------------------------------------- episodes

class ButtonsLLM(StandInLLM):
    """Likes the first item of every slate and, where offered the button, marks the second not
    interested; keeps every system text and schema it was sent (constrained decoding)."""

    supports_json_schema = True

    def __init__(self, name="stand-in-buttons"):
        super().__init__(name, 0.5, 0.5)
        self.systems: set[str] = set()
        self.schemas: set[str] = set()

    def _generate(self, conversations, params):
        out = []
        for conv in conversations:
            system = conv[0]["content"]
            if not system.startswith("You play one user"):  # a persona: the stand-in's fixed sentence
                out.append(Completion("I am a movie fan who enjoys films of many kinds.", 10, 10))
                continue
            self.systems.add(system)
            self.schemas.add(params.json_schema or "")
            reply = {"like": [1], "not_interested": [2]} if "not_interested" in system else {"like": [1]}
            out.append(Completion(json.dumps(reply), 20, 12))
        return out


def test_play_population_turns_the_buttons_off_where_the_env_has_none(ml100k, pop_rec):
    llm = ButtonsLLM()
    env = PopulationEnv(pop_rec, n_agents=1, target="War", budget=2)  # no negative_feedback
    trace = play_population(env, Population((ANN,)), seed=0, target=("War",), llm=llm,
                            settings=DecisionSettings(allow_search=False, negative_feedback=True))
    assert all("not_interested" not in s for s in llm.systems) and not trace.probes[0].stats.get("dismissals")
    assert all("feedback" not in r for r in trace.probes[0].rounds)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def _run(tmp_path, name, **fields):
    import ctrlsim
    from ctrlsim.experiments.config import RunOptions

    llm = ButtonsLLM()
    config = CtrlBenchConfig(methods=("base-small",), recommenders=("popularity",), targets=("War",),
                             agents=(2, 2), rounds=3, seeds=(0,), decision="json", llm=llm.model_id, **fields)
    result = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / name)),
                         llms={llm.model_id: llm}, show_progress=False)
    assert not result.failed
    (record,) = result.records_by_key.values()
    return llm, record


def test_a_ctrlbench_episode_with_dismissing_probes_records_them_and_the_box_sees_them(
        tmp_path, ml100k, monkeypatch):
    from ctrlsim.recommenders.baselines import PopularityRecommender

    seen = []
    original = PopularityRecommender.score_all

    def watched(self, states):
        seen.extend(states)
        return original(self, states)

    monkeypatch.setattr(PopularityRecommender, "score_all", watched)
    llm, record = _run(tmp_path, "buttons", negative_feedback=True)
    assert llm.systems and all("not_interested" in s for s in llm.systems)
    assert llm.schemas == {json.dumps(decision_schema(3, search=False, buttons=True), sort_keys=True)}
    assert record["decision"]["negative_feedback"] is True
    assert len(record["probes"]) == 2
    for probe in record["probes"]:
        rounds = probe["rounds"]
        assert len(rounds) == 3 and probe["dismissals"] == 3
        assert probe["parse_failures"] == 0 and probe["feedback_conflicts"] == 0
        for r in rounds:  # what the probe dismissed, round by round
            assert r["liked"] == [r["slate"][0]]
            assert r["feedback"] == {"not_interested": [r["slate"][1]], "disliked": [], "block": None}
        dismissed = [r["slate"][1] for r in rounds]
        # the box's state for each later slate held every earlier dismissal
        states = [s for s in seen if s.user_id == probe["probe_id"]]
        assert [s.not_interested for s in states] == [tuple(dismissed[:k]) for k in range(len(states))]
        assert len(states) >= 3 and all(s.disliked == () and s.blocked_tags == () for s in states)


def test_a_ctrlbench_episode_without_the_option_asks_what_it_asked_before(tmp_path):
    llm, record = _run(tmp_path, "plain")
    goal = BEFORE_NO_SEARCH[BEFORE_NO_SEARCH.index("Your goal:"):BEFORE_NO_SEARCH.index("Each round")]
    # the episode's prompt and the validity checks' goal-free one, both as before
    assert llm.systems == {BEFORE_NO_SEARCH, BEFORE_NO_SEARCH.replace(goal, "")}
    assert llm.schemas == {json.dumps(BEFORE_SCHEMA, sort_keys=True)}
    assert "negative_feedback" not in record["decision"]
    for probe in record["probes"]:
        assert "dismissals" not in probe and all("feedback" not in r for r in probe["rounds"])


# ----------------------------------------------------------------------------- a real model

@pytest.mark.llm
def test_a_small_model_held_to_the_button_schema_marks_only_items_it_was_shown(ml100k, smol, pop_rec):
    env = PopulationEnv(pop_rec, n_agents=2, target="War", budget=2, negative_feedback=True)
    personas = (ANN, Persona("p-bob", "Bob", "Bob likes comedies.", ("comedy",), ("3", "4")))
    trace = play_population(env, Population(personas), seed=0, target=("War",), llm=smol,
                            settings=DecisionSettings(allow_search=False, negative_feedback=True))
    for probe in trace.probes:
        failures, marked = 0, []
        for r in probe.rounds:
            try:
                decision = parse_decision(r["reply"], len(r["slate"]), buttons=True)
            except LLMOutputError:
                failures += 1
                assert "feedback" not in r and r["liked"] == []  # an unusable reply: a skipped round
                continue
            assert set(json.loads(r["reply"])) == {"like", "not_interested"}  # held to the schema
            given = [r["slate"][n] for n in decision.not_interested]
            assert r.get("feedback", {"not_interested": []})["not_interested"] == given
            assert not set(given) & set(r["liked"])  # the like wins
            marked += given
        assert probe.stats["parse_failures"] == failures < len(probe.rounds) == 2
        assert probe.stats["dismissals"] == len(marked)
        assert env.probes[probe.agent].state(ml100k).not_interested == tuple(dict.fromkeys(marked))
