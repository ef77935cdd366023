"""PromptShift prompts (section 5.2) and numbered-list parsing."""
import pytest

from ctrlsim.errors import ConfigError, LLMOutputError
from ctrlsim.recommenders.promptshift.generation import (
    HISTORY_ONLY,
    PARAPHRASE_CONDITIONS,
    LLMListGenerator,
    PromptCondition,
    build_messages,
    cue_sentence,
    dedupe_titles,
    parse_numbered_list,
)

HISTORY = [f"Movie {k} (199{k % 10})" for k in range(1, 26)]


def test_cue_sentences_word_for_word():
    assert cue_sentence("gender_F") == "The user's profile: gender is female."
    assert cue_sentence("gender_M") == "The user's profile: gender is male."
    assert cue_sentence("age_young_adult") == "The user's profile: age group is young adult."
    assert cue_sentence("age_middle_aged") == "The user's profile: age group is middle-aged."
    assert cue_sentence("cross_F_young_adult") == \
        "The user's profile: gender is female and age group is young adult."
    assert cue_sentence("cross_M_older") == "The user's profile: gender is male and age group is older."
    with pytest.raises(ConfigError):
        cue_sentence("occupation_writer")


def test_conditions_differ_only_where_the_paper_says():
    base = build_messages(HISTORY, HISTORY_ONLY, 30)
    cued = build_messages(HISTORY, PromptCondition("history", "gender_F"), 30)
    system = {"role": "system", "content": "You are a professional movie recommendation system."}
    assert base[0] == cued[0] == system
    # the cued prompt is the history-only prompt plus exactly one leading sentence
    assert cued[1]["content"] == "The user's profile: gender is female.\n" + base[1]["content"]
    assert base[1]["content"].startswith(
        "Use the viewing history below to recommend movies this viewer is likely to enjoy.\n")
    paras = [build_messages(HISTORY, c, 30)[1]["content"] for c in PARAPHRASE_CONDITIONS]
    assert paras[0].startswith("Choose movies this viewer is likely to enjoy based on the viewing "
                               "history below.")
    assert paras[1].startswith("Infer this viewer's movie preferences from the viewing history below and "
                               "recommend matching movies.")
    assert paras[2].startswith("Based on the demonstrated preferences in the viewing history below, please "
                               "provide suitable movie recommendations for this viewer.")
    tail = base[1]["content"].split("\n", 1)[1]
    assert all(p.split("\n", 1)[1] == tail for p in paras)  # same history and request
    # ordered 25-item history, then the request for 30 numbered candidates
    assert "\n1. Movie 1 (1991)\n" in tail and "\n25. Movie 25 (1995)\n" in tail
    assert tail.index("Movie 1 (") < tail.index("Movie 25 (")
    assert "Recommend 30 new movies" in tail and "numbered list from 1 to 30" in tail


def test_music_domain_wording():
    msgs = build_messages(["A - B"], PromptCondition("p2"), 30, domain="music")
    assert msgs[0]["content"] == ("You are a professional music recommendation system that recommends "
                                  "individual songs.")
    assert msgs[1]["content"].startswith("Infer this listener's track preferences from the listening "
                                         "history below")


def test_condition_names_round_trip():
    for cond in (HISTORY_ONLY, *PARAPHRASE_CONDITIONS, PromptCondition("history", "cross_F_older")):
        assert PromptCondition.from_name(cond.name) == cond
    with pytest.raises(ConfigError):
        PromptCondition("p9")


@pytest.mark.parametrize("text, expected", [
    ("1. The Shining (1980)\n2. Alien (1979)", ["The Shining (1980)", "Alien (1979)"]),
    ("Sure! Here are my picks:\n\n1) Heat\n2) Fargo (1996)\n\nEnjoy!", ["Heat", "Fargo (1996)"]),
    ("- Heat (1995)\n* Se7en\n• Casino (1995)", ["Heat (1995)", "Se7en", "Casino (1995)"]),
    ("1. **Heat** (1995) - a tense crime drama\n2. \"Fargo\" (1996): snowy noir",
     ["Heat (1995)", "Fargo (1996)"]),
    ("10: Toy Story (1995)\n11. 'Til There Was You (1997)",
     ["Toy Story (1995)", "'Til There Was You (1997)"]),
    ("1994 (Legends of the Fall)\n1996 (Fargo)", ["Legends of the Fall (1994)", "Fargo (1996)"]),
])
def test_parse_list_formats(text, expected):
    assert parse_numbered_list(text) == expected


@pytest.mark.parametrize("text", ["", "I'm sorry, I can't recommend movies.", "Heat\nFargo"])
def test_no_list_raises(text):
    with pytest.raises(LLMOutputError) as err:
        parse_numbered_list(text)
    assert err.value.text == text


def test_dedupe_keeps_first_occurrence():
    assert dedupe_titles(["Heat (1995)", "heat", "Fargo", "The Fargo (1996)", "Casino"]) == \
        ["Heat (1995)", "Fargo", "The Fargo (1996)", "Casino"]


class FakeLLM:
    """Replays canned replies (the real models are exercised in the env tests)."""

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []
        self.identity = {"runtime": "fake", "model": "fake"}

    def chat(self, conversations, **kwargs):
        from ctrlsim.backends import Completion

        self.calls.append((conversations, kwargs))
        return [Completion(self.replies.pop(0), 100, 20) for _ in conversations]


def test_generator_batches_parses_and_records_errors():
    llm = FakeLLM(["1. Heat (1995)\n2. Heat (1995)\n3. Fargo (1996)\n4. Casino (1995)", "no list here"])
    gen = LLMListGenerator(llm, n=3)
    out = gen.generate([(HISTORY, HISTORY_ONLY), (HISTORY, PromptCondition("history", "gender_M"))])
    assert len(llm.calls) == 1 and len(llm.calls[0][0]) == 2  # one batched call
    kwargs = llm.calls[0][1]
    assert kwargs["temperature"] == 0.0 and kwargs["max_tokens"] == 16 * 3 + 32 and kwargs["stop"] == ["\n4."]
    assert out[0].titles == ["Heat (1995)", "Fargo (1996)", "Casino (1995)"] and out[0].error is None
    assert out[0].raw_count == 4 and out[0].condition == "history"
    assert out[1].titles == [] and "no numbered list" in out[1].error and out[1].condition == "cue:gender_M"
