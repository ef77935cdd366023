import math

import numpy as np
import pytest

from ctrlsim.metrics import controllability as M


def test_table5_metrics_by_hand():
    target = {"a", "b", "c", "d"}
    likes = [["a", "x", "a2"], ["b", "a"], []]
    assert M.coverage(likes, target) == pytest.approx(2 / 4)          # {a, b} of 4
    assert M.exploration_efficiency(likes, target) == pytest.approx(5 / 2)  # 5 clicks / 2 distinct targets
    assert M.average_behaviour_length(likes) == pytest.approx(5 / 3)
    assert math.isinf(M.exploration_efficiency([["x"]], target))
    assert M.average_tokens([100, 300]) == 200


def test_profile_vectors_and_smoothness():
    e = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    g = np.array([0.5, 0.5])
    v = M.centred_profile_vector(e[:2], g)
    assert np.allclose(v, [0.0, 0.0])
    assert np.allclose(M.centred_profile_vector(e[2:], g), [0.5, 0.5])
    assert M.cosine(np.array([1.0, 0]), np.array([0, 2.0])) == 0.0
    assert M.trajectory_smoothness([np.array([1.0, 0])] * 4 + [np.array([0, 1.0])], lag=3) == [1.0, 0.0]


def test_tag_distribution_and_js():
    dist = M.tag_distribution([("A", "B"), ("A",)], ["A", "B", "C"])
    assert np.allclose(dist, [0.75, 0.25, 0.0])
    assert M.js_divergence(dist, dist) == pytest.approx(0.0, abs=1e-12)
    assert M.js_divergence(np.array([1.0, 0]), np.array([0, 1.0])) == pytest.approx(1.0)
    assert np.allclose(M.target_distribution(["A", "B", "C"], ["A", "C"]), [0.5, 0, 0.5])
    with pytest.raises(ValueError):
        M.target_distribution(["A"], ["Z"])


def test_mean_popularity_eq3():
    pop = np.array([10.0, 20.0, 30.0])
    assert M.mean_popularity(pop, [0, 2, 2]) == pytest.approx(70 / 3)
