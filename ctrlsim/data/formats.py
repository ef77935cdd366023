"""Loaders for the real formats recommender datasets ship in.

Each loader reads the files as distributed, validates them (errors name the
file and the problem) and returns a `Dataset`. Nothing is downloaded.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ctrlsim.data._io import (
    AGE_RANGE,
    TIMESTAMP_RANGE,
    YEAR_RANGE,
    first_bad_number,
    iter_json_lines,
    no_duplicates,
    read_delimited,
    require_columns,
    require_complete,
    to_numeric,
)
from ctrlsim.data.dataset import Dataset
from ctrlsim.data.matching import split_year as split_title_year  # one parser for loaders and matching
from ctrlsim.errors import ConfigError, DataFileError, UnknownItemError

# MovieLens-1M README: occupation codes.
ML1M_OCCUPATIONS = {
    0: "other", 1: "academic/educator", 2: "artist", 3: "clerical/admin", 4: "college/grad student",
    5: "customer service", 6: "doctor/health care", 7: "executive/managerial", 8: "farmer",
    9: "homemaker", 10: "K-12 student", 11: "lawyer", 12: "programmer", 13: "retired",
    14: "sales/marketing", 15: "scientist", 16: "self-employed", 17: "technician/engineer",
    18: "tradesman/craftsman", 19: "unemployed", 20: "writer",
}


def _movie_items(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    no_duplicates(df, "item_id", path)
    titles, years = zip(*(split_title_year(t) for t in df["title"])) if len(df) else ((), ())
    genres = [
        tuple(g for g in str(gs).split("|") if g and g != "(no genres listed)") for gs in df["genres"]
    ]
    return pd.DataFrame({"item_id": df["item_id"], "title": titles, "year": years, "tags": genres})


# --------------------------------------------------------------- RecBole atomic
def _atomic_table(path: Path) -> pd.DataFrame:
    df = read_delimited(path, sep="\t")
    renamed = {}
    for col in df.columns:
        if ":" not in col:
            raise DataFileError(path, f"header field {col!r} is not 'name:type' (RecBole atomic format)")
        renamed[col] = col.split(":", 1)[0]
    return df.rename(columns=renamed)


def _first_present(df: pd.DataFrame, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in df.columns), None)


def load_atomic(folder: str | Path, name: str | None = None) -> Dataset:
    """A RecBole atomic dataset folder: `<name>.inter` (+ optional `.item`, `.user`).

    Titles come from movie_title/title/item_name, years from release_year/year,
    tags from class/genre/categories (space-separated token_seq).
    """
    folder = Path(folder)
    name = name or folder.name
    inter_path = folder / f"{name}.inter"
    inter = _atomic_table(inter_path)
    require_columns(inter, ["user_id", "item_id"], inter_path)
    time_col = _first_present(inter, ("timestamp", "time"))
    # An empty rating or time would otherwise surface as a bare pandas casting error.
    require_complete(inter, ["user_id", "item_id"] + [c for c in ("rating", time_col) if c and c in inter],
                     inter_path)
    out = pd.DataFrame({
        "user_id": inter["user_id"],
        "item_id": inter["item_id"],
        "rating": to_numeric(inter, "rating", inter_path) if "rating" in inter else 1.0,
        # Without timestamps the file order is the chronology.
        "timestamp": to_numeric(inter, time_col, inter_path, low=TIMESTAMP_RANGE[0], high=TIMESTAMP_RANGE[1])
        if time_col else range(len(inter)),
    })

    item_path = folder / f"{name}.item"
    if item_path.exists():
        raw = _atomic_table(item_path)
        require_columns(raw, ["item_id"], item_path)
        no_duplicates(raw, "item_id", item_path)
        title_col = _first_present(raw, ("movie_title", "title", "item_name", "name"))
        year_col = _first_present(raw, ("release_year", "year"))
        tag_col = _first_present(raw, ("class", "genre", "genres", "categories"))
        items = pd.DataFrame({
            "item_id": raw["item_id"],
            "title": raw[title_col] if title_col else raw["item_id"],
            "year": to_numeric(raw, year_col, item_path, low=YEAR_RANGE[0], high=YEAR_RANGE[1], integer=True,
                               missing_ok=True, words_are_missing=True) if year_col else None,
            "tags": [tuple(str(v).split()) if isinstance(v, str) else () for v in raw[tag_col]]
            if tag_col else [()] * len(raw),
        })
    else:
        ids = pd.unique(out["item_id"])
        items = pd.DataFrame({"item_id": ids, "title": ids})

    users = None
    user_path = folder / f"{name}.user"
    if user_path.exists():
        raw_u = _atomic_table(user_path)
        require_columns(raw_u, ["user_id"], user_path)
        no_duplicates(raw_u, "user_id", user_path)
        users = raw_u.reindex(columns=["user_id", "age", "gender", "occupation"])
        if "age" in raw_u:
            users["age"] = to_numeric(raw_u, "age", user_path, low=AGE_RANGE[0], high=AGE_RANGE[1],
                                      integer=True, missing_ok=True)
    try:
        return Dataset.build(name, items, out, users,
                             source={"format": "recbole-atomic", "path": str(folder)})
    except UnknownItemError as exc:
        raise DataFileError(inter_path, f"items missing from {item_path.name}: {exc.item_ids}") from exc


# ------------------------------------------------------------ MovieLens-1M .dat
def load_movielens_dat(folder: str | Path, name: str | None = None) -> Dataset:
    """MovieLens-1M (`movies.dat`, `ratings.dat`, optional `users.dat`; '::'-separated, latin-1)."""
    folder = Path(folder)
    movies_path, ratings_path = folder / "movies.dat", folder / "ratings.dat"
    users_path = folder / "users.dat"
    movies = read_delimited(movies_path, sep="::", names=["item_id", "title", "genres"], header=None,
                            encoding="latin-1")
    require_complete(movies, ["item_id", "title"], movies_path, header_rows=0)
    ratings = read_delimited(ratings_path, sep="::", names=["user_id", "item_id", "rating", "timestamp"],
                             header=None, encoding="latin-1")
    require_complete(ratings, ["user_id", "item_id", "rating", "timestamp"], ratings_path, header_rows=0)
    inter = ratings.assign(  # ML-1M README: whole-star ratings 1-5, seconds since 1970
        rating=to_numeric(ratings, "rating", ratings_path, header_rows=0, low=1, high=5, integer=True),
        timestamp=to_numeric(ratings, "timestamp", ratings_path, header_rows=0, low=TIMESTAMP_RANGE[0],
                             high=TIMESTAMP_RANGE[1], integer=True),
    )
    users = None
    if users_path.exists():
        raw = read_delimited(users_path, sep="::", names=["user_id", "gender", "age", "occupation", "zip"],
                             header=None, encoding="latin-1")
        require_complete(raw, ["user_id", "gender", "age", "occupation"], users_path, header_rows=0)
        no_duplicates(raw, "user_id", users_path)
        occ = to_numeric(raw, "occupation", users_path, header_rows=0, low=min(ML1M_OCCUPATIONS),
                         high=max(ML1M_OCCUPATIONS), integer=True)
        users = pd.DataFrame({
            "user_id": raw["user_id"],
            # ML-1M stores the lower bound of an age bracket (1, 18, 25, 35, 45, 50, 56).
            "age": to_numeric(raw, "age", users_path, header_rows=0, low=AGE_RANGE[0], high=AGE_RANGE[1],
                              integer=True),
            "gender": raw["gender"],
            "occupation": [ML1M_OCCUPATIONS[int(o)] for o in occ],
        })
    try:
        return Dataset.build(name or folder.name, _movie_items(movies, movies_path), inter, users,
                             source={"format": "movielens-dat", "path": str(folder)})
    except UnknownItemError as exc:
        raise DataFileError(ratings_path,
                            f"ratings refer to movies not in movies.dat: {exc.item_ids}") from exc


# --------------------------------------------------- MovieLens-25M / latest .csv
def load_movielens_csv(folder: str | Path, name: str | None = None) -> Dataset:
    """MovieLens-25M / ml-latest(-small) (`movies.csv`, `ratings.csv`; no user attributes)."""
    folder = Path(folder)
    movies_path, ratings_path = folder / "movies.csv", folder / "ratings.csv"
    movies = read_delimited(movies_path, sep=",")
    require_columns(movies, ["movieId", "title", "genres"], movies_path)
    require_complete(movies, ["movieId", "title"], movies_path)
    ratings = read_delimited(ratings_path, sep=",")
    require_columns(ratings, ["userId", "movieId", "rating", "timestamp"], ratings_path)
    require_complete(ratings, ["userId", "movieId", "rating", "timestamp"], ratings_path)
    inter = pd.DataFrame({
        "user_id": ratings["userId"],
        "item_id": ratings["movieId"],
        # MovieLens README: half-star ratings 0.5-5.0, seconds since 1970.
        "rating": to_numeric(ratings, "rating", ratings_path, low=0.5, high=5.0),
        "timestamp": to_numeric(ratings, "timestamp", ratings_path, low=TIMESTAMP_RANGE[0],
                                high=TIMESTAMP_RANGE[1], integer=True),
    })
    items = _movie_items(movies.rename(columns={"movieId": "item_id"}), movies_path)
    try:
        return Dataset.build(name or folder.name, items, inter, None,
                             source={"format": "movielens-csv", "path": str(folder)})
    except UnknownItemError as exc:
        raise DataFileError(ratings_path,
                            f"ratings refer to movies not in movies.csv: {exc.item_ids}") from exc


# --------------------------------------------------------------- Last.fm-1K tsv
LASTFM_EVENTS = "userid-timestamp-artid-artname-traid-traname.tsv"
LASTFM_PROFILES = "userid-profile.tsv"


def load_lastfm_1k(path: str | Path, name: str = "lastfm-1k") -> Dataset:
    """Last.fm-1K: the listening-events tsv (a file, or the folder holding it and the profiles).

    Items are tracks (MusicBrainz track id, else "artist - track"). Listening is
    implicit feedback: each (user, track) becomes one interaction whose
    `rating` is the play count and whose `timestamp` is the first play.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    events_path = folder / LASTFM_EVENTS if path.is_dir() else path
    events = read_delimited(events_path, sep="\t", header=None,
                            names=["user_id", "time", "artist_id", "artist", "track_id", "track"])
    require_complete(events, ["user_id", "time", "artist", "track"], events_path, header_rows=0)
    times = pd.to_datetime(events["time"], utc=True, errors="coerce", format="ISO8601")
    if times.isna().any():
        row = int(times.index[times.isna()][0])
        raise DataFileError(events_path, f"line {row + 1}: bad timestamp {events['time'].iloc[row]!r}")
    events["timestamp"] = times.astype("int64") // 10**9
    events["item_id"] = events["track_id"].fillna(events["artist"] + " - " + events["track"])
    plays = events.groupby(["user_id", "item_id"], sort=False).agg(
        rating=("timestamp", "size"), timestamp=("timestamp", "min")).reset_index()
    firsts = events.drop_duplicates("item_id")
    items = pd.DataFrame({
        "item_id": firsts["item_id"],
        "title": firsts["track"] + " by " + firsts["artist"],
        "artist": firsts["artist"],
    })
    users = None
    profiles_path = folder / LASTFM_PROFILES
    if profiles_path.exists():
        raw = read_delimited(profiles_path, sep="\t")
        raw = raw.rename(columns={"#id": "user_id", "id": "user_id"})
        require_columns(raw, ["user_id", "gender", "age"], profiles_path)
        no_duplicates(raw, "user_id", profiles_path)
        users = pd.DataFrame({
            "user_id": raw["user_id"],
            "age": to_numeric(raw, "age", profiles_path, low=AGE_RANGE[0], high=AGE_RANGE[1], integer=True,
                              missing_ok=True),
            "gender": raw["gender"].str.upper().where(raw["gender"].str.lower().isin(["m", "f"])),
            "occupation": pd.NA,
        })
    return Dataset.build(name, items, plays, users, source={"format": "lastfm-1k", "path": str(events_path)})


