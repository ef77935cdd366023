"""The checks an HTTP black box makes of every ranked list a service answers
(`ctrlsim.recommenders.http.client`): the contract's schema, then each item against the request (a known
id, no duplicate, not excluded, in the candidate pool, at most k), and no list shorter than the
eligible items allow. A problem is a `RecommenderResponseError` naming the request and the field, or,
with `on_invalid="skip"`, the item is dropped and counted."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ctrlsim.recommenders.base import Slate, UserState
from ctrlsim.recommenders.http.transport import RecommenderResponseError

__all__ = ["checked_slates"]


def checked_slates(
    answer: Any,
    states: list[UserState],
    k: int,
    where: str,
    pools: list[list[str] | None],
    shown: list[set[str]],
    *,
    known: Mapping[str, int],
    exclude_history: bool,
    mask_shown: bool,
    on_invalid: str,
    count: Callable[[int, bool], None],
) -> list[Slate]:
    """One slate per state from a `RecommendResponse` body `answer` (`where`: the URL and endpoint,
    for errors; `shown`: what each state counts as shown; `known`: the catalogue's ids). `count(skipped
    items, short list)` hears of each list's problems when they are skipped."""
    from pydantic import ValidationError

    from ctrlsim.recommenders.http.contract import RecommendResponse

    try:
        parsed = RecommendResponse.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        field_name = ".".join(str(p) for p in first["loc"])
        raise RecommenderResponseError(
            f"{where}: the response breaks the contract at '{field_name}': {first['msg']}"
        ) from None
    if len(parsed.lists) != len(states):
        raise RecommenderResponseError(f"{where}: {len(parsed.lists)} lists for {len(states)} requested")
    slates = []
    for n, (ranked, state, pool, seen) in enumerate(zip(parsed.lists, states, pools, shown)):
        banned = (set(state.history) if exclude_history else set()) | (seen if mask_shown else set())
        allowed = set(pool) if pool is not None else None
        items: list[str] = []
        scores: list[float] = []
        problems: list[str] = []
        if ranked.scores is not None and len(ranked.scores) != len(ranked.items):
            raise RecommenderResponseError(
                f"{where}: lists[{n}].scores has {len(ranked.scores)} values for "
                f"{len(ranked.items)} items"
            )
        for pos, item in enumerate(ranked.items):
            problem = None
            if item not in known:
                problem = f"unknown item id {item!r}"
            elif item in items:
                problem = f"duplicate item {item!r}"
            elif item in banned:
                where_from = "history" if item in state.history else "shown items"
                problem = f"item {item!r} is in the user's {where_from}"
            elif allowed is not None and item not in allowed:
                problem = f"item {item!r} is not in the candidate pool"
            elif len(items) >= k:
                problem = f"more than k={k} items"
            if problem:
                problems.append(f"lists[{n}].items[{pos}]: {problem}")
                continue
            items.append(item)
            scores.append(ranked.scores[pos] if ranked.scores is not None else float(k - len(items) + 1))
        # Banned items are catalogue ids (histories and shown items are checked on the way in), so
        # the whole catalogue's count needs no set of every id.
        eligible = len(allowed - banned) if allowed is not None else len(known) - len(banned)
        if len(items) < min(k, eligible):
            problems.append(
                f"lists[{n}].items: {len(items)} valid items, fewer than k={k} "
                f"(and {eligible} items were eligible)"
            )
        if problems:
            if on_invalid == "error":
                raise RecommenderResponseError(
                    f"{where}: {'; '.join(problems[:5])}"
                    + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
                )
            count(sum("fewer than" not in p for p in problems), any("fewer than" in p for p in problems))
        values = np.asarray(scores, dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise RecommenderResponseError(f"{where}: lists[{n}].scores holds a value that is not finite")
        slates.append(Slate(items, values))
    return slates
