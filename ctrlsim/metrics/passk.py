"""pass^k: how reliably a method reaches control, not just how often (the tau-bench estimator).

A task (method, box, target) is run with n seeds; c of them succeed (the episode reached the
success threshold). pass^k is the chance that k independent tries of the task all succeed,
estimated without bias by C(c, k) / C(n, k) (sampling k of the n tries without replacement), and
averaged over tasks. pass^1 is the plain success rate; pass^k falls with k as far as success is
luck, and the cliff pass^1 - pass^n says how much. The interval is a bootstrap over tasks (tasks
are the units a reader generalises over; seeds are already used up by the estimator).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.bounded import bootstrap_mean_ci


def pass_hat_k(successes: int, trials: int, k: int) -> float:
    """C(c, k) / C(n, k): the unbiased estimate of P(k tries in a row all succeed) from c of n."""
    if not (isinstance(k, int) and 1 <= k <= trials):
        raise ConfigError(f"pass^k needs 1 <= k <= n, got k={k!r} with n={trials}")
    if not 0 <= successes <= trials:
        raise ConfigError(f"pass^k needs 0 <= successes <= trials, got {successes} of {trials}")
    return comb(successes, k) / comb(trials, k)


@dataclass(frozen=True)
class PassK:
    """pass^k for k = 1..n over tasks: `values[k]` the mean over tasks, `low[k]`/`high[k]` its
    bootstrap interval over tasks, `tasks` how many, `trials` the seeds per task (the fewest)."""

    values: dict[int, float]
    low: dict[int, float]
    high: dict[int, float]
    tasks: int
    trials: int
    confidence: float = 0.95

    @property
    def cliff(self) -> float:
        """pass^1 - pass^n: how much of the success rate is luck rather than reliable control."""
        return self.values[1] - self.values[self.trials]


def pass_k_curve(outcomes: Mapping[Any, Sequence[bool]], *, confidence: float = 0.95,
                 n_resamples: int = 9999, seed: int = 0) -> PassK:
    """pass^k for every k up to the fewest tries of any task, from each task's success flags."""
    if not outcomes:
        raise ConfigError("pass^k needs at least one task")
    trials = min(len(flags) for flags in outcomes.values())
    if trials < 1:
        raise ConfigError("pass^k needs at least one try of every task")
    counts = [(int(sum(bool(f) for f in flags)), len(flags)) for flags in outcomes.values()]
    values, low, high = {}, {}, {}
    for k in range(1, trials + 1):
        per_task = np.array([pass_hat_k(c, n, k) for c, n in counts])
        estimate = bootstrap_mean_ci(per_task, confidence=confidence, n_resamples=n_resamples, seed=seed)
        values[k], low[k], high[k] = estimate.value, estimate.low, estimate.high
    return PassK(values, low, high, tasks=len(counts), trials=trials, confidence=confidence)


def success_flags(tries: Iterable[tuple[Hashable, int, float]], threshold: float) -> dict[Any, list[bool]]:
    """task -> success flag per try in seed order, from (task, seed, score) triples: a try succeeds
    when its score reaches `threshold` (up to rounding)."""
    found: dict[Any, list[tuple[int, bool]]] = {}
    for task, seed, score in tries:
        found.setdefault(task, []).append((seed, score >= threshold - 1e-9))
    return {task: [ok for _, ok in sorted(flags)] for task, flags in found.items()}


def shown_ks(n: int) -> list[int]:
    """The k a pass^k table shows for n tries: every k up to 5, else 1, 2, 3, the powers of two
    below n, and n (a run sized to hundreds of seeds keeps a readable table)."""
    if n <= 5:
        return list(range(1, n + 1))
    return sorted({1, 2, 3, n} | {2 ** j for j in range(2, n.bit_length()) if 2 ** j < n})


__all__ = ["PassK", "pass_hat_k", "pass_k_curve", "shown_ks", "success_flags"]
