"""Reading LLM replies: a lenient JSON-object finder and the probe decision parser.

Constrained decoding (a JSON schema) makes replies well-formed where the runtime supports
it; elsewhere small models wrap JSON in code fences or prose, so the finder accepts the first
JSON object anywhere in the text. What the object says is then checked strictly: an
out-of-range or repeated position is not guessed at, it makes the round a skip that the
probe counts as a parse failure (issue 9, point 8).

With the negative-feedback button (`parse_decision(..., buttons=True)`, issue 48) a reply may also
list positions "not_interested"; their errors are parse failures too. A position both liked and
marked not interested is resolved by one rule: the like wins (the mark is dropped and reported in
`Decision.conflicts`), so the button never costs a round's likes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from ctrlsim.envs.engine import QUERY_CHARSET

from ctrlsim.errors import LLMOutputError

MAX_QUERY_CHARS = 64
LIKE_KEYS = ("like", "likes", "liked")
QUERY_KEYS = ("search", "query")
NOT_INTERESTED_KEYS = ("not_interested", "not interested", "not-interested")
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
    """A parsed decision: liked slate positions (0-based, ascending) and a search query ("" = none);
    with the button, the positions marked not interested (0-based, ascending, none liked) and the
    positions both liked and marked, whose mark was dropped."""

    likes: tuple[int, ...]
    query: str = ""
    not_interested: tuple[int, ...] = ()
    conflicts: tuple[int, ...] = ()


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


def _positions(obj: dict, names: tuple[str, ...], n_shown: int, text: str) -> list[int]:
    """The 0-based positions listed under `names` ([] when absent or null)."""
    _, values = _lookup(obj, names)
    if values is None:
        values = []
    elif not isinstance(values, list):
        values = [values]
    positions = [_position(v, n_shown, text) for v in values]
    if len(set(positions)) != len(positions):
        raise LLMOutputError(f"repeated positions {[p + 1 for p in positions]}", text)
    return positions


def parse_decision(text: str, n_shown: int, *, buttons: bool = False) -> Decision:
    """Parse a reply such as `{"like": [1, 3], "search": ""}` against a slate of `n_shown` items.

    Raises `LLMOutputError` for: no JSON object, no "like" key, positions that are not whole
    numbers, out of 1..n_shown, or repeated, and a search value that is not a string.

    `buttons` reads the "not_interested" positions too, checked as the likes are (absent = none).
    A position both liked and marked not interested stays liked (`Decision.conflicts` names it).
    Without `buttons` the key is ignored, as any other unknown key.
    """
    obj = extract_json_object(text)
    if obj is None:
        raise LLMOutputError("no JSON object in the reply", text)
    found, _ = _lookup(obj, LIKE_KEYS)
    if not found:
        raise LLMOutputError('the JSON object has no "like" key', text)
    positions = _positions(obj, LIKE_KEYS, n_shown, text)
    _, query = _lookup(obj, QUERY_KEYS)
    if query is None:
        query = ""
    if not isinstance(query, str):
        raise LLMOutputError(f"search {query!r} is not a string", text)
    decision = Decision(tuple(sorted(positions)), clean_query(query))
    if not buttons:
        return decision
    marked = _positions(obj, NOT_INTERESTED_KEYS, n_shown, text)
    return replace(decision, not_interested=tuple(sorted(set(marked) - set(positions))),
                   conflicts=tuple(sorted(set(marked) & set(positions))))


def decision_schema(n_shown: int, *, search: bool = True, buttons: bool = False) -> dict:
    """The JSON schema for constrained decoding: liked positions among 1..n_shown, (with `buttons`)
    positions marked not interested, and (with `search`) a query."""
    positions = {"type": "array", "items": {"type": "integer", "enum": list(range(1, n_shown + 1))},
                 "maxItems": n_shown}
    properties: dict = {"like": positions}
    if buttons:
        properties["not_interested"] = dict(positions)
    if search:
        properties["search"] = {"type": "string", "maxLength": MAX_QUERY_CHARS}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


_NUMBERS = re.compile(r"\b(\d{1,2})\b")


def parse_free_numbers(text: str, n_shown: int) -> Decision:
    """The naive baseline's parser: every distinct number 1..n_shown in a free-text reply is a like."""
    positions = sorted({int(m) - 1 for m in _NUMBERS.findall(text) if 1 <= int(m) <= n_shown})
    return Decision(tuple(positions), "")
