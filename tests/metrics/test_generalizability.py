"""Box x probe-model variance components, E rho^2, Kendall's W and flipped pairs, by hand and on
simulated data of known components."""
import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.generalizability import (
    flipped_pairs,
    kendalls_w,
    model_sensitivity,
    variance_components,
)

# Mean squares by hand: box 32, model 8, interaction 0, error 2 (each cell's two seeds are mean +- 1).
HAND = {"A": {"m1": [1, 3], "m2": [3, 5]}, "B": {"m1": [5, 7], "m2": [7, 9]}}


def test_components_by_hand():
    c = variance_components(HAND)
    assert (c.box, c.model, c.box_x_model, c.residual) == pytest.approx((8.0, 2.0, 0.0, 2.0))
    assert c.g_coefficient == pytest.approx(8 / (8 + 0 / 2 + 2 / 4))
    assert sum(c.shares.values()) == pytest.approx(1.0)


def test_components_recover_a_simulated_design():
    rng = np.random.default_rng(3)
    a, b, n = 120, 16, 4
    truth = {"box": 4.0, "model": 1.0, "inter": 0.5, "error": 2.0}
    y = (rng.normal(0, truth["box"] ** 0.5, (a, 1, 1)) + rng.normal(0, truth["model"] ** 0.5, (1, b, 1))
         + rng.normal(0, truth["inter"] ** 0.5, (a, b, 1)) + rng.normal(0, truth["error"] ** 0.5, (a, b, n)))
    scores = {f"box{i}": {f"m{j}": y[i, j].tolist() for j in range(b)} for i in range(a)}
    c = variance_components(scores)
    assert c.box == pytest.approx(truth["box"], rel=0.3)
    assert c.model == pytest.approx(truth["model"], rel=0.6)
    assert c.box_x_model == pytest.approx(truth["inter"], rel=0.3)
    assert c.residual == pytest.approx(truth["error"], rel=0.1)


def test_kendalls_w_by_hand():
    assert kendalls_w([[1, 2, 3], [10, 20, 30]]) == pytest.approx(1.0)
    assert kendalls_w([[1, 2, 3], [3, 2, 1]]) == pytest.approx(0.0)
    # rank sums 5, 6, 7 around 6: S = 2, W = 12 * 2 / (3^2 * (3^3 - 3))
    assert kendalls_w([[1, 2, 3], [1, 2, 3], [3, 2, 1]]) == pytest.approx(24 / 216)


def test_flipped_pairs_and_the_summary():
    scores = {"x": {"a": [1.0], "b": [3.0]}, "y": {"a": [2.0], "b": [2.0]}, "z": {"a": [3.0], "b": [4.0]}}
    # pairs: x<y under a, x>y under b (flip); x<z under both; y<z under both
    assert flipped_pairs(scores) == pytest.approx(1 / 3)
    summary = model_sensitivity(scores)
    assert summary["flipped_pairs"] == pytest.approx(1 / 3) and summary["models"] == ["a", "b"]
    assert np.isnan(summary["components"].residual)  # one seed: interaction and residual are one


def test_an_unbalanced_or_too_small_design_is_named():
    with pytest.raises(ConfigError, match="balanced"):
        variance_components({"A": {"m1": [1, 2], "m2": [1]}, "B": {"m1": [1, 2], "m2": [1, 2]}})
    with pytest.raises(ConfigError, match="two probe models"):
        variance_components({"A": {"m1": [1]}, "B": {"m1": [2]}})
