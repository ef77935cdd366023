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


def test_interval_smoothness_uses_table2_intervals():
    assert M.SMOOTHNESS_EDGES == (0, 3, 6, 9, 12, 15, 18, 20)
    x, y = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    traj = [x] * 6 + [y] * 15                       # V_0..V_20; the switch happens after round 5
    smooth = M.interval_smoothness(traj)
    # t0-t3: cos(x, x) = 1; t3-t6: cos(x, y) = 0; every later interval stays on y.
    assert smooth == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert M.interval_smoothness(traj[:10]) == [1.0, 0.0, 1.0]   # a 9-round trajectory: t0-t3 .. t6-t9
    diag = np.array([1.0, 1.0])
    assert M.interval_smoothness([x, x, x, diag], edges=(0, 3)) == [pytest.approx(1 / np.sqrt(2))]


def test_similarity_curve_against_old_interest():
    old = np.array([1.0, 0.0])
    traj = [np.array([1.0, 0.0]), np.array([1.0, 1.0]), np.array([0.0, 1.0])]
    assert M.similarity_curve(traj, old) == [1.0, pytest.approx(1 / np.sqrt(2)), 0.0]


def test_new_discoveries_per_round_counts_first_finds_once():
    target = {"t1", "t2", "t3"}
    probes = [[["t1", "x"], ["t2"], []],
              [["t1"], ["t2", "t3"], ["t3"]]]
    # round 1: t1 (both probes, counted once); round 2: t2, t3; round 3: nothing new.
    assert M.new_discoveries_per_round(probes, target) == [1, 2, 0]
    assert sum(M.new_discoveries_per_round(probes, target)) == len(M.discovered_targets(
        [[i for r in p for i in r] for p in probes], target))
    assert M.new_discoveries_per_round(probes, target, rounds=5) == [1, 2, 0, 0, 0]


def test_popularity_of_interacted_items_eq3():
    pop = np.array([100.0, 10.0, 1.0])
    # K = 2 probes, N = 2 rounds, one interaction each: (100 + 10 + 1 + 1) / 4.
    per_round = [[[0], [1]], [[2], [2]]]
    flat = [i for p in per_round for r in p for i in r]
    assert M.interaction_popularity(pop, flat) == pytest.approx(112 / 4)
    assert M.popularity_per_round(pop, per_round) == [pytest.approx(50.5), pytest.approx(5.5)]
    assert math.isnan(M.popularity_per_round(pop, [[[]], [[]]])[0])
