"""Default probe rosters built from a dataset's users (CtrlBench-Rec: the first 100 users,
seed histories of L_init in [4, 6] liked items)."""
from __future__ import annotations

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError

from .engine import ProbeSpec


def user_order(dataset: Dataset) -> list[str]:
    """Users in id order (numeric where ids are numbers), restricted to users with interactions."""
    have = set(dataset.user_ids)
    ids = [u for u in dataset.users["user_id"] if u in have] or list(dataset.user_ids)
    return sorted(ids, key=lambda u: (0, int(u), u) if u.isdigit() else (1, 0, u))


def probe_from_user(dataset: Dataset, user_id: str, length: int, min_rating: float = 4.0) -> ProbeSpec:
    """A probe seeded with the user's first `length` liked items (any rated items if none liked)."""
    liked = dataset.history_ids(user_id, min_rating=min_rating) or dataset.history_ids(user_id, require=True)
    attrs = {}
    row = dataset.users[dataset.users["user_id"] == user_id]
    if len(row):
        rec = row.iloc[0]
        attrs = {k: (None if _missing(rec[k]) else (int(rec[k]) if k == "age" else str(rec[k])))
                 for k in ("age", "gender", "occupation")}
    return ProbeSpec(history=tuple(liked[:length]), attributes=attrs, name=f"user-{user_id}")


def _missing(value) -> bool:
    try:
        return bool(value is None or value != value or str(value) == "<NA>")
    except (TypeError, ValueError):
        return False


def default_roster(dataset: Dataset, n_agents: int, rng: np.random.Generator,
                   l_init: tuple[int, int] = (4, 6), min_rating: float = 4.0) -> list[ProbeSpec]:
    """Probes from the first `n_agents` users; each seed length drawn from `rng` in [l_init]."""
    users = user_order(dataset)
    if n_agents < 1 or n_agents > len(users):
        raise ConfigError(f"n_agents must be in [1, {len(users)}], got {n_agents}")
    low, high = l_init
    if not 1 <= low <= high:
        raise ConfigError(f"l_init must satisfy 1 <= low <= high, got {l_init}")
    lengths = rng.integers(low, high + 1, size=n_agents)
    return [probe_from_user(dataset, u, int(n), min_rating) for u, n in zip(users[:n_agents], lengths)]
