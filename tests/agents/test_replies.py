"""Decision replies: what counts as a usable decision and what is a skipped (counted) round."""
import jsonschema
import pytest
from ctrlsim.agents.replies import (
    Decision,
    clean_query,
    decision_schema,
    extract_json_object,
    parse_decision,
    parse_free_numbers,
)

from ctrlsim.errors import LLMOutputError

MALFORMED = {
    "prose": "I would like the first and the third movie.",
    "empty": "",
    "whitespace": "   \n ",
    "out of range high": '{"like": [4], "search": ""}',
    "out of range zero": '{"like": [0], "search": ""}',
    "negative": '{"like": [-1], "search": ""}',
    "duplicate": '{"like": [2, 2], "search": ""}',
    "duplicate as string": '{"like": [1, "1"], "search": ""}',
    "fraction": '{"like": [1.5], "search": ""}',
    "word": '{"like": ["two"], "search": ""}',
    "boolean": '{"like": [true], "search": ""}',
    "no like key": '{"search": "film noir"}',
    "search not a string": '{"like": [1], "search": 7}',
    "truncated json": '{"like": [1, 3], "sea',
    "a list, not an object": "[1, 3]",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_replies_are_errors(name):
    with pytest.raises(LLMOutputError):
        parse_decision(MALFORMED[name], 3)


def test_at_least_ten_malformed_cases():
    assert len(MALFORMED) >= 10


@pytest.mark.parametrize("text, expected", [
    ('{"like": [3, 1], "search": ""}', Decision((0, 2), "")),
    ('```json\n{"like": [2], "search": "noir"}\n```', Decision((1,), "noir")),
    ('Sure! Here it is: {"likes": ["2"], "query": "war films"} Hope that helps.',
     Decision((1,), "war films")),
    ('{"Like": [], "Search": ""}', Decision((), "")),
    ('{"like": null}', Decision((), "")),
    ('{"like": 3, "search": null}', Decision((2,), "")),
])
def test_usable_replies(text, expected):
    assert parse_decision(text, 3) == expected


def test_query_is_reduced_to_the_action_alphabet():
    assert clean_query('film-noir "classics" (1940s)\n') == "film-noir classics 1940s"
    assert len(clean_query("x" * 200)) == 64


def test_extract_json_object_skips_non_objects():
    assert extract_json_object('[1] then {"a": 1}') == {"a": 1}
    assert extract_json_object("no braces") is None


def test_schema_accepts_exactly_the_valid_positions():
    schema = decision_schema(3)
    jsonschema.validate({"like": [1, 3], "search": ""}, schema)
    for bad in ({"like": [4], "search": ""}, {"like": [1]}, {"like": [1], "search": "", "x": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_naive_parser_takes_every_number_in_range():
    assert parse_free_numbers("I like 1 and 3, maybe 7.", 3) == Decision((0, 2), "")