# ------------------------------------------------------- Amazon reviews (jsonl)
MISSING_METADATA = ("drop", "error")
AMAZON_RATING_RANGE = (0.0, 5.0)  # stars


def _json_number(value, path: Path, line: int, field: str, low: float, high: float) -> float:
    """A JSON number (or numeric string) that is finite and within [low, high], else `DataFileError`."""
    number = float("nan")
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        number = pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0]
    # The value itself is present (a JSON NaN is a value, not a missing field).
    bad = first_bad_number(pd.Series([repr(value)]), pd.Series([number]), low=low, high=high)
    if bad is not None:
        raise DataFileError(path, f"line {line}: {field}={value!r} {bad[1]}")
    return float(number)


def _categories(value, path: Path, line: int) -> list[str]:
    """A metadata record's categories: a string, a list of strings or (2014) a list of category paths."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        flat = [c for entry in value for c in (entry if isinstance(entry, list) else [entry])]
        if all(isinstance(c, str) for c in flat):
            return flat
    raise DataFileError(path, f"line {line}: categories must be a string or a list of strings, got {value!r}")


def _description(value, path: Path, line: int) -> str:
    """A description: a string, a list of strings (joined) or null (no description)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(d, str) or d is None for d in value):
        return " ".join(d for d in value if d)
    raise DataFileError(path, f"line {line}: description must be a string or a list of strings, "
                              f"got {value!r}")


