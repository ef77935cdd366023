"""Per-user chronological splits and identity slices."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ctrlsim.data import (
    AGE_GROUPS,
    ChronologicalSplit,
    Dataset,
    age_group,
    chronological_split,
    identity_slices,
    slice_members,
)
from ctrlsim.errors import ConfigError, DataError

# Users with 10, 25 and 50 interactions: 72/8/20 splits into whole numbers.
SIZES = {"a": 10, "b": 25, "c": 50}
EXPECTED = {"a": (7, 1, 2), "b": (18, 2, 5), "c": (36, 4, 10)}


@pytest.fixture(scope="module")
def toy() -> Dataset:
    """Interleaved users, rows shuffled so the build has to sort them."""
    rng = np.random.default_rng(0)
    rows = []
    for user, n in SIZES.items():
        # Distinct timestamps per user, interleaved across users.
        stamps = rng.choice(np.arange(1_000_000, 1_010_000), size=n, replace=False)
        ratings = rng.integers(1, 6, size=n)
        rows += [(user, f"i{k}", float(r), int(t)) for k, (r, t) in enumerate(zip(ratings, stamps))]
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "timestamp"])
    inter = inter.sample(frac=1.0, random_state=1).reset_index(drop=True)
    items = pd.DataFrame({"item_id": [f"i{k}" for k in range(50)], "title": [f"Item {k}" for k in range(50)]})
    users = pd.DataFrame({"user_id": ["a", "b", "c"], "age": [20, 40, 60], "gender": ["F", "M", None]})
    return Dataset.build("toy", items, inter, users)


def per_user_counts(df: pd.DataFrame) -> dict:
    return df.groupby("user_id").size().to_dict()


def test_default_fractions_per_user(toy: Dataset):
    split = chronological_split(toy)
    assert isinstance(split, ChronologicalSplit)
    assert split.fractions == (0.72, 0.08, 0.20)
    fit, valid, test = per_user_counts(split.fit), per_user_counts(split.valid), per_user_counts(split.test)
    for user, (n_fit, n_valid, n_test) in EXPECTED.items():
        assert (fit[user], valid[user], test[user]) == (n_fit, n_valid, n_test), user
    assert len(split.fit) == 61 and len(split.valid) == 7 and len(split.test) == 17


def test_split_is_chronological_per_user(toy: Dataset):
    split = chronological_split(toy)
    for user in SIZES:
        f = split.fit.loc[split.fit["user_id"] == user, "timestamp"]
        v = split.valid.loc[split.valid["user_id"] == user, "timestamp"]
        t = split.test.loc[split.test["user_id"] == user, "timestamp"]
        assert f.max() <= v.min() <= v.max() <= t.min()
        assert f.max() <= t.min()
        # The parts, in order, are exactly the user's history.
        assert pd.concat([f, v, t]).tolist() == toy.history(user)["timestamp"].tolist()
    for part in (split.fit, split.valid, split.test):
        assert part["timestamp"].is_monotonic_increasing
        assert part.index.equals(pd.RangeIndex(len(part)))
        assert list(part.columns) == ["user_id", "item_id", "rating", "timestamp"]


def test_split_partitions_all_interactions(toy: Dataset):
    split = chronological_split(toy)
    joined = pd.concat([split.fit, split.valid, split.test]).sort_values(["user_id", "timestamp"])
    expected = toy.interactions.sort_values(["user_id", "timestamp"])
    assert joined.reset_index(drop=True).equals(expected.reset_index(drop=True))


def test_split_other_fractions(toy: Dataset):
    split = chronological_split(toy, (0.8, 0.0, 0.2))
    assert split.valid.empty
    assert per_user_counts(split.fit) == {"a": 8, "b": 20, "c": 40}
    assert per_user_counts(split.test) == {"a": 2, "b": 5, "c": 10}
    everything = chronological_split(toy, [1.0, 0.0, 0.0])
    assert len(everything.fit) == len(toy.interactions)
    assert everything.test.empty and everything.valid.empty
    assert everything.fractions == (1.0, 0.0, 0.0)


def test_split_min_rating(toy: Dataset):
    split = chronological_split(toy, min_rating=4)
    positives = toy.interactions[toy.interactions["rating"] >= 4]
    total = len(split.fit) + len(split.valid) + len(split.test)
    assert total == len(positives)
    for part in (split.fit, split.valid, split.test):
        assert (part["rating"] >= 4).all()
    for user, n in positives.groupby("user_id").size().items():
        assert (split.fit["user_id"] == user).sum() == round(0.72 * n)


def test_split_keeps_equal_timestamps_in_file_order():
    items = pd.DataFrame({"item_id": list("abcde"), "title": list("ABCDE")})
    inter = pd.DataFrame({"user_id": ["u"] * 5, "item_id": list("edcba"), "timestamp": [5, 5, 5, 5, 5]})
    ds = Dataset.build("ties", items, inter)
    split = chronological_split(ds, (0.6, 0.2, 0.2))
    assert split.fit["item_id"].tolist() == ["e", "d", "c"]
    assert split.valid["item_id"].tolist() == ["b"]
    assert split.test["item_id"].tolist() == ["a"]


def test_split_ml100k(ml100k: Dataset):
    split = chronological_split(ml100k)
    assert len(split.fit) + len(split.valid) + len(split.test) == 100_000
    assert 0.71 < len(split.fit) / 100_000 < 0.73
    assert 0.19 < len(split.test) / 100_000 < 0.21
    # Every user keeps something to fit on and something to test on (ml-100k users have >= 20 ratings).
    assert split.fit["user_id"].nunique() == 943
    assert split.test["user_id"].nunique() == 943
    last_fit = split.fit.groupby("user_id")["timestamp"].max()
    first_test = split.test.groupby("user_id")["timestamp"].min()
    assert (last_fit <= first_test.reindex(last_fit.index)).all()


@pytest.mark.parametrize("bad", [
    (0.5, 0.5, 0.5),
    (0.7, 0.1),
    (0.6, 0.2, 0.1, 0.1),
    (1.2, -0.2, 0.0),
    (0.0, 0.0, 0.0),
    (),
])
def test_bad_fractions(toy: Dataset, bad):
    with pytest.raises(ConfigError) as exc:
        chronological_split(toy, bad)
    assert "fractions" in str(exc.value)
    assert isinstance(exc.value, ValueError)


# ------------------------------------------------------------------- slices
@pytest.mark.parametrize("age, group", [
    (1, "young adult"), (7, "young adult"), (18, "young adult"), (34, "young adult"),
    (35, "middle-aged"), (45, "middle-aged"), (49, "middle-aged"),
    (50, "older"), (56, "older"), (73, "older"),
    (None, None), (float("nan"), None), (pd.NA, None), (-1, None), (250, None),
])
def test_age_group(age, group):
    assert age_group(age) == group


def test_age_groups_cover_all_ages_without_overlap():
    assert [g[0] for g in AGE_GROUPS] == ["young adult", "middle-aged", "older"]
    for a in range(0, 120):
        assert sum(low <= a < high for _, low, high in AGE_GROUPS) == 1


def test_identity_slices_gender_ml100k(ml100k: Dataset):
    gender = identity_slices(ml100k, "gender")
    assert gender.name == "gender"
    assert len(gender) == 943
    assert set(gender) == {"gender_M", "gender_F"}
    assert gender["1"] == "gender_M"   # 24, M
    assert gender["2"] == "gender_F"   # 53, F
    assert (gender == "gender_M").sum() == 670
    assert (gender == "gender_F").sum() == 273
    assert all(isinstance(u, str) for u in gender.index)


def test_identity_slices_age_ml100k(ml100k: Dataset):
    age = identity_slices(ml100k, "age")
    assert len(age) == 943
    assert set(age) == {"age_young_adult", "age_middle_aged", "age_older"}
    expected = {
        "1": "age_young_adult",    # 24
        "30": "age_young_adult",   # 7
        "80": "age_young_adult",   # 34
        "18": "age_middle_aged",   # 35
        "15": "age_middle_aged",   # 49
        "60": "age_older",         # 50
        "2": "age_older",          # 53
        "481": "age_older",        # 73
    }
    for user, slice_id in expected.items():
        assert age[user] == slice_id, user
    users = ml100k.users.set_index("user_id")["age"]
    assert (age == "age_young_adult").sum() == (users < 35).sum()
    assert (age == "age_middle_aged").sum() == ((users >= 35) & (users < 50)).sum()
    assert (age == "age_older").sum() == (users >= 50).sum()


def test_identity_slices_gender_age_ml100k(ml100k: Dataset):
    cross = identity_slices(ml100k, "gender_age")
    assert len(cross) == 943
    assert set(cross) == {f"cross_{g}_{a}" for g in "MF" for a in ("young_adult", "middle_aged", "older")}
    assert cross["1"] == "cross_M_young_adult"
    assert cross["2"] == "cross_F_older"
    assert cross["18"] == "cross_F_middle_aged"
    assert cross["26"] == "cross_M_middle_aged"  # 49, M
    assert cross["60"] == "cross_M_older"
    assert cross["80"] == "cross_F_young_adult"


def test_slice_members(ml100k: Dataset):
    members = slice_members(identity_slices(ml100k, "gender"))
    assert set(members) == {"gender_M", "gender_F"}
    assert len(members["gender_M"]) == 670 and len(members["gender_F"]) == 273
    assert "1" in members["gender_M"] and "2" in members["gender_F"]
    assert members["gender_M"].isdisjoint(members["gender_F"])


def test_identity_slices_skip_missing_attributes(toy: Dataset):
    # toy users: a (20, F), b (40, M), c (60, gender missing).
    assert identity_slices(toy, "gender").to_dict() == {"a": "gender_F", "b": "gender_M"}
    assert identity_slices(toy, "age").to_dict() == {"a": "age_young_adult", "b": "age_middle_aged",
                                                     "c": "age_older"}
    assert identity_slices(toy, "gender_age").to_dict() == {"a": "cross_F_young_adult",
                                                            "b": "cross_M_middle_aged"}
    users = pd.DataFrame({"user_id": ["x", "y", "z"], "age": [None, 30, 51], "gender": ["M", "X", "F"]})
    ds = Dataset.build("partial", toy.items, toy.interactions, users)
    assert identity_slices(ds, "gender").to_dict() == {"x": "gender_M", "z": "gender_F"}
    assert identity_slices(ds, "age").to_dict() == {"y": "age_young_adult", "z": "age_older"}
    assert identity_slices(ds, "gender_age").to_dict() == {"z": "cross_F_older"}


@pytest.mark.parametrize("scenario", ["occupation", "Gender", "age_gender", ""])
def test_unknown_scenario(ml100k: Dataset, scenario):
    with pytest.raises(ConfigError) as exc:
        identity_slices(ml100k, scenario)
    assert repr(scenario) in str(exc.value)
    assert "gender_age" in str(exc.value)


def test_slices_need_a_user_table(toy: Dataset):
    ds = Dataset.build("no-users", toy.items, toy.interactions)
    with pytest.raises(DataError) as exc:
        identity_slices(ds, "gender")
    assert "no-users" in str(exc.value) and "user table" in str(exc.value)
