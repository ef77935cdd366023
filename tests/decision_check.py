"""An independent reader of probe decisions, for tests that count parse failures exactly.

Deliberately not `ctrlsim.agents.replies`: a test compares that parser's verdicts with this one.
"""
from __future__ import annotations

import json
import re


def usable_decision(text: str, n_shown: int) -> bool:
    """A reply is usable when it is (or holds, e.g. in a code fence) a JSON object whose "like" is a
    whole number or a list of distinct whole numbers in 1..n_shown, and whose "search" (if any) is a
    string."""
    match = re.search(r"\{.*\}", text, re.S)
    try:
        value = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        return False
    if not isinstance(value, dict) or "like" not in value:
        return False
    like = value["like"] if isinstance(value["like"], list) else [value["like"]]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= n_shown for v in like):
        return False
    return len(set(like)) == len(like) and isinstance(value.get("search", ""), str)
