"""Every way a data file can be wrong raises a DataFileError/DataError naming the file and the problem."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from ctrlsim.data import (
    Dataset,
    load_amazon,
    load_atomic,
    load_dataset,
    load_lastfm_1k,
    load_movielens_csv,
    load_movielens_dat,
)
from ctrlsim.errors import (
    ConfigError,
    CtrlsimError,
    DataError,
    DataFileError,
    UnknownDatasetError,
    UnknownItemError,
)

LASTFM = "userid-timestamp-artid-artname-traid-traname.tsv"


def raises_file_error(fn, path: Path, *fragments: str) -> DataFileError:
    """Call fn, expect a DataFileError for `path` whose message holds every fragment."""
    with pytest.raises(DataFileError) as exc:
        fn()
    err = exc.value
    msg = str(err)
    assert path.name in msg, msg
    assert Path(err.path) == path, (err.path, path)
    assert msg.startswith(str(path) + ": "), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert isinstance(err, DataError) and isinstance(err, CtrlsimError) and isinstance(err, ValueError)
    return err


# ---------------------------------------------------------------- hierarchy
def test_error_hierarchy():
    err = DataFileError("/x/ratings.csv", "file is empty")
    assert err.path == "/x/ratings.csv" and err.problem == "file is empty"
    assert str(err) == "/x/ratings.csv: file is empty"
    assert issubclass(UnknownDatasetError, DataError) and issubclass(UnknownDatasetError, KeyError)
    assert str(UnknownDatasetError("no such dataset")) == "no such dataset"
    assert str(UnknownDatasetError()) == ""
    assert issubclass(UnknownItemError, KeyError)
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, CtrlsimError)


def test_unknown_dataset_name():
    with pytest.raises(UnknownDatasetError) as exc:
        load_dataset("movielens-7b")
    assert "movielens-7b" in str(exc.value)
    assert "not a built-in name" in str(exc.value)
    # Catchable as DataError and as KeyError.
    with pytest.raises(DataError):
        load_dataset("movielens-7b")
    with pytest.raises(KeyError):
        load_dataset("movielens-7b")


# ------------------------------------------------------------- missing files
@pytest.mark.parametrize("missing", ["movies.dat", "ratings.dat"])
def test_missing_movielens_dat_file(ml1m_dir: Path, missing):
    (ml1m_dir / missing).unlink()
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), ml1m_dir / missing, "file not found")


@pytest.mark.parametrize("missing", ["movies.csv", "ratings.csv"])
def test_missing_movielens_csv_file(ml25m_dir: Path, missing):
    (ml25m_dir / missing).unlink()
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), ml25m_dir / missing, "file not found")


def test_missing_atomic_inter(atomic_dir: Path):
    (atomic_dir / "mini.inter").unlink()
    raises_file_error(lambda: load_atomic(atomic_dir), atomic_dir / "mini.inter", "file not found")
    raises_file_error(lambda: load_atomic(atomic_dir, "other"), atomic_dir / "other.inter", "file not found")


def test_missing_lastfm_events(lastfm_dir: Path):
    (lastfm_dir / LASTFM).unlink()
    raises_file_error(lambda: load_lastfm_1k(lastfm_dir), lastfm_dir / LASTFM, "file not found")


def test_missing_amazon_files(amazon_2014, tmp_path: Path):
    reviews, meta = amazon_2014
    gone = tmp_path / "reviews_Books_5.json.gz"
    raises_file_error(lambda: load_amazon(gone), gone, "file not found")
    gone_meta = tmp_path / "meta_Books.json.gz"
    raises_file_error(lambda: load_amazon(reviews, gone_meta), gone_meta, "file not found")


# --------------------------------------------------------------- empty files
@pytest.mark.parametrize("loader, fixture, filename", [
    (load_movielens_dat, "ml1m_dir", "ratings.dat"),
    (load_movielens_dat, "ml1m_dir", "movies.dat"),
    (load_movielens_dat, "ml1m_dir", "users.dat"),
    (load_movielens_csv, "ml25m_dir", "ratings.csv"),
    (load_movielens_csv, "ml25m_dir", "movies.csv"),
    (load_atomic, "atomic_dir", "mini.inter"),
    (load_atomic, "atomic_dir", "mini.item"),
    (load_atomic, "atomic_dir", "mini.user"),
    (load_lastfm_1k, "lastfm_dir", LASTFM),
    (load_lastfm_1k, "lastfm_dir", "userid-profile.tsv"),
])
def test_empty_file(loader, fixture, filename, request):
    folder = request.getfixturevalue(fixture)
    (folder / filename).write_bytes(b"")
    raises_file_error(lambda: loader(folder), folder / filename, "file is empty")


def test_empty_amazon_files(amazon_2014, amazon_2023):
    reviews, meta = amazon_2014
    meta.write_bytes(b"")
    raises_file_error(lambda: load_amazon(reviews, meta), meta, "file is empty")
    reviews.write_bytes(b"")
    raises_file_error(lambda: load_amazon(reviews, meta), reviews, "file is empty")


def test_amazon_file_with_only_blank_lines(amazon_2014, amazon_2023):
    reviews, meta = amazon_2014
    meta.write_text("\n\n")
    raises_file_error(lambda: load_amazon(reviews, meta), meta, "no metadata")
    reviews.write_text("\n   \n")
    raises_file_error(lambda: load_amazon(reviews), reviews, "no reviews")
    # A gzip file holding nothing but a newline is not "empty" on disk but has no reviews.
    gz_reviews, _ = amazon_2023
    with gzip.open(gz_reviews, "wt") as fh:
        fh.write("\n")
    raises_file_error(lambda: load_amazon(gz_reviews), gz_reviews, "no reviews")


@pytest.mark.parametrize("loader, fixture, filename", [
    (load_movielens_dat, "ml1m_dir", "ratings.dat"),
    (load_movielens_csv, "ml25m_dir", "ratings.csv"),
    (load_movielens_csv, "ml25m_dir", "movies.csv"),
    (load_atomic, "atomic_dir", "mini.inter"),
])
def test_blank_lines_only(loader, fixture, filename, request):
    folder = request.getfixturevalue(fixture)
    (folder / filename).write_text("\n\n\n")
    err = raises_file_error(lambda: loader(folder), folder / filename, "no rows")
    assert "header" not in err.problem  # nothing, not even a header, was read


@pytest.mark.parametrize("loader, fixture, filename", [
    (load_movielens_dat, "ml1m_dir", "movies.dat"),
    (load_lastfm_1k, "lastfm_dir", LASTFM),
])
def test_blank_lines_only_headerless(loader, fixture, filename, request):
    # Headerless formats: the problem must not talk about a header the format lacks.
    folder = request.getfixturevalue(fixture)
    (folder / filename).write_text("\n \n")
    err = raises_file_error(lambda: loader(folder), folder / filename, "no rows")
    assert "header" not in err.problem


# -------------------------------------------------------- header-only files
@pytest.mark.parametrize("loader, fixture, filename, header", [
    (load_movielens_csv, "ml25m_dir", "ratings.csv", "userId,movieId,rating,timestamp\n"),
    (load_movielens_csv, "ml25m_dir", "movies.csv", "movieId,title,genres\n"),
    (load_atomic, "atomic_dir", "mini.inter",
     "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"),
    (load_atomic, "atomic_dir", "mini.item",
     "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"),
    (load_atomic, "atomic_dir", "mini.user", "user_id:token\tage:token\tgender:token\n"),
    (load_lastfm_1k, "lastfm_dir", "userid-profile.tsv", "#id\tgender\tage\tcountry\tregistered\n"),
])
def test_header_only_file(loader, fixture, filename, header, request):
    folder = request.getfixturevalue(fixture)
    (folder / filename).write_text(header)
    raises_file_error(lambda: loader(folder), folder / filename, "header but no rows")


# ----------------------------------------------------------- missing columns
@pytest.mark.parametrize("filename, text, missing", [
    ("ratings.csv", "userId,movieId,rating\n1,1,4.0\n", "['timestamp']"),
    ("ratings.csv", "user,movie,rating,timestamp\n1,1,4.0,964982703\n", "['userId', 'movieId']"),
    ("movies.csv", "movieId,title\n1,Toy Story (1995)\n", "['genres']"),
])
def test_missing_column_csv(ml25m_dir: Path, filename, text, missing):
    (ml25m_dir / filename).write_text(text)
    err = raises_file_error(lambda: load_movielens_csv(ml25m_dir), ml25m_dir / filename,
                            f"missing column(s) {missing}", "found [")
    assert err.problem.startswith("missing column")


def test_missing_column_atomic(atomic_dir: Path):
    inter = atomic_dir / "mini.inter"
    inter.write_text("user_id:token\trating:float\n1\t4\n")
    raises_file_error(lambda: load_atomic(atomic_dir), inter, "missing column(s) ['item_id']")
    inter.write_text("user_id:token\titem_id:token\n1\t101\n")
    item = atomic_dir / "mini.item"
    item.write_text("movie_title:token_seq\tclass:token_seq\nToy Story\tAnimation\n")
    raises_file_error(lambda: load_atomic(atomic_dir), item, "missing column(s) ['item_id']")
    item.unlink()
    user = atomic_dir / "mini.user"
    user.write_text("age:token\tgender:token\n24\tM\n")
    raises_file_error(lambda: load_atomic(atomic_dir), user, "missing column(s) ['user_id']")


def test_atomic_header_without_types(atomic_dir: Path):
    inter = atomic_dir / "mini.inter"
    inter.write_text("user_id\titem_id\trating\ttimestamp\n1\t101\t4\t881250949\n")
    raises_file_error(lambda: load_atomic(atomic_dir), inter, "'user_id'", "name:type")


def test_missing_column_lastfm_profile(lastfm_dir: Path):
    profile = lastfm_dir / "userid-profile.tsv"
    profile.write_text("#id\tgender\tcountry\tregistered\nuser_000001\tm\tJapan\tAug 13, 2006\n")
    raises_file_error(lambda: load_lastfm_1k(lastfm_dir), profile, "missing column(s) ['age']")


# ------------------------------------------------------------ unparsable rows
def test_non_numeric_rating_dat(ml1m_dir: Path):
    ratings = ml1m_dir / "ratings.dat"
    ratings.write_text("1::1193::5::978300760\n1::661::three::978302109\n")
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), ratings, "line 2", "rating='three'",
                      "not a number")


def test_non_numeric_timestamp_dat(ml1m_dir: Path):
    ratings = ml1m_dir / "ratings.dat"
    ratings.write_text("1::1193::5::978300760\n1::1::4::978300761\n2::1::3::2000-12-31\n")
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), ratings, "line 3", "timestamp='2000-12-31'")


def test_short_row_dat(ml1m_dir: Path):
    ratings = ml1m_dir / "ratings.dat"
    ratings.write_text("1::1193::5::978300760\n1::661::3\n")
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), ratings, "line 2",
                      "missing value for 'timestamp'")


def test_long_row_dat(ml1m_dir: Path):
    ratings = ml1m_dir / "ratings.dat"
    ratings.write_text("1::1193::5::978300760\n1::661::3::978302109::extra\n")
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), ratings, "cannot parse")


def test_bad_users_dat(ml1m_dir: Path):
    users = ml1m_dir / "users.dat"
    users.write_text("1::F::1::10::48067\n2::M::fifty-six::16::70072\n")
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), users, "line 2", "age='fifty-six'")
    users.write_text("1::F::1::10::48067\n2::M::56::doctor::70072\n")
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), users, "line 2", "occupation='doctor'")


def test_non_numeric_rating_csv(ml25m_dir: Path):
    ratings = ml25m_dir / "ratings.csv"
    ratings.write_text("userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,11,n/a,964981247\n")
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), ratings, "line 3", "rating='n/a'",
                      "not a number")


def test_bad_timestamp_csv(ml25m_dir: Path):
    ratings = ml25m_dir / "ratings.csv"
    ratings.write_text("userId,movieId,rating,timestamp\n1,1,4.0,2000-07-30 18:45:03\n")
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), ratings, "line 2", "timestamp=")


def test_missing_value_csv(ml25m_dir: Path):
    ratings = ml25m_dir / "ratings.csv"
    ratings.write_text("userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,,3.0,964982704\n")
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), ratings, "line 3", "missing value for 'movieId'")


def test_unquoted_comma_in_title_csv(ml25m_dir: Path):
    movies = ml25m_dir / "movies.csv"
    movies.write_text("movieId,title,genres\n1,Toy Story (1995),Animation\n"
                      "11,American President, The (1995),Comedy\n")
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), movies, "cannot parse")


def test_wrong_encoding_csv(ml25m_dir: Path):
    # ML-25M is UTF-8; a latin-1 file (e.g. ML-1M titles pasted in) cannot be decoded.
    movies = ml25m_dir / "movies.csv"
    movies.write_bytes("movieId,title,genres\n73,\"Misérables, Les (1995)\",Drama\n".encode("latin-1"))
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), movies, "cannot parse")


def test_bad_value_atomic(atomic_dir: Path):
    inter = atomic_dir / "mini.inter"
    inter.write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                     "1\t101\t4\t881250949\n2\t102\tfive\t881250950\n")
    raises_file_error(lambda: load_atomic(atomic_dir), inter, "line 3", "rating='five'")
    inter.write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                     "1\t101\t4\tyesterday\n")
    raises_file_error(lambda: load_atomic(atomic_dir), inter, "line 2", "timestamp='yesterday'")


@pytest.mark.parametrize("row, column", [
    ("2\t102\t4\t", "timestamp"),
    ("2\t102\t\t881250950", "rating"),
    ("2\t\t4\t881250950", "item_id"),
])
def test_missing_value_atomic(atomic_dir: Path, row, column):
    inter = atomic_dir / "mini.inter"
    inter.write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                     f"1\t101\t4\t881250949\n{row}\n")
    raises_file_error(lambda: load_atomic(atomic_dir), inter, "line 3", f"missing value for {column!r}")


@pytest.mark.parametrize("stamp", ["not-a-time", "2009-13-45T99:00:00Z", "1241478537x"])
def test_bad_timestamp_lastfm(lastfm_dir: Path, stamp):
    events = lastfm_dir / LASTFM
    lines = events.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2].replace("2009-05-04T13:52:04Z", stamp)
    events.write_text("".join(lines), encoding="utf-8")
    raises_file_error(lambda: load_lastfm_1k(lastfm_dir), events, "line 3", "bad timestamp", repr(stamp))


def test_short_row_lastfm(lastfm_dir: Path):
    events = lastfm_dir / LASTFM
    events.write_text("user_000001\t2009-05-04T23:08:57Z\tf1b1cf71-bd35-4e99-8624-24a6e15f133a\tDeep Dish\n",
                      encoding="utf-8")
    raises_file_error(lambda: load_lastfm_1k(lastfm_dir), events, "line 1", "missing value for 'track'")


def test_long_row_lastfm(lastfm_dir: Path):
    events = lastfm_dir / LASTFM
    with events.open("a", encoding="utf-8") as fh:
        fh.write("user_000003\t2008-12-31T23:00:00Z\t\tRadiohead\t\tCreep\tEXTRA\n")
    raises_file_error(lambda: load_lastfm_1k(lastfm_dir), events, "cannot parse")


def test_invalid_json_line(amazon_2014):
    reviews, meta = amazon_2014
    lines = reviews.read_text().splitlines(keepends=True)
    lines.insert(2, '{"reviewerID": "A1", "asin": "1384719342", "overall": 5.0,\n')  # truncated record
    reviews.write_text("".join(lines))
    raises_file_error(lambda: load_amazon(reviews, meta), reviews, "line 3", "invalid JSON")


def test_invalid_json_in_gzipped_metadata(amazon_2023):
    reviews, meta = amazon_2023
    with gzip.open(meta, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"parent_asin": "B00YQ6X8EO", "title": "ok"}) + "\n")
        # The 2014 metadata dumps were Python literals, not JSON.
        fh.write("{'asin': 'B081TJ8YS3', 'title': 'single quotes'}\n")
    raises_file_error(lambda: load_amazon(reviews, meta), meta, "line 2", "invalid JSON")


def test_json_line_not_an_object(amazon_2014):
    reviews, meta = amazon_2014
    reviews.write_text('["A2IBPI20UZIR0U", "1384719342", 5.0, 1393545600]\n')
    raises_file_error(lambda: load_amazon(reviews, meta), reviews, "line 1", "expected a JSON object")


def test_amazon_review_missing_fields(amazon_2014):
    reviews, meta = amazon_2014
    reviews.write_text(json.dumps({"reviewerID": "A1", "asin": "1384719342", "overall": 5.0}) + "\n")
    raises_file_error(lambda: load_amazon(reviews, meta), reviews, "line 1",
                      "needs user, item, rating and time")


@pytest.mark.parametrize("field, value", [("overall", "five stars"), ("unixReviewTime", "02 28, 2014"),
                                          ("overall", [5])])
def test_amazon_review_non_numeric(amazon_2014, field, value):
    reviews, meta = amazon_2014
    record = {"reviewerID": "A1", "asin": "1384719342", "overall": 5.0, "unixReviewTime": 1393545600}
    good = {"reviewerID": "A2", "asin": "1384719342", "overall": 4.0, "unixReviewTime": 1393545600}
    record[field] = value
    reviews.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    raises_file_error(lambda: load_amazon(reviews, meta), reviews, "line 2", f"={value!r} is not a number")


def test_amazon_metadata_without_asin(amazon_2014):
    reviews, meta = amazon_2014
    meta.write_text(json.dumps({"title": "orphan", "categories": [["Books"]]}) + "\n")
    raises_file_error(lambda: load_amazon(reviews, meta), meta, "asin")


# ------------------------------------------------------------ duplicate ids
def test_duplicate_movie_ids_dat(ml1m_dir: Path):
    movies = ml1m_dir / "movies.dat"
    with movies.open("ab") as fh:
        fh.write("73::Misérables, Les (1998)::Drama\n".encode("latin-1"))
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), movies, "duplicate item_id", "'73'")


def test_duplicate_movie_ids_csv(ml25m_dir: Path):
    movies = ml25m_dir / "movies.csv"
    with movies.open("a") as fh:
        fh.write('11,"American President, The (1995)",Comedy\n')
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), movies, "duplicate item_id", "'11'")


def test_duplicate_item_ids_atomic(atomic_dir: Path):
    item = atomic_dir / "mini.item"
    with item.open("a") as fh:
        fh.write("102\tGoldenEye\t1995\tAction\n")
    raises_file_error(lambda: load_atomic(atomic_dir), item, "duplicate item_id", "'102'")


def test_duplicate_item_ids_amazon(amazon_2014):
    reviews, meta = amazon_2014
    with meta.open("a") as fh:
        fh.write(json.dumps({"asin": "B00004Y2UT", "title": "Hosa XLR Cable (again)"}) + "\n")
    raises_file_error(lambda: load_amazon(reviews, meta), meta, "duplicate item_id", "'B00004Y2UT'")


def test_duplicate_user_ids_dat(ml1m_dir: Path):
    users = ml1m_dir / "users.dat"
    with users.open("a") as fh:
        fh.write("3::F::35::1::10001\n")
    raises_file_error(lambda: load_movielens_dat(ml1m_dir), users, "duplicate user_id", "'3'")


def test_duplicate_user_ids_atomic(atomic_dir: Path):
    user = atomic_dir / "mini.user"
    with user.open("a") as fh:
        fh.write("1\t30\tF\tartist\t10001\n")
    raises_file_error(lambda: load_atomic(atomic_dir), user, "duplicate user_id", "'1'")


def test_duplicate_user_ids_lastfm(lastfm_dir: Path):
    profile = lastfm_dir / "userid-profile.tsv"
    with profile.open("a") as fh:
        fh.write("user_000002\tf\t30\tPeru\tFeb 24, 2006\n")
    raises_file_error(lambda: load_lastfm_1k(lastfm_dir), profile, "duplicate user_id", "'user_000002'")


def test_duplicate_ids_in_dataset_build():
    items = pd.DataFrame({"item_id": ["a", "b", "a"], "title": ["A", "B", "A2"]})
    inter = pd.DataFrame({"user_id": ["u"], "item_id": ["a"], "timestamp": [1]})
    with pytest.raises(DataError) as exc:
        Dataset.build("toy", items, inter)
    assert "toy" in str(exc.value) and "duplicate item ids" in str(exc.value) and "'a'" in str(exc.value)
    items = items.iloc[:2]
    users = pd.DataFrame({"user_id": [1, 2, 1], "age": [20, 30, 40]})
    with pytest.raises(DataError) as exc:
        Dataset.build("toy", items, inter, users)
    assert "toy" in str(exc.value) and "duplicate user ids" in str(exc.value) and "'1'" in str(exc.value)


# ------------------------------------------------------ unknown item references
def test_ratings_of_unknown_movies_dat(ml1m_dir: Path):
    ratings = ml1m_dir / "ratings.dat"
    with ratings.open("a") as fh:
        fh.write("5::9999::4::978300000\n")
    err = raises_file_error(lambda: load_movielens_dat(ml1m_dir), ratings, "movies not in movies.dat", "9999")
    assert isinstance(err.__cause__, UnknownItemError)


def test_ratings_of_unknown_movies_csv(ml25m_dir: Path):
    ratings = ml25m_dir / "ratings.csv"
    with ratings.open("a") as fh:
        fh.write("4,208793,4.0,1574000000\n4,208800,3.0,1574000001\n")
    raises_file_error(lambda: load_movielens_csv(ml25m_dir), ratings, "movies not in movies.csv",
                      "208793", "208800")


def test_interactions_of_unknown_items_atomic(atomic_dir: Path):
    inter = atomic_dir / "mini.inter"
    with inter.open("a") as fh:
        fh.write("3\t999\t4\t881250999\n")
    raises_file_error(lambda: load_atomic(atomic_dir), inter, "items missing from mini.item", "999")


def test_amazon_missing_metadata_error(amazon_2014):
    reviews, meta = amazon_2014
    raises_file_error(lambda: load_amazon(reviews, meta, missing_metadata="error"), meta,
                      "no metadata for items", "B0000XXXXX")


def test_dataset_build_unknown_item():
    items = pd.DataFrame({"item_id": [1, 2], "title": ["A", "B"]})
    inter = pd.DataFrame({"user_id": ["u", "u"], "item_id": [1, 3], "timestamp": [1, 2]})
    with pytest.raises(UnknownItemError) as exc:
        Dataset.build("toy", items, inter)
    assert exc.value.item_ids == ["3"]
    assert "'toy'" in str(exc.value)


# ------------------------------------------------------------- side tables
def test_side_table_errors(ml25m_dir: Path, tmp_path: Path):
    from ctrlsim.data import attach_descriptions, attach_tag_scores, attach_tag_votes

    ds = load_movielens_csv(ml25m_dir)
    desc = tmp_path / "plots.csv"
    desc.write_text("movieId,summary\n1,Toys come alive.\n")
    raises_file_error(lambda: attach_descriptions(ds, desc), desc, "no description column",
                      "['description', 'overview', 'plot']")
    desc.write_text("movie,overview\n1,Toys come alive.\n")
    raises_file_error(lambda: attach_descriptions(ds, desc), desc, "no item id column")
    missing = tmp_path / "nope.csv"
    raises_file_error(lambda: attach_descriptions(ds, missing), missing, "file not found")

    links = ml25m_dir / "links.csv"
    links.write_text("movieId,imdbId\n1,0114709\n")
    tmdb = tmp_path / "tmdb.csv"
    tmdb.write_text("id,overview\n862,Toys come alive.\n")
    raises_file_error(lambda: attach_descriptions(ds, tmdb, links=links), links,
                      "missing column(s) ['tmdbId']")

    votes = tmp_path / "dtdd.csv"
    votes.write_text("item_id,tag,yes,no\n1,a dog dies,3,many\n")
    raises_file_error(lambda: attach_tag_votes(ds, votes), votes, "line 2", "no='many'")
    votes.write_text("item_id,tag,yes\n1,a dog dies,3\n")
    raises_file_error(lambda: attach_tag_votes(ds, votes), votes, "no no-vote column")
    with pytest.raises(ConfigError, match="threshold"):
        attach_tag_votes(ds, votes, threshold=1.0)
    with pytest.raises(ConfigError, match="threshold"):
        attach_tag_votes(ds, votes, threshold=-0.1)

    scores = tmp_path / "genome-scores.csv"
    scores.write_text("movieId,tagId,relevance\n1,1,0.99\n")
    raises_file_error(lambda: attach_tag_scores(ds, scores), scores, "tags_path", "genome-tags.csv")
    scores.write_text("movieId,tagId,relevance\n1,1,high\n")
    tags = tmp_path / "genome-tags.csv"
    tags.write_text("tagId,tag\n1,pixar animation\n")
    raises_file_error(lambda: attach_tag_scores(ds, scores, tags), scores, "line 2", "relevance='high'")
    scores.write_text("movieId,tagId,relevance\n1,1,0.99\n")
    tags.write_text("id,name\n1,pixar animation\n")
    raises_file_error(lambda: attach_tag_scores(ds, scores, tags), tags, "missing column(s) ['tagId', 'tag']")


def test_messages_use_one_line_format(ml1m_dir: Path):
    (ml1m_dir / "ratings.dat").write_bytes(b"")
    with pytest.raises(DataFileError) as exc:
        load_movielens_dat(ml1m_dir)
    assert re.fullmatch(r".*ratings\.dat: file is empty", str(exc.value))
