"""PromptShift's slice table and metrics against values computed by hand."""
import math

import numpy as np
import pandas as pd
import pytest

from ctrlsim.data import Dataset, identity_slices
from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import (
    STAR,
    SliceTable,
    adaptive_alpha,
    delta_phi,
    difficulty_at_k,
    mainstreamness,
    mean_delta_phi,
    retention_score,
    scenario_mainstreamness,
    slice_shift,
)


@pytest.fixture
def tiny():
    """4 movies, 4 users (2 F, 2 M); positives are ratings >= 4.

    Positives: u1(F): i1 (twice), i2 | u2(F): i1, i3 | u3(M): i1, i2, i4 | u4(M): i4.
    u4 rated i2 with 2 (not a positive).
    """
    items = pd.DataFrame({"item_id": ["i1", "i2", "i3", "i4"], "title": ["A", "B", "C", "D"],
                          "year": [1990, 1991, 1992, 1993]})
    rows = [("u1", "i1", 5), ("u1", "i1", 4), ("u1", "i2", 4), ("u2", "i1", 4), ("u2", "i3", 5),
            ("u3", "i1", 4), ("u3", "i2", 5), ("u3", "i4", 4), ("u4", "i4", 5), ("u4", "i2", 2)]
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "rating"]).assign(timestamp=range(len(rows)))
    users = pd.DataFrame({"user_id": ["u1", "u2", "u3", "u4"], "gender": ["F", "F", "M", "M"],
                          "age": [25, 40, 30, 60], "occupation": ["x"] * 4})
    return Dataset.build("tiny", items, inter, users)


def build_table(ds, shrinkage_users=30.0):
    pos = ds.interactions[ds.interactions["rating"] >= 4]
    slices = identity_slices(ds, "gender")
    members = {g: list(us) for g, us in slices.groupby(slices).groups.items()}
    return SliceTable.build(pos["user_id"].to_numpy(), pos["item_id"].to_numpy(), members, ds.item_ids,
                            shrinkage_users=shrinkage_users)


def test_counts_and_max_normalisation(tiny):
    t = build_table(tiny)
    assert t.slice_ids == ("gender_F", "gender_M", STAR)
    # n(i, g): distinct positive users (u1's repeated i1 counts once; u4's rating 2 is no positive)
    np.testing.assert_array_equal(t.counts, [[2, 1, 3], [1, 1, 2], [1, 0, 1], [0, 2, 2]])
    np.testing.assert_allclose(t.phi_tilde[:, 0], [1, 0.5, 0.5, 0])
    np.testing.assert_allclose(t.phi_tilde[:, 1], [0.5, 0.5, 0, 1])
    np.testing.assert_allclose(t.phi_tilde[:, 2], [1, 2 / 3, 1 / 3, 2 / 3])
    np.testing.assert_array_equal(t.sizes, [2, 2, 4])


def test_small_slice_shrinkage(tiny):
    t = build_table(tiny)  # |U_g| = 2 -> lambda = 2/30
    lam = 2 / 30
    np.testing.assert_allclose(t.shrinkage, [lam, lam, 1.0])
    expected_f = lam * np.array([1, 0.5, 0.5, 0]) + (1 - lam) * np.array([1, 2 / 3, 1 / 3, 2 / 3])
    np.testing.assert_allclose(t.phi[:, 0], expected_f)
    np.testing.assert_allclose(t.phi[:, 0], [1.0, 0.655556, 0.344444, 0.622222], atol=1e-6)
    np.testing.assert_allclose(t.phi[:, 2], t.phi_tilde[:, 2])  # phi(i, *) = phi~(i, *)
    # Large enough slices are not shrunk.
    full = build_table(tiny, shrinkage_users=2)
    np.testing.assert_allclose(full.phi, full.phi_tilde)


def test_delta_phi_and_lookups(tiny):
    t = build_table(tiny, shrinkage_users=2)
    d = delta_phi(t, ["i1", "i2", "i3", "i4", None], "gender_F")
    np.testing.assert_allclose(d[:4], [0, -1 / 6, 1 / 6, -2 / 3])
    assert math.isnan(d[4])
    with pytest.raises(ConfigError):
        t.phi_of(["nope"], "gender_F")
    with pytest.raises(ConfigError):
        t.column("gender_X")


