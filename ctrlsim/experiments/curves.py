"""Per-round metric curves of one played episode, shared by every runner that plays populations."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ctrlsim.metrics import controllability as M

CURVES = ("coverage", "efficiency", "efficiency_all_likes", "len", "tokens")


def _finite(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def round_curves(trace, target_items: Iterable[str], rounds: int) -> dict[str, list]:
    """Each metric after rounds 1..rounds for one episode (a probe dropped early keeps what it had)."""
    target = set(target_items)
    out: dict[str, list] = {name: [] for name in CURVES}
    for t in range(1, rounds + 1):
        likes = [[i for r in p.likes_per_round[:t] for i in r] for p in trace.probes]
        tokens = [p.tokens_per_round[min(t, len(p.tokens_per_round)) - 1] if p.tokens_per_round else 0
                  for p in trace.probes]
        out["coverage"].append(_finite(M.coverage(likes, target)))
        out["efficiency"].append(_finite(M.target_exploration_efficiency(likes, target)))
        out["efficiency_all_likes"].append(_finite(M.exploration_efficiency(likes, target)))
        out["len"].append(M.average_behaviour_length(likes))
        out["tokens"].append(M.average_tokens(tokens))
    return out
