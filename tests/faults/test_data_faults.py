"""Bad numbers, shifted columns and damaged Amazon files give typed errors naming the file, line
and value (issue 14, points 3, 4, 5 and the `UserState` part of 8).

Kinds covered (36):
- numbers (22): timestamps out of range (1e26) or infinite, ratings NaN or infinite, years not
  whole (1995.7) or out of range (1e20), ages negative or not whole, an empty or unknown ML-1M
  occupation, ML-1M ratings above 5 or not whole, ML-25M ratings above 5 and timestamps out of
  range, a Last.fm age that is a word, Amazon ratings NaN, infinite, above 5 or boolean and review
  times out of range, tag votes below 0 and genome relevance above 1;
- the same checks on tables handed to `Dataset.build` (3): year 1995.7, timestamp 1e26, a rating
  that is a word;
- extra fields (3): ratings.csv with an extra field in its first row (pandas would shift the
  columns), ratings.dat ('::') and a RecBole .inter file with a long row;
- Amazon files (6): a plain file named .gz (read), a truncated gzip, non-UTF-8 bytes, a category
  given as a string, a null description, an unknown `missing_metadata` option;
- `UserState` (2): history "12" and history None.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from ctrlsim.data import (
    Dataset,
    attach_tag_scores,
    attach_tag_votes,
    load_amazon,
    load_atomic,
    load_lastfm_1k,
    load_movielens_csv,
    load_movielens_dat,
)
from ctrlsim.errors import ConfigError, DataError, DataFileError
from ctrlsim.recommenders.base import UserState

INTER_HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
INTER_ROWS = ["1\t101\t4\t881250949\n", "1\t102\t3\t881250950\n", "2\t101\t5\t881250000\n"]
ITEM = ("item_id:token\tmovie_title:token_seq\trelease_year:token\n"
        "101\tToy Story\t1995\n102\tGoldenEye\t1995\n")
USER = "user_id:token\tage:token\tgender:token\toccupation:token\n1\t24\tM\ttechnician\n2\t53\tF\tother\n"

ML1M_MOVIES = "1::Toy Story (1995)::Animation\n2::Jumanji (1995)::Adventure\n"
ML1M_RATINGS = "1::1::5::978300760\n1::2::4::978300275\n2::1::3::978298413\n"
ML1M_USERS = "1::F::1::10::48067\n2::M::56::16::70072\n"

ML25M_MOVIES = ("movieId,title,genres\n1,Toy Story (1995),Animation\n"
                '11,"American President, The (1995)",Drama\n')
ML25M_RATINGS = "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,11,3.5,964981247\n2,1,2.5,1445714835\n"

REVIEW = {"reviewerID": "A1", "asin": "B1", "overall": 5.0, "unixReviewTime": 1393545600}
META = {"asin": "B1", "title": "XLR cable", "categories": [["Musical Instruments", "Cables"]],
        "description": "Balanced, 10 ft."}


def expect(error_class, call, *fragments):
    """`call()` raises `error_class` whose message holds every fragment; returns the message."""
    with pytest.raises(error_class) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def file_error(call, path: Path, *fragments):
    """A `DataFileError` for exactly `path` whose message holds every fragment."""
    message = expect(DataFileError, call, str(path), *fragments)
    assert message.startswith(f"{path}: "), message


# ------------------------------------------------------------------ fixtures
@pytest.fixture
def atomic(tmp_path: Path) -> Path:
    folder = tmp_path / "mini"
    folder.mkdir()
    (folder / "mini.inter").write_text(INTER_HEADER + "".join(INTER_ROWS))
    (folder / "mini.item").write_text(ITEM)
    (folder / "mini.user").write_text(USER)
    return folder


@pytest.fixture
def ml1m(tmp_path: Path) -> Path:
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    for name, text in (("movies.dat", ML1M_MOVIES), ("ratings.dat", ML1M_RATINGS), ("users.dat", ML1M_USERS)):
        (folder / name).write_bytes(text.encode("latin-1"))
    return folder


@pytest.fixture
def ml25m(tmp_path: Path) -> Path:
    folder = tmp_path / "ml-25m"
    folder.mkdir()
    (folder / "movies.csv").write_text(ML25M_MOVIES)
    (folder / "ratings.csv").write_text(ML25M_RATINGS)
    return folder


def jsonl(path: Path, *records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------ point 3: numbers
def _inter_with(atomic: Path, row: str) -> Path:
    path = atomic / "mini.inter"
    path.write_text(INTER_HEADER + INTER_ROWS[0] + row)
    return path


@pytest.mark.parametrize("row, fragment", [
    ("1\t102\t3\t1e26\n", "timestamp='1e26' is out of range"),
    ("1\t102\t3\tinf\n", "timestamp='inf' is not a finite number"),
    ("1\t102\tnan\t881250950\n", "rating='nan' is not a number"),
    ("1\t102\t-inf\t881250950\n", "rating='-inf' is not a finite number"),
])
def test_atomic_interaction_numbers(atomic, row, fragment):
    path = _inter_with(atomic, row)
    file_error(lambda: load_atomic(atomic), path, "line 3: " + fragment)


@pytest.mark.parametrize("year, fragment", [("1995.7", "is not a whole number"), ("1e20", "is out of range")])
def test_atomic_year(atomic, year, fragment):
    path = atomic / "mini.item"
    path.write_text(ITEM.replace("GoldenEye\t1995", f"GoldenEye\t{year}"))
    file_error(lambda: load_atomic(atomic), path, f"line 3: release_year={year!r} {fragment}")


@pytest.mark.parametrize("age, fragment", [("-3", "is out of range (expected 0 to 150)"),
                                           ("30.5", "is not a whole number")])
def test_atomic_age(atomic, age, fragment):
    path = atomic / "mini.user"
    path.write_text(USER.replace("53", age))
    file_error(lambda: load_atomic(atomic), path, f"line 3: age={age!r} {fragment}")


@pytest.mark.parametrize("line, fragment", [
    ("2::M::56::::70072\n", "line 2: missing value for 'occupation'"),
    ("2::M::56::25::70072\n", "line 2: occupation='25' is out of range (expected 0 to 20)"),
])
def test_ml1m_occupation(ml1m, line, fragment):
    path = ml1m / "users.dat"
    path.write_text("1::F::1::10::48067\n" + line)
    file_error(lambda: load_movielens_dat(ml1m), path, fragment)


@pytest.mark.parametrize("rating, fragment", [("6", "is out of range (expected 1 to 5)"),
                                              ("4.5", "is not a whole number")])
def test_ml1m_rating(ml1m, rating, fragment):
    path = ml1m / "ratings.dat"
    path.write_text(ML1M_RATINGS.replace("1::2::4::", f"1::2::{rating}::"))
    file_error(lambda: load_movielens_dat(ml1m), path, f"line 2: rating={rating!r} {fragment}")


@pytest.mark.parametrize("old, new, fragment", [
    ("1,11,3.5,", "1,11,7.5,", "line 3: rating='7.5' is out of range (expected 0.5 to 5.0)"),
    ("964981247", "1e26", "line 3: timestamp='1e26' is out of range"),
])
def test_ml25m_numbers(ml25m, old, new, fragment):
    path = ml25m / "ratings.csv"
    path.write_text(ML25M_RATINGS.replace(old, new))
    file_error(lambda: load_movielens_csv(ml25m), path, fragment)


def test_lastfm_age_word(tmp_path):
    folder = tmp_path / "lastfm"
    folder.mkdir()
    (folder / "userid-timestamp-artid-artname-traid-traname.tsv").write_text(
        "user_000001\t2009-05-04T23:08:57Z\ta1\tDeep Dish\tt1\tFlashdance\n")
    profiles = folder / "userid-profile.tsv"
    profiles.write_text("#id\tgender\tage\tcountry\tregistered\n"
                        "user_000001\tm\ttwenty\tJapan\tAug 13, 2006\n")
    file_error(lambda: load_lastfm_1k(folder), profiles, "line 2: age='twenty' is not a number")


@pytest.mark.parametrize("field, value, fragment", [
    ("overall", float("nan"), "rating=nan is not a number"),
    ("overall", float("inf"), "rating=inf is not a finite number"),
    ("overall", 6, "rating=6 is out of range (expected 0.0 to 5.0)"),
    ("overall", True, "rating=True is not a number"),
    ("unixReviewTime", 1e26, "time=1e+26 is out of range"),
])
def test_amazon_review_numbers(tmp_path, field, value, fragment):
    reviews = jsonl(tmp_path / "reviews.json", REVIEW, {**REVIEW, "reviewerID": "A2", field: value})
    file_error(lambda: load_amazon(reviews), reviews, "line 2: " + fragment)


def test_side_table_numbers(atomic, tmp_path):
    ds = load_atomic(atomic)
    votes = tmp_path / "votes.csv"
    votes.write_text("item_id,tag,yes,no\n101,clowns,5,1\n102,spiders,-2,1\n")
    file_error(lambda: attach_tag_votes(ds, votes), votes, "line 3: yes='-2' is out of range")
    scores = tmp_path / "genome.csv"
    scores.write_text("item_id,tag,relevance\n101,funny,0.9\n102,dark,1.5\n")
    file_error(lambda: attach_tag_scores(ds, scores), scores, "line 3: relevance='1.5' is out of range")


@pytest.mark.parametrize("table, column, value, fragment", [
    ("items", "year", 1995.7, "year=1995.7 (item_id 'b') is not a whole number"),
    ("inter", "timestamp", 1e26, "timestamp=1e+26 (item_id 'b') is out of range"),
    ("inter", "rating", "good", "rating='good' (item_id 'b') is not a number"),
])
def test_dataset_build_checks_numbers(table, column, value, fragment):
    tables = {
        "items": pd.DataFrame({"item_id": ["a", "b"], "title": ["A", "B"], "year": [1990, 1991]}),
        "inter": pd.DataFrame({"user_id": ["u", "u"], "item_id": ["a", "b"], "rating": [4.0, 3.0],
                               "timestamp": [10, 20]}),
    }
    tables[table][column] = tables[table][column].astype(object)
    tables[table].loc[1, column] = value
    message = expect(DataError, lambda: Dataset.build("toy", tables["items"], tables["inter"]), fragment)
    assert message.startswith("dataset 'toy': ")


# ------------------------------------------------------------------ point 4: extra fields
def test_extra_field_in_first_csv_row_is_not_taken_as_an_index(ml25m):
    path = ml25m / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\nu2,1,4.0,964982703,extra\n")
    file_error(lambda: load_movielens_csv(ml25m), path, "Expected 4 fields in line 2, saw 5")


def test_extra_field_in_dat_and_atomic_rows(ml1m, atomic):
    ratings = ml1m / "ratings.dat"
    ratings.write_text("1::1::5::978300760\n1::2::4::978300275::9\n")
    file_error(lambda: load_movielens_dat(ml1m), ratings, "Expected 4 fields in line 2, saw 5")
    inter = _inter_with(atomic, "1\t102\t3\t881250950\textra\n")
    file_error(lambda: load_atomic(atomic), inter, "Expected 4 fields in line 3, saw 5")


# ------------------------------------------------------------------ point 5: Amazon files
def test_plain_file_named_gz_is_read_by_content(tmp_path):
    plain = jsonl(tmp_path / "reviews.json", REVIEW, {**REVIEW, "reviewerID": "A2", "overall": 3.0})
    named_gz = tmp_path / "reviews.json.gz"
    named_gz.write_bytes(plain.read_bytes())
    expected = load_amazon(plain).interactions
    pd.testing.assert_frame_equal(load_amazon(named_gz).interactions, expected)
    assert expected["rating"].tolist() == [5.0, 3.0]


def test_truncated_gzip(tmp_path):
    path = tmp_path / "reviews.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for n in range(200):
            fh.write(json.dumps({**REVIEW, "reviewerID": f"A{n}"}) + "\n")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    file_error(lambda: load_amazon(path), path, "damaged or truncated gzip data")


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "reviews.json"
    good = json.dumps(REVIEW).encode() + b"\n"
    path.write_bytes(good + b'{"reviewerID": "Andr\xe9", "asin": "B1", "overall": 4, "unixReviewTime": 1}\n')
    file_error(lambda: load_amazon(path), path, "line 2: bytes that are not UTF-8 text", "xe9")


def test_category_string_and_null_description(tmp_path):
    reviews = jsonl(tmp_path / "reviews.json", REVIEW, {**REVIEW, "asin": "B2"})
    meta = jsonl(tmp_path / "meta.json", {**META, "categories": "Electronics"},
                 {"asin": "B2", "title": "Strap", "category": ["Music", "Straps"], "description": None})
    items = load_amazon(reviews, meta).items.set_index("item_id")
    assert items.loc["B1", "tags"] == ("Electronics",)  # not ('E', 'l', 'e', ...)
    assert items.loc["B2", "tags"] == ("Music", "Straps")
    assert items.loc["B2", "description"] == ""
    assert items.loc["B2", "text"] == "Strap, (Music, Straps)"  # no ". None"


def test_unknown_missing_metadata_option(tmp_path):
    reviews = jsonl(tmp_path / "reviews.json", REVIEW)
    meta = jsonl(tmp_path / "meta.json", META)
    expect(ConfigError, lambda: load_amazon(reviews, meta, missing_metadata="keep"),
           "missing_metadata must be one of ('drop', 'error'), got 'keep'")


# ------------------------------------------------------------------ point 8: UserState
@pytest.mark.parametrize("history, fragment", [("12", "got '12'; did you mean ('12',)?"), (None, "got None")])
def test_user_state_history_must_be_a_sequence(history, fragment):
    expect(ConfigError, lambda: UserState(history=history), "UserState.history must be a sequence", fragment)
