"""SteerEval's metric hook and table cells (pure functions over rankings and records).

`steereval_figures` turns one steering episode (the pool ranked with the original
and with the steered profile) into named figures; the env puts them in `info`
and the runner stores them. `direction_cell` is one cell of the paper's tables:
the mean ΔAUC_t over scenarios with a one-tailed paired t-test of AUC_t after vs
before (greater for increase, less for decrease), as in SteerEval §4.2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ctrlsim.metrics.ranking import auc_t, coverage_at_k, ndcg_at_k, rank_set
from ctrlsim.metrics.stats import TTest, paired_t_test

ALTERNATIVE = {"increase": "greater", "decrease": "less"}


def steereval_figures(before: Sequence[str], after: Sequence[str], relevant: Iterable[str], next_item: str,
                      k: int = 10) -> dict:
    """Named figures of one steering episode: AUC_t, Rank_set, Coverage@k and NDCG@k before/after."""
    rel = set(relevant)
    a0, a1 = auc_t(before, rel), auc_t(after, rel)
    return {
        "auc_before": a0, "auc_after": a1, "delta_auc": a1 - a0,
        "next_item_relevant": next_item in rel,
        "rank_set_before": rank_set(before, next_item, rel),
        "rank_set_after": rank_set(after, next_item, rel),
        f"coverage@{k}_before": coverage_at_k(before, rel, k),
        f"coverage@{k}_after": coverage_at_k(after, rel, k),
        f"ndcg@{k}_before": ndcg_at_k(before, rel, k), f"ndcg@{k}_after": ndcg_at_k(after, rel, k),
    }


@dataclass(frozen=True)
class Cell:
    """One table cell: mean ΔAUC_t of `n` scenarios of one direction and its t-test."""

    direction: str
    test: TTest

    @property
    def mean(self) -> float:
        return self.test.mean

    @property
    def n(self) -> int:
        return self.test.n

    @property
    def steered(self) -> bool:
        """The mean moves the way the direction asks (positive for increase, negative for decrease)."""
        return self.mean > 0 if self.direction == "increase" else self.mean < 0

    @property
    def significant(self) -> bool:
        return self.test.significant()


def direction_cell(records: Iterable[Mapping], direction: str) -> Cell | None:
    """The cell of `records` (dicts with direction, auc_before, auc_after) for one direction."""
    if direction not in ALTERNATIVE:
        raise ValueError(f"direction must be 'increase' or 'decrease', got {direction!r}")
    rows = [r for r in records if r["direction"] == direction]
    if not rows:
        return None
    test = paired_t_test([r["auc_after"] for r in rows], [r["auc_before"] for r in rows],
                         alternative=ALTERNATIVE[direction])
    return Cell(direction, test)


def edit_problem_rates(records: Iterable[Mapping]) -> dict[tuple[str, str], float]:
    """Share of records with any edit problem per (tag, direction) (SteerEval §4.4.1's filter input)."""
    counts: dict[tuple[str, str], list[int]] = {}
    for r in records:
        seen = counts.setdefault((r["tag"], r["direction"]), [0, 0])
        seen[0] += bool(r.get("edit_problems"))
        seen[1] += 1
    return {key: bad / total for key, (bad, total) in counts.items()}


def rejected_tags(records: Iterable[Mapping], max_share: float = 0.25) -> set[str]:
    """Tags where more than `max_share` of LLM-written edits for either direction were refusals or
    misreadings: SteerEval's Trigger(75) filter ("over one quarter of LLM responses")."""
    return {tag for (tag, _), share in edit_problem_rates(records).items() if share > max_share}
