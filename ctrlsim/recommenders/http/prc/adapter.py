"""ctrlsim's user states as PRC ranking requests (docs/prc.md), and the rule that chooses each request's
candidate pool.

A PRC ranker reorders the items a platform was about to show; it never ranks a whole catalogue. So
when ctrlsim asks a PRC box for the top k of the catalogue, the box first chooses a pool, by a rule
that is a pure function of the state and the box's options (so a request, and its exchange key, is
the same every time):

* the eligible items are the catalogue minus the history (when `exclude_history`) minus the items
  already shown (when `mask_shown`); a caller's own candidate pool, when given, replaces the catalogue;
* `pool="sample"` (the default) draws `max(pool_size, k)` eligible items without replacement, with a
  generator seeded by SHA-256 of (`pool_seed`, user id, history, shown items): the user's not-yet-shown
  items, a fresh draw whenever the user's state changes;
* `pool="head"` takes the `max(pool_size, k)` most popular eligible items (ties in catalogue order);
* a caller's candidate pool is sent whole (after the exclusions), whatever `pool_size` says.

The pool is sent in catalogue order, numbered by `original_rank`, so its order carries no ranking.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import UserState

POOL_RULES = ("sample", "head")
PLATFORM_URLS = {
    "reddit": "https://www.reddit.com/",
    "twitter": "https://x.com/home",
    "facebook": "https://www.facebook.com/",
}
PRC_DEFAULTS: dict[str, Any] = {
    "pool": "sample",
    "pool_size": 100,
    "pool_seed": 0,
    "platform": "reddit",
    "send_state": True,
}
# Fixed, so that the same state always makes the same request (exchange keys, replay).
SESSION_TIME = "2024-01-01T00:00:00Z"
ANONYMOUS_USER = "ctrlsim-anonymous"
STATE_FIELD = "ctrlsim"  # the extension field carrying ctrlsim's user state (PRC rankers ignore it)


def checked_prc_options(options: dict[str, Any]) -> dict[str, Any]:
    """The PRC box's own options (strings from a URL fragment too), typed; a bad one is a `ConfigError`."""
    out = {**PRC_DEFAULTS, **options}
    if out["pool"] not in POOL_RULES:
        raise ConfigError(f"PRC box option pool must be one of {list(POOL_RULES)}, got {out['pool']!r}")
    for key in ("pool_size", "pool_seed"):
        try:
            value = int(out[key])
        except (TypeError, ValueError):
            raise ConfigError(f"PRC box option {key} must be a whole number, got {out[key]!r}") from None
        if (
            isinstance(out[key], bool)
            or value < (1 if key == "pool_size" else 0)
            or str(value) != str(out[key])
        ):
            raise ConfigError(
                f"PRC box option {key} must be a whole number >= "
                f"{1 if key == 'pool_size' else 0}, got {out[key]!r}"
            )
        out[key] = value
    if out["platform"] not in PLATFORM_URLS:
        raise ConfigError(
            f"PRC box option platform must be one of {list(PLATFORM_URLS)}, got {out['platform']!r}"
        )
    if isinstance(out["send_state"], str):
        if out["send_state"].lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"PRC box option send_state must be true or false, got {out['send_state']!r}")
        out["send_state"] = out["send_state"].lower() in ("true", "1")
    return out


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def choose_pool(
    dataset: Dataset,
    state: UserState,
    k: int,
    *,
    rule: str,
    size: int,
    seed: int,
    exclude_history: bool,
    mask_shown: bool,
    candidates: Sequence[str] | None = None,
) -> list[str]:
    """The item ids one request ranks (see the module docstring), in catalogue order."""
    ids = dataset.item_ids
    banned = (set(state.history) if exclude_history else set()) | (set(state.shown) if mask_shown else set())
    if candidates is not None:
        index = dataset.item_index
        chosen = sorted({index[c] for c in candidates if c not in banned})
        return [str(ids[i]) for i in chosen]
    eligible = np.array([n for n, item in enumerate(ids) if str(item) not in banned], dtype=np.int64)
    n = min(len(eligible), max(size, k))
    if rule == "head":
        popularity = dataset.items["popularity"].to_numpy()[eligible]
        picked = eligible[np.argsort(-popularity, kind="stable")[:n]]
    else:
        key = _digest("ctrlsim-prc-pool", seed, state.user_id, list(state.history), list(state.shown))
        rng = np.random.default_rng(int(key[:16], 16))
        picked = rng.choice(eligible, size=n, replace=False) if n else eligible[:0]
    return [str(ids[i]) for i in np.sort(picked)]


def state_extension(state: UserState) -> dict:
    """ctrlsim's user state as the contract's `State` (without a pool), for the `ctrlsim` extension field."""
    from ctrlsim.recommenders.http.lineage import negative_fields, plain_attributes

    return {
        "history": list(state.history),
        "profile": state.profile,
        "attributes": plain_attributes(state.attributes),
        "shown": list(state.shown),
        **negative_fields(state),
    }


def _engagements(platform: str, popularity: int) -> dict:
    if platform == "reddit":
        return {"score": popularity, "comment": 0, "award": 0}
    if platform == "twitter":
        return {"retweet": 0, "like": popularity, "comment": 0, "share": 0}
    return {
        "like": popularity,
        "love": 0,
        "care": 0,
        "haha": 0,
        "wow": 0,
        "sad": 0,
        "angry": 0,
        "comment": 0,
        "share": 0,
    }


def ranking_request(
    dataset: Dataset, state: UserState, pool: Sequence[str], *, platform: str, send_state: bool
) -> dict:
    """The PRC `RankingRequest` body for one state and its pool: a session naming the user (the state's
    `user_id`, or "ctrlsim-anonymous"), and one post per pool item built from the catalogue: its text
    (title, year, genres, description), its title, its first genre hashed as the author, its popularity
    as the engagement count, its year as the creation date."""
    user = state.user_id or ANONYMOUS_USER
    rows = dataset.items.iloc[[dataset.item_index[i] for i in pool]]
    posts = []
    for rank, (item, (_, row)) in enumerate(zip(pool, rows.iterrows())):
        year = row["year"]
        tags = tuple(row["tags"])
        created = SESSION_TIME if pd.isna(year) else f"{int(year):04d}-01-01T00:00:00Z"
        posts.append(
            {
                "id": str(item),
                "original_rank": rank,
                "title": str(row["title"]) if platform == "reddit" else None,
                "text": str(row["text"]),
                "author_name_hash": _digest("author", tags[0] if tags else "")[:16],
                "type": "post",
                "embedded_urls": None,
                "created_at": created,
                "engagements": _engagements(platform, int(row["popularity"])),
            }
        )
    body: dict[str, Any] = {
        "session": {
            "session_id": "ctrlsim-" + _digest(user, list(state.history), list(state.shown))[:16],
            "user_id": user,
            "user_name_hash": _digest("user", user)[:16],
            "platform": platform,
            "url": PLATFORM_URLS[platform],
            "current_time": SESSION_TIME,
        },
        "items": posts,
    }
    if send_state:
        body[STATE_FIELD] = state_extension(state)
    return body
