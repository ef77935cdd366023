"""Every prompt SteerEval prints (§4.1 and appendix B), compared character for character.

The expected strings are typed from the paper's text; only its typographic quotes
(’ ” from the PDF) are written as plain ASCII quotes. Where the paper elides text
("$\\cdots$"), our own profile/item text stands in.
"""
import pandas as pd
import pytest
from ctrlsim.agents.steering import (
    LLM_APPEND_PROMPT,
    TEMPLATES,
    first_sentence,
    rewrite_prompt,
    template_sentence,
    trigger_phrase,
)

from ctrlsim.recommenders.prompts import SYSTEM, item_block, profile_messages, score_messages

STRANGER = pd.Series({"item_id": "1", "title": "The Stranger", "year": None, "tags": ("Film-Noir",),
                      "description": "An investigator from the War Crimes Commission travels to "
                                     "Connecticut."})
JUMANJI = pd.Series({"item_id": "2", "title": "Jumanji", "year": None, "tags": ("Adventure",),
                     "description": "When siblings Judy and Peter discover an enchanted board game."})
GHOSTS = "there are ghosts"
PROFILE = "The user has a strong affinity for timeless, historical epics, and coming-of-age stories."


def test_score_prediction_prompt_is_the_papers():
    expected = (
        "Task: Predict the user's rating for a movie on a scale from 0.0 to 5.0\n"
        "Guidelines:\n"
        "- 0.0: Completely irrelevant.\n"
        "- 5.0: Perfect match for ALL user interests.\n"
        "- Use decimal precision as necessary (e.g. 1.4, 3.7, 4.2) to capture partial matches.\n"
        "- Be strict. Do not give high scores for partial matches.\n"
        "Output format: A single float number only.\n"
        "\n"
        "USER PROFILE:\n"
        "The user has a strong affinity for timeless, historical epics, and coming-of-age stories.\n"
        "CANDIDATE MOVIE:\n"
        "Movie Title: The Stranger\n"
        "Movie Description: An investigator from the War Crimes Commission travels to Connecticut.\n"
        "SCORE:"
    )
    messages = score_messages(PROFILE, STRANGER)
    assert messages[-1] == {"role": "user", "content": expected}
    # the release's system message (the paper prints none)
    assert messages[0] == {"role": "system", "content": "Write a response that appropriately completes the "
                                                        "following request. Follow the instructions exactly."}
    assert SYSTEM == messages[0]["content"]


@pytest.mark.parametrize("style, instruction", [
    ("paragraph", "Given the user's previously watched and rated movies, write in a single paragraph (5-6 "
                  "sentences) summarizing their taste. Be definitive (no hedging). Do NOT mention tags, "
                  "genres, metadata, reviews, or any lack thereof. Infer tone, pacing, themes, and style."),
    ("sentence", "Given the user's previously watched and rated movies, write exactly ONE concise English "
                 "sentence (20-35 words) summarizing their taste. Be definitive (no hedging). Do NOT "
                 "mention tags, genres, metadata, reviews, or any lack thereof. Infer tone, pacing, themes, "
                 "and style."),
])
def test_profile_prompts_are_the_papers(style, instruction):
    expected = (f"{instruction}\n\nUser watch history:\n\n"
                "Movie Title: Jumanji\n"
                "Movie Description: When siblings Judy and Peter discover an enchanted board game.\n"
                "User Rating: 4.0")
    assert profile_messages([JUMANJI], [4.0], style)[-1] == {"role": "user", "content": expected}


def test_llm_append_prompt_is_the_papers():
    expected = (
        "You are helping a user update how they describe their movie preferences by rephrasing their changed "
        "preferences into a single sentence. This sentence will be appended to their original description.\n"
        "Guidelines:\n"
        "- Write exactly *one* sentence. The sentence must start with \"The user\".\n"
        "- Do not include any \"REQUEST\" in the response. Only give the rephrased sentence.\n"
        "- Use natural language.\n"
        "\n"
        "For example:\n"
        "REQUEST: The user *does not want* to see movies where [the dog dies].\n"
        "The user *does not want* to see any movies where a dog dies.\n"
        "\n"
        "REQUEST: The user *does not want* to see movies where there are ghosts."
    )
    request = template_sentence("there are ghosts", "trigger", "decrease")
    assert LLM_APPEND_PROMPT.format(request=request) == expected


