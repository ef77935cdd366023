"""Constrained JSON decoding: `chat(..., json_schema=...)` replies parse and validate."""
import json

import jsonschema
import pytest

from ctrlsim.backends import ResponseCache
from ctrlsim.errors import ConfigError

pytestmark = pytest.mark.llm

ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "maxLength": 40},
        "liked": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "stop": {"type": "boolean"},
    },
    "required": ["query", "liked", "stop"],
    "additionalProperties": False,
}


def probe_turn(goal):
    return [{"role": "system", "content": "You control a movie recommender. Reply with one JSON action."},
            {"role": "user",
             "content": f"Goal: {goal}. Give a search query, liked item ids and whether to stop."}]


def test_constrained_replies_parse_and_match_the_schema(smol):
    assert smol.supports_json_schema
    replies = smol.chat([probe_turn("find space operas"), probe_turn("more old westerns")],
                        max_tokens=96, json_schema=ACTION_SCHEMA)
    for reply in replies:
        assert reply.finish_reason == "stop"
        jsonschema.validate(json.loads(reply.text), ACTION_SCHEMA)  # raises if the reply breaks the schema


def test_unconstrained_reply_of_the_same_prompt_is_not_this_json(smol):
    # Shows the constraint does the work: the free reply of the tiny model is not schema-valid JSON.
    free = smol.chat([probe_turn("find space operas")], max_tokens=96)[0].text
    with pytest.raises((json.JSONDecodeError, jsonschema.ValidationError)):
        jsonschema.validate(json.loads(free), ACTION_SCHEMA)


def test_schema_is_part_of_the_cache_key(tmp_path, smol):
    cache = ResponseCache(tmp_path / "responses.sqlite")
    smol.cache = cache
    try:
        conv = [probe_turn("find space operas")]
        first = smol.chat(conv, max_tokens=64, json_schema=ACTION_SCHEMA)[0]
        reordered = dict(reversed(list(ACTION_SCHEMA.items())))  # same schema, other key order
        again = smol.chat(conv, max_tokens=64, json_schema=reordered)[0]
        assert again.cached and again.text == first.text
        other_schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
        other = smol.chat(conv, max_tokens=64, json_schema=other_schema)[0]
        free = smol.chat(conv, max_tokens=64)[0]
        assert not other.cached and not free.cached
        assert "title" in json.loads(other.text)
        assert len(cache) == 3
    finally:
        smol.cache = None
        cache.close()


def test_bad_schema_and_unsupported_runtime_are_config_errors(smol):
    with pytest.raises(ConfigError, match="json_schema must be a dict"):
        smol.chat([probe_turn("x")], json_schema='{"type": "object"}')
    smol.supports_json_schema = False  # as on the transformers runtime, which has no constrained decoding
    try:
        with pytest.raises(ConfigError, match="cannot constrain replies to a JSON schema"):
            smol.chat([probe_turn("x")], json_schema=ACTION_SCHEMA)
    finally:
        del smol.supports_json_schema
