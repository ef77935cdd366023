"""Loaders for the real distribution formats, on small files written by conftest fixtures."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pandas as pd
import pytest

from ctrlsim.data import (
    FORMATS,
    Dataset,
    identity_slices,
    load_amazon,
    load_atomic,
    load_dataset,
    load_lastfm_1k,
    load_movielens_csv,
    load_movielens_dat,
)
from ctrlsim.data.formats import split_title_year
from ctrlsim.data.registry import detect_format
from ctrlsim.errors import DataFileError, UnknownDatasetError


def by_id(ds: Dataset) -> pd.DataFrame:
    return ds.items.set_index("item_id")


def check_invariants(ds: Dataset) -> None:
    """What every loader guarantees."""
    assert ds.items["item_id"].is_unique
    assert all(isinstance(i, str) for i in ds.items["item_id"])
    assert all(isinstance(i, str) for i in ds.interactions["item_id"])
    assert all(isinstance(u, str) for u in ds.interactions["user_id"])
    assert ds.interactions["timestamp"].is_monotonic_increasing
    assert ds.interactions["timestamp"].dtype == "int64"
    assert ds.interactions["rating"].dtype == "float64"
    assert ds.interactions["item_id"].isin(ds.items["item_id"]).all()
    expected_pop = ds.interactions.groupby("item_id")["user_id"].nunique()
    pop = by_id(ds)["popularity"]
    assert (pop.reindex(expected_pop.index) == expected_pop).all()
    assert (pop.drop(expected_pop.index) == 0).all()


# --------------------------------------------------------------- title parsing
@pytest.mark.parametrize("raw, expected", [
    ("Heat (1995)", ("Heat", 1995)),
    ("American President, The (1995)", ("American President, The", 1995)),
    ("Star Wars: Episode IV - A New Hope (1977)", ("Star Wars: Episode IV - A New Hope", 1977)),
    ("Amélie (Fabuleux destin d'Amélie Poulain, Le) (2001)",
     ("Amélie (Fabuleux destin d'Amélie Poulain, Le)", 2001)),
    ("Babylon 5", ("Babylon 5", None)),
    ("  Blade Runner (1982)  ", ("Blade Runner", 1982)),
    ("Death Note: Desu nôto (2006–2007)", ("Death Note: Desu nôto (2006–2007)", None)),
])
def test_split_title_year(raw, expected):
    assert split_title_year(raw) == expected


# -------------------------------------------------------------- MovieLens-1M
def test_movielens_dat(ml1m_dir: Path):
    ds = load_movielens_dat(ml1m_dir)
    check_invariants(ds)
    assert ds.name == "ml-1m"
    assert len(ds.items) == 7
    assert len(ds.interactions) == 10
    assert ds.interactions["user_id"].nunique() == 4
    assert ds.source == {"format": "movielens-dat", "path": str(ml1m_dir)}
    items = by_id(ds)
    # latin-1 decoded correctly; year split off the title.
    assert items.loc["73", "title"] == "Misérables, Les"
    assert items.loc["73", "year"] == 1995
    assert items.loc["73", "tags"] == ("Drama", "Musical")
    assert items.loc["260", "title"] == "Star Wars: Episode IV - A New Hope"
    assert items.loc["260", "tags"] == ("Action", "Adventure", "Fantasy", "Sci-Fi")
    assert items.loc["1", "text"] == "Toy Story (1995), (Animation, Children's, Comedy)"
    assert items.loc["2", "popularity"] == 0  # Jumanji is in the catalogue but unrated
    assert items.loc["1193", "popularity"] == 2
    assert ds.tags == sorted({"Animation", "Children's", "Comedy", "Adventure", "Fantasy", "Drama",
                              "Musical", "Action", "Sci-Fi"})
    first = ds.interactions.iloc[0]
    got = (first["user_id"], first["item_id"], first["rating"], first["timestamp"])
    assert got == ("4", "1", 4.0, 978294008)
    assert ds.history_ids("1") == ["3408", "1193", "1", "2355"]


def test_movielens_dat_users(ml1m_dir: Path):
    ds = load_movielens_dat(ml1m_dir)
    users = ds.users.set_index("user_id")
    assert list(users.index) == ["1", "2", "3", "4"]
    assert users["age"].tolist() == [1, 56, 25, 45]
    assert users["gender"].tolist() == ["F", "M", "M", "M"]
    # Occupation codes decoded with the ML-1M README table.
    assert users["occupation"].tolist() == ["K-12 student", "self-employed", "scientist",
                                            "executive/managerial"]
    # Bracket codes fall into the right identity age groups.
    ages = identity_slices(ds, "age")
    assert ages.to_dict() == {"1": "age_young_adult", "2": "age_older", "3": "age_young_adult",
                              "4": "age_middle_aged"}


def test_movielens_dat_without_users(ml1m_dir: Path):
    (ml1m_dir / "users.dat").unlink()
    ds = load_movielens_dat(ml1m_dir, name="ml1m-no-users")
    assert ds.name == "ml1m-no-users"
    assert ds.users.empty
    assert list(ds.users.columns) == ["user_id", "age", "gender", "occupation"]
    assert len(ds.interactions) == 10


# ------------------------------------------------------- MovieLens-25M / csv
def test_movielens_csv(ml25m_dir: Path):
    ds = load_movielens_csv(ml25m_dir)
    check_invariants(ds)
    assert ds.name == "ml-25m"
    assert len(ds.items) == 6
    assert len(ds.interactions) == 7
    assert ds.interactions["user_id"].nunique() == 3
    assert ds.users.empty
    assert ds.source["format"] == "movielens-csv"
    items = by_id(ds)
    assert items.loc["11", "title"] == "American President, The"  # quoted title with a comma
    assert items.loc["11", "year"] == 1995
    assert items.loc["2338", "title"] == '"Great Performances" Cats'  # doubled quotes unescaped
    assert items.loc["4973", "title"] == "Amélie (Fabuleux destin d'Amélie Poulain, Le)"
    assert items.loc["4973", "year"] == 2001
    assert items.loc["4973", "tags"] == ("Comedy", "Romance")
    assert items.loc["40697", "title"] == "Babylon 5"
    assert pd.isna(items.loc["40697", "year"])
    assert items.loc["40697", "text"] == "Babylon 5, (Sci-Fi)"
    # "(no genres listed)" is not a tag.
    assert items.loc["114335", "tags"] == ()
    assert items.loc["114335", "text"] == "La cravate (1957)"
    assert "(no genres listed)" not in ds.tags
    assert items.loc["2338", "popularity"] == 0
    assert items.loc["4973", "popularity"] == 2
    # Half-star ratings survive as floats.
    assert sorted(ds.interactions["rating"].unique()) == [0.5, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]
    assert ds.history_ids("1") == ["11", "4973", "1"]


# ------------------------------------------------------------------ Last.fm-1K
def test_lastfm_folder(lastfm_dir: Path):
    ds = load_lastfm_1k(lastfm_dir)
    check_invariants(ds)
    assert ds.name == "lastfm-1k"
    assert ds.source["format"] == "lastfm-1k"
    # 5 distinct tracks: 3 without a track mbid (keyed "artist - track"), 2 with one.
    assert len(ds.items) == 5
    items = by_id(ds)
    assert "坂本龍一 - Composition 0919 (Live_2009_4_15)" in items.index
    assert "Deep Dish - Fuck Me Im Famous (Pacha Ibiza)-09-28-2007" in items.index
    help_id = "5dd95ad7-9e6c-4a8f-a6d5-8e7e2d2a6b7f"
    assert items.loc[help_id, "title"] == "Help! by The Beatles"
    assert items.loc[help_id, "artist"] == "The Beatles"
    # One interaction per (user, track): rating = play count, timestamp = first play.
    assert len(ds.interactions) == 6
    inter = ds.interactions.set_index(["user_id", "item_id"])
    help_row = inter.loc[("user_000002", help_id)]
    assert help_row["rating"] == 3.0
    first_play = int(pd.Timestamp("2009-06-19T22:59:01Z").timestamp())
    assert help_row["timestamp"] == first_play
    comp = inter.loc[("user_000001", "坂本龍一 - Composition 0919 (Live_2009_4_15)")]
    assert comp["rating"] == 2.0
    assert comp["timestamp"] == int(pd.Timestamp("2009-05-04T13:42:52Z").timestamp())
    karma = "6b9a509f-6907-4a6e-9345-2f12da09ba4b"
    assert items.loc[karma, "popularity"] == 2
    assert ds.interactions["timestamp"].iloc[0] == int(pd.Timestamp("2008-12-31T23:59:59Z").timestamp())
    assert ds.tags == []


def test_lastfm_profiles(lastfm_dir: Path):
    ds = load_lastfm_1k(lastfm_dir)
    users = ds.users.set_index("user_id")
    assert len(users) == 5  # profiles of users without events are kept
    assert users.loc["user_000001", "gender"] == "M"  # lower-case m/f normalised
    assert users.loc["user_000002", "gender"] == "F"
    assert pd.isna(users.loc["user_000005", "gender"])  # empty gender stays missing
    assert users.loc["user_000003", "age"] == 22
    assert pd.isna(users.loc["user_000001", "age"])
    assert identity_slices(ds, "gender").to_dict() == {
        "user_000001": "gender_M", "user_000002": "gender_F", "user_000003": "gender_M",
        "user_000004": "gender_F"}
    assert identity_slices(ds, "age").to_dict() == {"user_000003": "age_young_adult"}


def test_lastfm_events_file_path(lastfm_dir: Path, tmp_path: Path):
    events = lastfm_dir / "userid-timestamp-artid-artname-traid-traname.tsv"
    ds = load_lastfm_1k(events, name="lfm")
    assert ds.name == "lfm"
    assert len(ds.users) == 5  # profile found next to the events file
    assert ds.source["path"] == str(events)
    # An events file alone (renamed, no profile next to it) still loads.
    lone = tmp_path / "sample.tsv"
    shutil.copy(events, lone)
    ds2 = load_lastfm_1k(lone)
    assert ds2.users.empty
    assert len(ds2.interactions) == 6


# ------------------------------------------------------------- RecBole atomic
def test_atomic(atomic_dir: Path):
    ds = load_atomic(atomic_dir)
    check_invariants(ds)
    assert ds.name == "mini"
    assert ds.source == {"format": "recbole-atomic", "path": str(atomic_dir)}
    assert len(ds.items) == 5 and len(ds.interactions) == 5 and len(ds.users) == 3
    items = by_id(ds)
    assert items.loc["101", "title"] == "Toy Story"
    assert items.loc["101", "tags"] == ("Animation", "Children's", "Comedy")  # token_seq split on spaces
    assert items.loc["105", "tags"] == ("Drama", "Film-Noir")
    assert pd.isna(items.loc["104", "year"])
    assert items.loc["104", "text"] == "Unknown Film, (unknown)"
    assert items.loc["105", "popularity"] == 0
    assert items.loc["101", "popularity"] == 2
    assert ds.history_ids("2") == ["101", "103"]
    assert ds.interactions["rating"].tolist() == [5.0, 2.0, 4.0, 3.0, 1.0]
    users = ds.users.set_index("user_id")
    assert users["age"].tolist() == [24, 53, 35]
    assert users.loc["3", "occupation"] == "writer"
    assert "zip_code" not in ds.users.columns


def test_atomic_inter_only_without_time_or_rating(tmp_path: Path):
    folder = tmp_path / "clicks"
    folder.mkdir()
    (folder / "clicks.inter").write_text(
        "session_id:token\tuser_id:token\titem_id:token\n"
        "s1\tu2\tb\n"
        "s1\tu1\ta\n"
        "s2\tu1\tc\n"
        "s2\tu2\ta\n"
    )
    ds = load_atomic(folder)
    check_invariants(ds)
    # Without a .item file items are the ids seen, titled by id; without timestamps
    # the file order is the chronology; without ratings every rating is 1.
    assert ds.items["item_id"].tolist() == ["b", "a", "c"]
    assert ds.items["title"].tolist() == ["b", "a", "c"]
    assert ds.interactions["timestamp"].tolist() == [0, 1, 2, 3]
    assert ds.interactions["rating"].tolist() == [1.0] * 4
    assert ds.history_ids("u1") == ["a", "c"]
    assert ds.users.empty
    assert ds.tags == []


def test_atomic_explicit_name_and_item_alternatives(tmp_path: Path):
    folder = tmp_path / "some-folder"
    folder.mkdir()
    (folder / "books.inter").write_text(
        "user_id:token\titem_id:token\trating:float\ttime:float\n"
        "7\tbk1\t5\t1500000000\n"
        "8\tbk2\t4\t1400000000\n"
    )
    (folder / "books.item").write_text(
        "item_id:token\ttitle:token_seq\tyear:token\tgenre:token_seq\n"
        "bk1\tDune\t1965\tscifi classic\n"
        "bk2\tEmma\t1815\tromance\n"
    )
    ds = load_atomic(folder, "books")
    assert ds.name == "books"
    assert ds.interactions["item_id"].tolist() == ["bk2", "bk1"]  # sorted by the `time` column
    assert by_id(ds).loc["bk1", "text"] == "Dune (1965), (scifi, classic)"


# -------------------------------------------------------------------- Amazon
def test_amazon_2014(amazon_2014):
    reviews, meta = amazon_2014
    ds = load_amazon(reviews, meta)
    check_invariants(ds)
    assert ds.name == "reviews_Musical_Instruments_5"
    assert len(ds.items) == 3
    # The review of B0000XXXXX has no metadata and is dropped (counted in source).
    assert len(ds.interactions) == 3
    assert "B0000XXXXX" not in set(ds.interactions["item_id"])
    assert ds.source["dropped_interactions_without_metadata"] == 1
    assert ds.source["format"] == "amazon-jsonl"
    assert ds.source["metadata"] == str(meta)
    items = by_id(ds)
    assert items.loc["1384719342", "title"] == "Monster Cable Guitar Pop Filter"
    # Nested 2014 category paths are flattened, duplicates removed, order kept.
    assert items.loc["1384719342", "tags"] == (
        "Musical Instruments", "Instrument Accessories", "Guitar & Bass Accessories", "Microphones")
    assert items.loc["1384719342", "description"] == "A pop filter that blocks breath noise."
    assert items.loc["1384719342", "text"].endswith(". A pop filter that blocks breath noise.")
    assert items.loc["B00006I5SD", "title"] == "B00006I5SD"  # no title: falls back to the asin
    assert items.loc["1384719342", "popularity"] == 2
    assert set(ds.item_tags["kind"]) == {"category"}
    assert ds.items_with_tag("Cables", kind="category") == ["B00004Y2UT"]
    assert ds.history_ids("A2IBPI20UZIR0U") == ["B00004Y2UT", "1384719342"]
    assert ds.interactions["timestamp"].tolist() == [1356048000, 1363392000, 1393545600]


def test_amazon_2023_gzipped(amazon_2023):
    reviews, meta = amazon_2023
    ds = load_amazon(reviews, meta)
    check_invariants(ds)
    assert ds.name == "All_Beauty"
    assert len(ds.items) == 3 and len(ds.interactions) == 3
    assert "dropped_interactions_without_metadata" not in ds.source
    # Items are keyed by parent_asin; timestamps converted from ms to s.
    assert set(ds.interactions["item_id"]) == {"B00YQ6X8EO", "B081TJ8YS3", "B097R46CSY"}
    assert ds.interactions["timestamp"].tolist() == [1588615855, 1588687728, 1589665266]
    items = by_id(ds)
    assert items.loc["B00YQ6X8EO", "tags"] == ("Beauty & Personal Care", "Hair Care")
    assert items.loc["B00YQ6X8EO", "description"] == "Sea salt spray for beach waves."
    assert items.loc["B081TJ8YS3", "tags"] == ()
    assert items.loc["B081TJ8YS3", "description"] == ""
    assert items.loc["B081TJ8YS3", "text"] == "All Natural Vegan Dry Shampoo Powder"
    assert ds.history_ids("AGKHLEW2SOWHNMFQIJGBECAF7INQ") == ["B081TJ8YS3", "B00YQ6X8EO"]


def test_amazon_reviews_only(amazon_2023, tmp_path: Path):
    reviews, _ = amazon_2023
    ds = load_amazon(reviews, name="beauty")
    assert ds.name == "beauty"
    assert ds.items["item_id"].tolist() == ds.items["title"].tolist()
    assert len(ds.interactions) == 3
    assert "metadata" not in ds.source
    # Plain (not gzipped) 2023 reviews read the same.
    plain = tmp_path / "All_Beauty.jsonl"
    with gzip.open(reviews, "rt", encoding="utf-8") as fh:
        plain.write_text(fh.read(), encoding="utf-8")
    assert load_amazon(plain).interactions.equals(ds.interactions)


def test_amazon_blank_lines_are_skipped(amazon_2014, tmp_path: Path):
    reviews, meta = amazon_2014
    spaced = tmp_path / "spaced.json"
    spaced.write_text("\n" + reviews.read_text().replace("\n", "\n\n"))
    assert len(load_amazon(spaced, meta).interactions) == 3


# -------------------------------------------------- load_dataset + detection
def test_detect_format(ml1m_dir, ml25m_dir, lastfm_dir, atomic_dir, amazon_2014, amazon_2023):
    assert detect_format(ml1m_dir) == "movielens-dat"
    assert detect_format(ml25m_dir) == "movielens-csv"
    assert detect_format(lastfm_dir) == "lastfm-1k"
    assert detect_format(lastfm_dir / "userid-timestamp-artid-artname-traid-traname.tsv") == "lastfm-1k"
    assert detect_format(atomic_dir) == "recbole-atomic"
    assert detect_format(amazon_2014[0]) == "amazon-jsonl"
    assert detect_format(amazon_2023[0]) == "amazon-jsonl"
    assert set(FORMATS) == {"recbole-atomic", "movielens-dat", "movielens-csv", "lastfm-1k", "amazon-jsonl"}


def test_load_dataset_detects_each_format(ml1m_dir, ml25m_dir, lastfm_dir, atomic_dir, amazon_2014,
                                          amazon_2023):
    assert load_dataset(ml1m_dir).source["format"] == "movielens-dat"
    assert len(load_dataset(str(ml1m_dir)).items) == 7  # str paths work too
    assert load_dataset(ml25m_dir).source["format"] == "movielens-csv"
    assert load_dataset(lastfm_dir).source["format"] == "lastfm-1k"
    assert load_dataset(lastfm_dir / "userid-timestamp-artid-artname-traid-traname.tsv").name == "lastfm-1k"
    atomic = load_dataset(atomic_dir)
    assert atomic.source["format"] == "recbole-atomic" and atomic.name == "mini"
    a14 = load_dataset(amazon_2014[0], metadata=amazon_2014[1])
    assert a14.source["format"] == "amazon-jsonl" and len(a14.items) == 3
    a23 = load_dataset(amazon_2023[0], metadata=amazon_2023[1], missing_metadata="error")
    assert len(a23.interactions) == 3


def test_load_dataset_atomic_name_from_inter_file(atomic_dir: Path, tmp_path: Path):
    # The folder name need not match the file stem: the .inter file names the dataset.
    renamed = tmp_path / "renamed-folder"
    shutil.copytree(atomic_dir, renamed)
    ds = load_dataset(renamed)
    assert ds.name == "mini" and len(ds.items) == 5
    assert load_dataset(renamed, name="mini").name == "mini"


def test_load_dataset_explicit_format(tmp_path: Path, lastfm_dir: Path):
    # A Last.fm events file under a name detection cannot place.
    odd = tmp_path / "events.txt"
    shutil.copy(lastfm_dir / "userid-timestamp-artid-artname-traid-traname.tsv", odd)
    with pytest.raises(DataFileError) as exc:
        load_dataset(odd)
    assert "events.txt" in str(exc.value) and "format=" in str(exc.value)
    assert len(load_dataset(odd, format="lastfm-1k").interactions) == 6


def test_load_dataset_unknown_names_and_formats(tmp_path: Path, ml1m_dir: Path):
    with pytest.raises(UnknownDatasetError) as exc:
        load_dataset("ml-1m-that-does-not-exist")
    msg = str(exc.value)
    assert "'ml-1m-that-does-not-exist'" in msg and "ml-100k" in msg
    assert not msg.startswith('"')  # not KeyError's repr()
    with pytest.raises(UnknownDatasetError) as exc:
        load_dataset(ml1m_dir, format="parquet")
    assert "'parquet'" in str(exc.value) and "movielens-dat" in str(exc.value)
    # A built-in name with an explicit format is treated as a path.
    with pytest.raises(UnknownDatasetError):
        load_dataset("ml-100k", format="recbole-atomic")
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    with pytest.raises(DataFileError) as exc:
        load_dataset(empty)
    assert "empty-folder" in str(exc.value) and "cannot tell the dataset format" in str(exc.value)