def test_slice_shift_by_hand(tiny):
    t = build_table(tiny, shrinkage_users=2)
    cued, ref = ["i3", None, "i1"], ["i4", "i2"]
    # mean dphi: cued (1/6 + 0 + 0) / 3 (None counts in |L| and adds 0); ref (-2/3 - 1/6) / 2
    assert mean_delta_phi(t, cued, "gender_F") == pytest.approx(1 / 18)
    assert mean_delta_phi(t, cued, "gender_F", unmatched="skip") == pytest.approx(1 / 12)
    assert mean_delta_phi(t, ref, "gender_F") == pytest.approx(-5 / 12)
    assert slice_shift(t, cued, ref, "gender_F") == pytest.approx(1 / 18 + 5 / 12)
    assert slice_shift(t, ref, ref, "gender_F") == 0.0
    assert mean_delta_phi(t, [], "gender_F") == 0.0


def test_difficulty_at_k_by_hand(tiny):
    t = build_table(tiny, shrinkage_users=2)
    ranking, relevant = ["i3", "i2", None, "i1"], {"i1", "i3", "i9"}
    # gender_M: phi(i3) = 0, phi(i1) = 0.5; w = 10 (1 - phi) (1 + 0.2 (K - l + 1) / K)
    assert difficulty_at_k(ranking, relevant, t, "gender_M", k=4) == pytest.approx(10 * 1.2 + 5 * 1.05)
    # top 3 only: i3 at rank 1
    assert difficulty_at_k(ranking, relevant, t, "gender_M", k=3) == pytest.approx(10 * 1.2)
    # gender_F: phi(i1) = 1 earns nothing; phi(i3) = 0.5
    assert difficulty_at_k(ranking, relevant, t, "gender_F", k=4) == pytest.approx(5 * 1.2)
    assert difficulty_at_k(ranking, set(), t, "gender_F", k=4) == 0.0
    assert difficulty_at_k(ranking, relevant, t, "gender_M", k=4, rho=0.0) == pytest.approx(10 + 5)


def test_mainstreamness(tiny):
    t = build_table(tiny, shrinkage_users=2)
    assert mainstreamness(t, ["i1", "i2"], "gender_F") == pytest.approx(0.75)
    assert mainstreamness(t, ["i1", "i2"], "gender_M") == pytest.approx(0.5)
    assert math.isnan(mainstreamness(t, [], "gender_F"))
    assert scenario_mainstreamness([0.75, 0.5, float("nan")]) == pytest.approx(0.625)


def test_retention_and_adaptive_alpha():
    r = retention_score(np.arange(1, 31), 30, b=0.2, q=0.9)
    q30 = 0.9 ** 30
    assert r[0] == pytest.approx(0.2 + 0.8 * (0.9 - q30) / (1 - q30)) and r[-1] == pytest.approx(0.2)
    assert np.all(np.diff(r) < 0)
    q6, q10 = 0.9 ** 6, 0.9 ** 10
    assert retention_score(np.array([6]), 10)[0] == pytest.approx(0.2 + 0.8 * (q6 - q10) / (1 - q10))
    assert adaptive_alpha(0.1, 0.2) == pytest.approx(0.6)      # 0.7 + 0.2 * (-0.5)
    assert adaptive_alpha(1.0, 0.2) == pytest.approx(0.9)      # clipped at alpha_max
    assert adaptive_alpha(0.0, 0.2) == pytest.approx(0.5)      # 0.7 - 0.2 = alpha_min
    assert adaptive_alpha(0.0, 0.0) == pytest.approx(0.7)      # max(phi_bar_s, eps) guards the division
    assert adaptive_alpha(float("nan"), 0.2) == pytest.approx(0.7)


def test_build_rejects_bad_input():
    with pytest.raises(ConfigError):
        SliceTable.build(["u"], ["i", "j"], {"g": ["u"]})
    with pytest.raises(ConfigError):
        SliceTable.build(["u"], ["i"], {STAR: ["u"]})
    with pytest.raises(ConfigError):
        SliceTable.build(["u"], ["x"], {"g": ["u"]}, catalogue=["i"])
