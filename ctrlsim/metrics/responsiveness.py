"""Counterfactual responsiveness to explicit negative feedback (issue 48): pure functions.

An episode is forked at a round: in one arm the probe marks an item i of its slate "not
interested" (or dislikes it, or blocks one of its tags), in the other it skips it; both arms then
go on for H rounds with the same seeds. With S_fb and S_skip the numbers of items *similar* to i
(sharing a tag with i; for a block, carrying the blocked tag) the recommender showed in those H
rounds of each arm,

    responsiveness = 1 - S_fb / S_skip

1 = the feedback removed every similar item the box would otherwise have shown, 0 = no effect,
< 0 = it showed more of them. Live studies report the same form ("prevented X% of unwanted
recommendations"). Pooled over units (dismissed items across seeds) it is 1 - sum(S_fb) /
sum(S_skip), with the ratio estimator's delta-method interval flipped (`ratio_ci`).
`implied_strength` turns it into the share of similar items removed, which a dial box with
`neg=mu` knows (its known answer).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from ctrlsim.metrics.stats import Estimate, ratio_ci


def similar_count(slates: Iterable[Sequence[str]], item_tags: dict[str, frozenset[str]] | dict,
                  tags: Iterable[str]) -> int:
    """How many items of `slates` carry any of `tags` (`item_tags`: item id -> its tags)."""
    wanted = set(tags)
    return sum(1 for slate in slates for item in slate if wanted & set(item_tags[item]))


def responsiveness(feedback: Sequence[float], skip: Sequence[float], confidence: float = 0.95) -> Estimate:
    """1 - sum(feedback) / sum(skip) over units, with its interval (NaN where sum(skip) = 0: the box
    would have shown nothing similar, so there was nothing to prevent)."""
    ratio = ratio_ci(feedback, skip, confidence)
    return Estimate(1.0 - ratio.value, 1.0 - ratio.high, 1.0 - ratio.low, ratio.n, confidence, ratio.method)


def implied_strength(value: float, density: float) -> float:
    """The share mu of similar items the feedback removed from what the box would show next, read
    from a responsiveness R and the density p of similar items in the skip arm's slates.

    Removing each similar item of a stream with probability mu leaves a density p(1 - mu) /
    (1 - p mu) among the items shown, so R = mu (1 - p) / (1 - p mu) and mu = R / (1 - p + p R):
    R understates mu where similar items are common (p near 1: every replacement is similar too).
    NaN where undefined (p = 1, or R NaN)."""
    if math.isnan(value) or math.isnan(density):
        return float("nan")
    denominator = 1.0 - density + density * value
    return value / denominator if denominator > 0 else float("nan")
