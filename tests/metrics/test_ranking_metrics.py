"""Ranking metrics against hand-computed values."""
import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ctrlsim.metrics import (
    auc_t,
    coverage_at_k,
    drift,
    hit_rate_at_k,
    mrr_at_k,
    ndcg_at_k,
    paired_t_test,
    rank_set,
    rbo,
)

RANKING = list("abcdefgh")


def test_auc_t_extremes_and_hand_value():
    assert auc_t(["a", "b", "c", "d"], {"a", "b"}) == 1.0
    assert auc_t(["c", "d", "a", "b"], {"a", "b"}) == 0.0
    # relevant a (pos 1), c (pos 3), h (pos 8); irrelevant b, d, e, f, g:
    # a beats 5, c beats 4, h beats 0 -> 9 of 15 pairs
    assert auc_t(RANKING, {"a", "c", "h"}) == pytest.approx(9 / 15)
    assert math.isnan(auc_t(["a", "b"], {"a", "b"}))


def test_auc_t_equals_steereval_roc_auc():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ranking = [str(i) for i in rng.permutation(30)]
        relevant = {str(i) for i in rng.choice(30, 12, replace=False)}
        labels = [i in relevant for i in ranking]
        expected = roc_auc_score(labels, len(ranking) - np.arange(len(ranking)))
        assert auc_t(ranking, relevant) == pytest.approx(expected)


def test_rank_set():
    relevant = {"a", "c", "h"}
    assert rank_set(RANKING, "c", relevant) == 2   # a, c among the relevant
    assert rank_set(RANKING, "e", relevant) == 3   # b, d, e among the irrelevant
    with pytest.raises(ValueError):
        rank_set(RANKING, "z", relevant)


def test_ndcg_hit_mrr_coverage_by_hand():
    relevant = {"b", "d"}
    # DCG@3 = 1/log2(3) (b at rank 2); IDCG@3 = 1 + 1/log2(3)
    assert ndcg_at_k(RANKING, relevant, 3) == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert ndcg_at_k(["b", "d", "a"], relevant, 3) == pytest.approx(1.0)
    # graded gains use 2^g - 1
    graded = {"a": 2.0, "b": 1.0}
    assert ndcg_at_k(["b", "a"], graded, 2) == pytest.approx((1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)))
    assert hit_rate_at_k(RANKING, relevant, 1) == 0.0 and hit_rate_at_k(RANKING, relevant, 2) == 1.0
    assert mrr_at_k(RANKING, relevant, 10) == 0.5 and mrr_at_k(RANKING, relevant, 1) == 0.0
    assert coverage_at_k(RANKING, relevant, 4) == 0.5


def test_rbo_finite_extrapolated_by_hand():
    p = 0.9
    assert rbo(list("abcd"), list("abcd"), p) == pytest.approx(1.0)
    assert rbo(list("abcd"), list("efgh"), p) == 0.0
    # S=abc, T=acb: X1=1, X2=1, X3=3 -> (1-p)/p * (1*p + 1/2*p^2 + 3/3*p^3) + 3/3*p^3
    expected = (1 - p) / p * (p + 0.5 * p ** 2 + p ** 3) + p ** 3
    assert rbo(list("abc"), list("acb"), p) == pytest.approx(expected)
    assert drift(list("abc"), list("acb"), p) == pytest.approx(1 - expected)
    with pytest.raises(ValueError):
        rbo(["a"], ["a"], p=1.0)


def test_paired_t_test_one_tailed():
    before = [0.50, 0.52, 0.48, 0.51, 0.49]
    after = [0.60, 0.58, 0.57, 0.62, 0.59]
    up = paired_t_test(after, before, alternative="greater")
    assert up.significant() and up.mean == pytest.approx(0.092)
    down = paired_t_test(after, before, alternative="less")
    assert not down.significant() and down.p == pytest.approx(1 - up.p)
    const = paired_t_test([0.1, 0.1], alternative="greater")
    assert const.n == 2 and not const.defined and const.p != const.p  # zero variance: undefined (NaN)