def load_amazon(reviews: str | Path, metadata: str | Path | None = None, *, name: str | None = None,
                missing_metadata: str = "drop") -> Dataset:
    """Amazon reviews + metadata JSON-lines (2014/2018 and 2023 field names, gzip or plain).

    Reviews: reviewerID|user_id, asin|parent_asin, overall|rating (0-5 stars),
    unixReviewTime (s)|timestamp (ms). Metadata: asin|parent_asin, title,
    categories|category (a string or a list), description (null is none).
    Reviews of items without metadata are dropped (`missing_metadata="drop"`,
    the count is kept in `source`) or raise (`"error"`).
    """
    if missing_metadata not in MISSING_METADATA:
        raise ConfigError(f"missing_metadata must be one of {MISSING_METADATA}, got {missing_metadata!r}")
    reviews = Path(reviews)
    rows = []
    for n, rec in enumerate(iter_json_lines(reviews), 1):
        user = rec.get("reviewerID", rec.get("user_id"))
        item = rec.get("parent_asin", rec.get("asin"))
        rating = rec.get("overall", rec.get("rating"))
        when = rec.get("unixReviewTime", rec.get("timestamp"))
        if None in (user, item, rating, when):
            raise DataFileError(reviews, f"line {n}: needs user, item, rating and time fields; "
                                         f"got {sorted(rec)}")
        rating = _json_number(rating, reviews, n, "rating", *AMAZON_RATING_RANGE)
        when = _json_number(when, reviews, n, "time", *TIMESTAMP_RANGE)
        when = int(when) // 1000 if when > 10**11 else int(when)  # the 2023 release counts milliseconds
        rows.append((user, item, rating, when))
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "timestamp"])
    if inter.empty:
        raise DataFileError(reviews, "no reviews")

    source: dict[str, object] = {"format": "amazon-jsonl", "reviews": str(reviews)}
    if metadata is not None:
        metadata = Path(metadata)
        meta = []
        for n, rec in enumerate(iter_json_lines(metadata), 1):
            item = rec.get("parent_asin", rec.get("asin"))
            if item is None:
                raise DataFileError(metadata, f"line {n}: record without asin/parent_asin")
            cats = _categories(rec.get("categories", rec.get("category")), metadata, n)
            title = rec.get("title")
            meta.append({"item_id": item, "title": str(title) if title else item,
                         "tags": tuple(dict.fromkeys(cats)),
                         "description": _description(rec.get("description"), metadata, n)})
        if not meta:
            raise DataFileError(metadata, "no metadata records")
        items = pd.DataFrame(meta)
        no_duplicates(items, "item_id", metadata)
        source["metadata"] = str(metadata)
        known = inter["item_id"].isin(items["item_id"])
        if not known.all():
            if missing_metadata == "error":
                unknown = inter.loc[~known, "item_id"].unique()[:5].tolist()
                raise DataFileError(metadata, f"no metadata for items {unknown}")
            source["dropped_interactions_without_metadata"] = int((~known).sum())
            inter = inter[known]
    else:
        ids = pd.unique(inter["item_id"])
        items = pd.DataFrame({"item_id": ids, "title": ids})
    return Dataset.build(name or reviews.name.split(".")[0], items, inter, None, source=source,
                         tag_kind="category")