def test_rewrite_prompt_is_the_papers():
    expected = (
        "Modify the user profile to show that the user *does not want* to see movies where there are "
        "ghosts.\n"
        "Keep all the profile as similar as possible for all other preferences.\n"
        "\n"
        "ORIGINAL PROFILE: The user has a strong affinity for timeless, historical epics, and coming-of-age "
        "stories.\n"
        "UPDATED PROFILE:"
    )
    assert rewrite_prompt("there are ghosts", "trigger", "decrease", PROFILE + "\n") == expected
    # not printed in the paper: the genre pair mirrors the genre-decrease template
    assert rewrite_prompt("Mystery", "genre", "increase", PROFILE).startswith(
        "Modify the user profile to show that the user *wants* to see Mystery movies.\n")


def test_section_4_1_templates():
    assert template_sentence("Mystery", "genre", "increase") == \
        "Please show the user movies that satisfy: Mystery."
    assert template_sentence("Mystery", "genre", "decrease") == \
        "The user *does not want* to see Mystery movies."
    assert template_sentence("the dog dies", "trigger", "increase") == \
        "The user *wants* to see movies where the dog dies."
    assert template_sentence("the dog dies", "trigger", "decrease") == \
        "The user *does not want* to see movies where the dog dies."


@pytest.mark.parametrize("kind, tag, direction, emphasis, expected", [
    ("genre", "Mystery", "increase", "stronger", "Please show the user movies *only* Mystery movies."),
    ("genre", "Mystery", "increase", "weaker", "Please show the user movies *more* Mystery movies."),
    ("genre", "Mystery", "decrease", "weaker", "Please show the user movies *less* Mystery movies."),
    ("genre", "Mystery", "decrease", "stronger", "Please show the user movies *no* Mystery movies."),
    ("trigger", GHOSTS, "increase", "stronger", "The user wants to see *only* movies where there are "
                                                "ghosts."),
    ("trigger", GHOSTS, "increase", "weaker", "The user wants to see *more* movies where there are ghosts."),
    ("trigger", GHOSTS, "decrease", "weaker", "The user wants to see *less* movies where there are ghosts."),
    ("trigger", GHOSTS, "decrease", "stronger", "The user wants to see *no* movies where there are ghosts."),
])
def test_appendix_b_emphasis_templates(kind, tag, direction, emphasis, expected):
    assert template_sentence(tag, kind, direction, emphasis) == expected
    assert len(TEMPLATES) == 12


def test_item_block_without_description_is_title_and_year_only():
    item = pd.Series({"item_id": "3", "title": "Scream", "year": 1996, "tags": ("Horror", "Thriller")})
    assert item_block(item) == "Movie Title: Scream (1996)"
    assert item_block(item, 4) == "Movie Title: Scream (1996)\nUser Rating: 4.0"
    assert item_block(item, show_tags=True) == \
        "Movie Title: Scream (1996)\nMovie Description: (Horror, Thriller)"


@pytest.mark.parametrize("question, phrase", [  # the paper's renamed tags (Table 6) from the DDD questions
    ("Is the fourth wall broken?", "the fourth wall is broken"),
    ("Does someone say \"I'll kill myself\"?", "someone says \"I'll kill myself\""),
    ("Are there babies or unborn children?", "there are babies or unborn children"),
    ("Does someone have an eating disorder?", "someone has an eating disorder"),
    ("Is there cannibalism?", "there is cannibalism"),
    ("Does someone miscarry?", "someone miscarries"),
    ("Does a head get squashed?", "a head gets squashed"),
    ("Does someone become unconscious?", "someone becomes unconscious"),
    ("Does the dog die?", "the dog dies"),
    ("Does someone drown?", "someone drowns"),
    ("The dog dies", "the dog dies"),  # already a clause: only the capital goes
])
def test_trigger_questions_become_template_clauses(question, phrase):
    assert trigger_phrase(question) == phrase


def test_llm_append_keeps_the_first_sentence_not_the_first_line():
    assert first_sentence("The user does not want\nto see Horror movies. They like comedies.") == \
        "The user does not want to see Horror movies."
    assert first_sentence("The user avoids gore! Extra.") == "The user avoids gore!"
    assert first_sentence("No full stop here") == "No full stop here"
