"""The built-in MovieLens-100K dataset (bundled in the recbole wheel)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ctrlsim.data import Dataset, item_text
from ctrlsim.data.registry import BUILTIN, recbole_example_dir
from ctrlsim.errors import (
    DataError,
    DataFileError,
    EmptyHistoryError,
    MissingDependencyError,
    UnknownItemError,
    UnknownUserError,
)


def test_counts(ml100k: Dataset):
    assert ml100k.name == "ml-100k"
    assert len(ml100k.items) == 1682
    assert len(ml100k.interactions) == 100_000
    assert ml100k.interactions["user_id"].nunique() == 943
    assert len(ml100k.users) == 943
    assert len(ml100k.tags) == 19
    assert ml100k.summary() == {
        "name": "ml-100k", "items": 1682, "interactions": 100_000, "users": 943,
        "users_with_attributes": 943, "tags": 19, "source": ml100k.source,
    }
    assert "1682 items" in repr(ml100k) and "100000 interactions" in repr(ml100k)


def test_source_records_provider(ml100k: Dataset):
    assert ml100k.source["format"] == "recbole-atomic"
    assert "recbole" in ml100k.source["provider"]
    assert ml100k.source["path"].endswith("ml-100k")
    assert "ml-100k" in BUILTIN


def test_tags_are_the_movielens_genres(ml100k: Dataset):
    assert ml100k.tags == sorted(ml100k.tags)
    for genre in ("Action", "Children's", "Film-Noir", "Sci-Fi", "Western", "unknown"):
        assert genre in ml100k.tags
    assert set(ml100k.item_tags["kind"]) == {"genre"}
    assert list(ml100k.item_tags.columns) == ["item_id", "tag", "kind"]


def test_ids_are_strings(ml100k: Dataset):
    assert all(isinstance(i, str) for i in ml100k.items["item_id"])
    assert all(isinstance(i, str) for i in ml100k.interactions["item_id"])
    assert all(isinstance(u, str) for u in ml100k.interactions["user_id"])
    assert all(isinstance(u, str) for u in ml100k.users["user_id"])
    assert ml100k.items["item_id"].is_unique
    assert all(isinstance(i, str) for i in ml100k.item_ids)
    assert all(isinstance(u, str) for u in ml100k.user_ids)


def test_column_layout_and_types(ml100k: Dataset):
    assert list(ml100k.items.columns[:6]) == ["item_id", "title", "year", "text", "tags", "popularity"]
    assert list(ml100k.interactions.columns) == ["user_id", "item_id", "rating", "timestamp"]
    assert list(ml100k.users.columns[:4]) == ["user_id", "age", "gender", "occupation"]
    assert ml100k.interactions["rating"].dtype == np.float64
    assert ml100k.interactions["timestamp"].dtype == np.int64
    assert str(ml100k.items["year"].dtype) == "Int64"
    assert str(ml100k.users["age"].dtype) == "Int64"
    assert all(isinstance(t, tuple) for t in ml100k.items["tags"])
    assert set(ml100k.interactions["rating"].unique()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert set(ml100k.users["gender"]) == {"M", "F"}


def test_first_item(ml100k: Dataset):
    toy = ml100k.item("1")
    assert toy["title"] == "Toy Story"
    assert toy["year"] == 1995
    assert toy["tags"] == ("Animation", "Children's", "Comedy")
    assert toy["text"] == "Toy Story (1995), (Animation, Children's, Comedy)"
    assert toy["text"] == item_text("Toy Story", 1995, ("Animation", "Children's", "Comedy"))


def test_interactions_sorted_by_timestamp(ml100k: Dataset):
    ts = ml100k.interactions["timestamp"]
    assert ts.is_monotonic_increasing
    assert ml100k.interactions.index.equals(pd.RangeIndex(len(ml100k.interactions)))


def test_popularity_is_distinct_users_per_item(ml100k: Dataset):
    expected = ml100k.interactions.groupby("item_id")["user_id"].nunique()
    pop = ml100k.items.set_index("item_id")["popularity"]
    assert pop.dtype.kind == "i"
    assert (pop.reindex(expected.index) == expected).all()
    # Items nobody rated (none in ml-100k, but the rule holds) would have popularity 0.
    assert (pop.drop(expected.index) == 0).all()
    assert pop.sum() == len(ml100k.interactions.drop_duplicates(["user_id", "item_id"]))
    assert pop["50"] == 583  # Star Wars, the most-rated movie in ml-100k
    assert pop.idxmax() == "50"


def test_history_is_chronological(ml100k: Dataset):
    for user in ("1", "196", "405", "943"):
        hist = ml100k.history(user)
        assert (hist["user_id"] == user).all()
        assert hist["timestamp"].is_monotonic_increasing
        assert len(hist) == (ml100k.interactions["user_id"] == user).sum()
        assert ml100k.history_ids(user) == hist["item_id"].tolist()
    assert len(ml100k.history("405")) == 737  # the most active user


def test_history_accepts_int_user_id(ml100k: Dataset):
    assert ml100k.history(1).equals(ml100k.history("1"))


def test_history_min_rating(ml100k: Dataset):
    full = ml100k.history("1")
    liked = ml100k.history("1", min_rating=4)
    assert 0 < len(liked) < len(full)
    assert (liked["rating"] >= 4).all()
    assert liked["timestamp"].is_monotonic_increasing
    assert len(liked) == (full["rating"] >= 4).sum()


def test_history_ids_require_raises_on_empty(ml100k: Dataset):
    assert ml100k.history_ids("1", min_rating=6) == []
    with pytest.raises(EmptyHistoryError) as exc:
        ml100k.history_ids("1", min_rating=6, require=True)
    assert "'1'" in str(exc.value) and "min_rating=6" in str(exc.value)
    assert isinstance(exc.value, DataError)
    assert ml100k.history_ids("1", require=True)  # non-empty history passes


def test_unknown_user(ml100k: Dataset):
    with pytest.raises(UnknownUserError) as exc:
        ml100k.history("no-such-user")
    assert "no-such-user" in str(exc.value) and "ml-100k" in str(exc.value)
    assert isinstance(exc.value, KeyError)


def test_items_with_tag(ml100k: Dataset):
    noir = ml100k.items_with_tag("Film-Noir")
    assert noir
    assert len(noir) == 24
    tags = ml100k.items.set_index("item_id")["tags"]
    assert all("Film-Noir" in tags[i] for i in noir)
    # Exactly the items carrying the tag, in catalogue order.
    expected = [i for i, t in zip(ml100k.items["item_id"], ml100k.items["tags"]) if "Film-Noir" in t]
    assert noir == expected
    assert ml100k.items_with_tag("Film-Noir", kind="genre") == noir
    assert ml100k.items_with_tag("Film-Noir", kind="trigger") == []


def test_items_with_unknown_tag(ml100k: Dataset):
    with pytest.raises(DataError) as exc:
        ml100k.items_with_tag("Space Opera")
    assert "Space Opera" in str(exc.value)


def test_indices(ml100k: Dataset):
    idx = ml100k.indices(["1", "50", "1682"])
    assert idx.dtype == np.int64
    assert idx.tolist() == [ml100k.item_index["1"], ml100k.item_index["50"], ml100k.item_index["1682"]]
    assert ml100k.items["item_id"].iloc[idx].tolist() == ["1", "50", "1682"]
    assert ml100k.indices([]).tolist() == []
    ml100k.check_items(["1", "2", "3"])  # no error


@pytest.mark.parametrize("bad", [["1683"], ["1", "0"], [1], ["Toy Story"]])
def test_indices_unknown_item(ml100k: Dataset, bad):
    with pytest.raises(UnknownItemError) as exc:
        ml100k.indices(bad)
    assert isinstance(exc.value, KeyError) and isinstance(exc.value, DataError)
    assert "ml-100k" in str(exc.value)
    missing = [b for b in bad if b not in ml100k.item_index]
    assert exc.value.item_ids == missing
    assert repr(missing[0]) in str(exc.value)


def test_check_items_unknown(ml100k: Dataset):
    with pytest.raises(UnknownItemError) as exc:
        ml100k.check_items(["1", "99999", "abc"])
    assert exc.value.item_ids == ["99999", "abc"]
    assert "'99999'" in str(exc.value) and "'abc'" in str(exc.value)
    with pytest.raises(UnknownItemError):
        ml100k.item("99999")


def test_unknown_item_error_truncates_long_lists():
    err = UnknownItemError([str(i) for i in range(8)], "demo")
    assert str(err).endswith("...")
    assert "'4'" in str(err) and "'5'" not in str(err)
    assert UnknownItemError("x").item_ids == ["x"]


def test_bundled_dataset_lookup_errors(monkeypatch):
    import importlib.util

    from ctrlsim.data import registry

    if importlib.util.find_spec("recbole") is None:
        pytest.skip("recbole not installed")
    with pytest.raises(DataFileError) as exc:
        recbole_example_dir("no-such-bundled-set")
    assert "no-such-bundled-set" in str(exc.value)

    real = importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name, *a: None if name == "recbole" else real(name, *a))
    with pytest.raises(MissingDependencyError) as exc:
        recbole_example_dir("ml-100k")
    assert 'ctrlsim[recbole]' in str(exc.value)
    assert isinstance(exc.value, ImportError)
