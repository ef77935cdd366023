"""Reading LLM replies: a lenient JSON-object finder and the probe decision parser.

Constrained decoding (a JSON schema) makes replies well-formed where the runtime supports
it; elsewhere small models wrap JSON in code fences or prose, so the finder accepts the first
JSON object anywhere in the text. What the object says is then checked strictly: an
out-of-range or repeated position is not guessed at, it makes the round a skip that the
probe counts as a parse failure (issue 9, point 8).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ctrlsim.envs.engine import QUERY_CHARSET

from ctrlsim.errors import LLMOutputError

MAX_QUERY_CHARS = 64
LIKE_KEYS = ("like", "likes", "liked")
QUERY_KEYS = ("search", "query")
_ALLOWED = set(QUERY_CHARSET)
_DECODER = json.JSONDecoder()


def extract_json_object(text: str) -> dict | None:
    """The first JSON object in `text` (code fences and surrounding prose ignored), or None."""
    stripped = text.strip()
    try:
        value = json.loads(stripped)
        if isinstance(value, dict):
            return value
    except json.JSONDecodeError:
        pass
    for match in re.finditer(r"\{", text):
        try:
            value, _ = _DECODER.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


@dataclass(frozen=True)
class Decision:
    """A parsed decision: liked slate positions (0-based, ascending) and a search query ("" = none)."""

    likes: tuple[int, ...]
    query: str = ""


def _lookup(obj: dict, names: tuple[str, ...]):
    lowered = {str(k).strip().lower(): v for k, v in obj.items()}
    for name in names:
        if name in lowered:
            return True, lowered[name]
    return False, None


def _position(value, n_shown: int, text: str) -> int:
    if isinstance(value, bool):
        raise LLMOutputError(f"position {value!r} is not a number", text)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        raise LLMOutputError(f"position {value!r} is not a whole number", text)
    if not 1 <= value <= n_shown:
        raise LLMOutputError(f"position {value} is outside 1..{n_shown}", text)
    return value - 1


def clean_query(query: str) -> str:
    """The query reduced to the characters the action space allows, at most 64 of them."""
    kept = "".join(ch if ch in _ALLOWED else " " for ch in query)
    return " ".join(kept.split())[:MAX_QUERY_CHARS].strip()


def parse_decision(text: str, n_shown: int) -> Decision:
    """Parse a reply such as `{"like": [1, 3], "search": ""}` against a slate of `n_shown` items.

    Raises `LLMOutputError` for: no JSON object, no "like" key, positions that are not whole
    numbers, out of 1..n_shown, or repeated, and a search value that is not a string.
    """
    obj = extract_json_object(text)
    if obj is None:
        raise LLMOutputError("no JSON object in the reply", text)
    found, likes = _lookup(obj, LIKE_KEYS)
    if not found:
        raise LLMOutputError('the JSON object has no "like" key', text)
    if likes is None:
        likes = []
    elif not isinstance(likes, list):
        likes = [likes]
    positions = [_position(v, n_shown, text) for v in likes]
    if len(set(positions)) != len(positions):
        raise LLMOutputError(f"repeated positions {[p + 1 for p in positions]}", text)
    _, query = _lookup(obj, QUERY_KEYS)
    if query is None:
        query = ""
    if not isinstance(query, str):
        raise LLMOutputError(f"search {query!r} is not a string", text)
    return Decision(tuple(sorted(positions)), clean_query(query))


def decision_schema(n_shown: int, *, search: bool = True) -> dict:
    """The JSON schema for constrained decoding: liked positions among 1..n_shown and (with
    `search`) a query."""
    properties: dict = {"like": {"type": "array", "items": {"type": "integer",
                                                             "enum": list(range(1, n_shown + 1))},
                                 "maxItems": n_shown}}
    if search:
        properties["search"] = {"type": "string", "maxLength": MAX_QUERY_CHARS}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


_NUMBERS = re.compile(r"\b(\d{1,2})\b")


def parse_free_numbers(text: str, n_shown: int) -> Decision:
    """The naive baseline's parser: every distinct number 1..n_shown in a free-text reply is a like."""
    positions = sorted({int(m) - 1 for m in _NUMBERS.findall(text) if 1 <= int(m) <= n_shown})
    return Decision(tuple(positions), "")
