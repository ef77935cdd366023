"""Extrapolated RBO (Webber et al. 2010) for equal and unequal lengths, against independent computations."""
from fractions import Fraction

import numpy as np
import pytest

from ctrlsim.metrics.ranking import drift, rbo


def reference_rbo_ext(s_list, l_list, p):
    """Webber et al.'s eq. 32 written term by term with exact fractions and set intersections."""
    if len(s_list) > len(l_list):
        s_list, l_list = l_list, s_list
    s, n, p = len(s_list), len(l_list), Fraction(p)

    def x(d):  # overlap at depth d; beyond s the whole short list takes part
        return len(set(s_list[:min(d, s)]) & set(l_list[:d]))

    first = sum(Fraction(x(d), d) * p ** d for d in range(1, n + 1))
    second = sum(Fraction(x(s) * (d - s), s * d) * p ** d for d in range(s + 1, n + 1))
    return (1 - p) / p * (first + second) + (Fraction(x(n) - x(s), n) + Fraction(x(s), s)) * p ** n


def test_equal_lengths_by_hand():
    # S = abc, T = bad, p = 1/2: X = 0, 2, 2 -> 1 * (0 + 2/2 * 1/4 + 2/3 * 1/8) + 2/3 * 1/8 = 5/12
    assert rbo(list("abc"), list("bad"), 0.5) == pytest.approx(5 / 12)
    assert drift(list("abc"), list("bad"), 0.5) == pytest.approx(7 / 12)
    assert rbo(list("abcd"), list("abcd"), 0.9) == pytest.approx(1.0)
    assert rbo(list("abc"), list("xyz"), 0.9) == 0.0


def test_unequal_lengths_by_hand():
    # S = ab, L = bca, p = 1/2: X_1 = 0, X_2 = 1, X_3 = |{a, b} & {b, c, a}| = 2, s = 2, l = 3.
    # (1-p)/p = 1; sum X_d/d p^d = 1/8 + 1/12 = 5/24; extrapolation d = 3: 1 * 1/(2*3) * 1/8 = 1/48;
    # tail ((2 - 1)/3 + 1/2) * 1/8 = 5/48. Total 10/48 + 1/48 + 5/48 = 1/3.
    assert rbo(list("ab"), list("bca"), 0.5) == pytest.approx(1 / 3)
    assert rbo(list("bca"), list("ab"), 0.5) == pytest.approx(1 / 3)  # symmetric
    # A list that is a prefix of the other agrees fully: missing positions are not mismatches.
    assert rbo(list("ab"), list("abc"), 0.9) == pytest.approx(1.0)
    assert drift(list("ab"), list("abc"), 0.9) == pytest.approx(0.0)


def test_empty_lists():
    assert rbo([], [], 0.9) == 1.0
    assert rbo([], ["a"], 0.9) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_formula_on_random_lists(seed):
    rng = np.random.default_rng(seed)
    pool = [f"i{n}" for n in range(15)]
    for _ in range(20):
        a = list(rng.choice(pool, size=int(rng.integers(1, 12)), replace=False))
        b = list(rng.choice(pool, size=int(rng.integers(1, 12)), replace=False))
        p = float(rng.choice([0.5, 0.8, 0.9]))
        assert rbo(a, b, p) == pytest.approx(float(reference_rbo_ext(a, b, p)), abs=1e-12)


def test_rejects_repeated_items_and_bad_p():
    with pytest.raises(ValueError):
        rbo(["a", "a"], ["a"], 0.9)
    with pytest.raises(ValueError):
        rbo(["a"], ["a"], 1.0)
