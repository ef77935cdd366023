"""Validity metrics (issue 42): adherence, the fidelity AUC and their cluster-bootstrap intervals,
against hand values and scikit-learn."""
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ctrlsim.metrics import validity as V


def test_adherence_is_the_difference_of_the_two_like_rates():
    is_target = [True, True, True, False, False, False, False]
    liked = [True, True, False, True, False, False, False]
    assert V.adherence(is_target, liked) == pytest.approx(2 / 3 - 1 / 4)
    assert np.isnan(V.adherence([True, True], [True, False]))  # no non-target shown: undefined


def test_decision_auc_matches_scikit_learn_with_ties():
    rng = np.random.default_rng(3)
    positive = rng.random(40) < 0.4
    for score in (rng.random(40), (rng.random(40) < 0.5).astype(float)):  # scores, then 0/1 decisions
        assert V.decision_auc(positive, score) == pytest.approx(roc_auc_score(positive, score))
    assert np.isnan(V.decision_auc([True, True], [1.0, 0.0]))


def test_cluster_bootstrap_resamples_whole_clusters_and_stays_in_range():
    # Two clusters that each like only their own kind: adherence 1 in one, -1 in the other.
    clusters = ["a"] * 4 + ["b"] * 4
    is_target = [True, True, False, False] * 2
    liked = [True, True, False, False, False, False, True, True]
    card = V.adherence_card(clusters, is_target, liked)
    assert card.adherence.value == pytest.approx(0.0)
    assert -1.0 <= card.adherence.low <= 0.0 <= card.adherence.high <= 1.0
    assert card.adherence.n == 2 and (card.n_target, card.n_other) == (4, 4)
    assert not card.passes
    one = V.adherence_card(["a"] * 4, [True, True, False, False], [True, True, False, False])
    assert one.adherence.value == 1.0 and np.isnan(one.adherence.low)  # one cluster: no interval


def test_a_share_that_is_zero_everywhere_has_the_interval_zero_to_zero():
    e = V.share_ci(["a", "a", "b", "c"], [False] * 4)
    assert (e.value, e.low, e.high) == (0.0, 0.0, 0.0)
