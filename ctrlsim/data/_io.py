"""File reading with errors that name the file and the problem."""
from __future__ import annotations

import csv
import gzip
import json
import warnings
import zlib
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from ctrlsim.errors import DataFileError


def existing_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataFileError(path, "file not found")
    if path.stat().st_size == 0:
        raise DataFileError(path, "file is empty")
    return path


def read_delimited(path: str | Path, *, sep: str, names: list[str] | None = None,
                   header: int | None | str = "infer", encoding: str = "utf-8", **kwargs) -> pd.DataFrame:
    """pandas.read_csv with file-naming errors; every row must have the header's field count.

    The file is read without a header and without an index column, so a row with
    an extra field is an error naming its line (pandas would otherwise take the
    first column of every row as an index and shift the columns), and so is a
    headerless file whose rows have more fields than `names`. Short rows come back
    with missing values.
    """
    path = existing_file(path)
    engine = "python" if len(sep) > 1 else "c"
    has_header = header in ("infer", 0) and names is None
    quoting = csv.QUOTE_MINIMAL if sep == "," else csv.QUOTE_NONE
    try:
        with warnings.catch_warnings():
            # pandas' python engine (multi-character separators) only warns about a long row.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(path, sep=sep, header=None, index_col=False, encoding=encoding, engine=engine,
                             dtype=str, keep_default_na=False, na_values=[""], quoting=quoting,
                             on_bad_lines="error", **kwargs)
    except pd.errors.ParserWarning as exc:
        raise DataFileError(path, f"cannot parse: {_first_long_line(path, sep, encoding)}") from exc
    except pd.errors.EmptyDataError as exc:  # before ValueError: EmptyDataError subclasses it
        raise DataFileError(path, "file has no rows") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        detail = str(exc).strip().removeprefix("Error tokenizing data. C error: ")
        raise DataFileError(path, f"cannot parse: {detail}") from exc
    if has_header:
        columns = df.iloc[0].tolist() if len(df) else []
        if any(pd.isna(c) for c in columns):
            raise DataFileError(path, f"line 1: the header has an empty field name: {columns}")
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise DataFileError(path, f"line 1: the header repeats field name(s) {repeated}")
        df = df.iloc[1:].reset_index(drop=True)
        df.columns = [str(c) for c in columns]
    elif names is not None:
        if df.shape[1] > len(names):
            raise DataFileError(path, f"line 1: expected {len(names)} fields ({', '.join(names)}), "
                                      f"found {df.shape[1]}")
        # Short rows show up as missing values (reported by require_complete with their line).
        df = df.reindex(columns=range(len(names)))
        df.columns = names
    if df.empty:
        raise DataFileError(path, "file has a header but no rows" if has_header else "file has no rows")
    if names is not None and df.isna().all(axis=1).any():
        bad = int(df.index[df.isna().all(axis=1)][0])
        raise DataFileError(path, f"row {bad + 1} is blank")
    return df


def _first_long_line(path: Path, sep: str, encoding: str) -> str:
    """Where a row has more fields than the first line (for separators pandas cannot locate)."""
    with open(path, encoding=encoding, newline="") as fh:
        expected = None
        for n, line in enumerate(fh, 1):
            fields = line.rstrip("\r\n").count(sep) + 1
            if expected is None:
                expected = fields
            elif fields > expected:
                return f"Expected {expected} fields in line {n}, saw {fields}"
    return "rows have different numbers of fields"


def require_columns(df: pd.DataFrame, columns: Iterable[str], path: str | Path) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataFileError(path, f"missing column(s) {missing}; found {list(df.columns)}")


def require_complete(df: pd.DataFrame, columns: Iterable[str], path: str | Path, *,
                     header_rows: int = 1) -> None:
    """Every value of `columns` is present (a short row shows up as missing values)."""
    for col in columns:
        missing = df[col].isna()
        if missing.any():
            row = int(df.index[missing][0]) + header_rows + 1
            raise DataFileError(path, f"line {row}: missing value for {col!r}")


# Plausible ranges of numeric fields (inclusive). Timestamps are seconds since 1970; the
# bound also admits milliseconds (up to the year 2286) and keeps every value inside int64.
TIMESTAMP_RANGE = (0, 10**13)
YEAR_RANGE = (1000, 2999)
AGE_RANGE = (0, 150)


def first_bad_number(raw: pd.Series, values: pd.Series, *, low: float | None = None,
                     high: float | None = None, integer: bool = False,
                     missing_ok: bool = False) -> tuple[int, str] | None:
    """(position, reason) of the first value of `raw` (parsed as `values`) that is missing,
    not a number, not finite, not whole (`integer`) or outside [low, high]; None if all are fine."""
    values = pd.to_numeric(values, errors="coerce").astype(float)
    present = raw.notna().to_numpy()
    number = values.notna().to_numpy()
    finite = number & np.isfinite(values.fillna(0).to_numpy())
    safe = np.where(finite, values.fillna(0).to_numpy(), 0.0)  # finite stand-ins for the checks below
    checks = [] if missing_ok else [(~present, "is missing")]
    checks += [(present & ~number, "is not a number"), (number & ~finite, "is not a finite number")]
    if integer:
        checks.append((finite & (np.floor(safe) != safe), "is not a whole number"))
    if low is not None:
        checks.append((finite & (safe < low), f"is out of range (expected {_range(low, high)})"))
    if high is not None:
        checks.append((finite & (safe > high), f"is out of range (expected {_range(low, high)})"))
    found = [(int(np.flatnonzero(mask)[0]), reason) for mask, reason in checks if mask.any()]
    return min(found) if found else None


def _range(low, high) -> str:
    if low is None:
        return f"at most {high}"
    if high is None:
        return f"at least {low}"
    return f"{low} to {high}"


def to_numeric(df: pd.DataFrame, column: str, path: str | Path, *, header_rows: int = 1,
               low: float | None = None, high: float | None = None, integer: bool = False,
               missing_ok: bool = False, words_are_missing: bool = False) -> pd.Series:
    """Column as finite numbers within [low, high] (whole numbers with `integer`).

    The first bad value raises a `DataFileError` naming the file, line and value.
    With `missing_ok` missing values are kept as NaN; with `words_are_missing` too
    are values without any digit (ml-100k writes an unknown year as 'unkonwn').
    """
    raw = df[column]
    if words_are_missing:
        raw = raw.where(raw.isna() | raw.astype(str).str.contains(r"\d"))
    values = pd.to_numeric(raw, errors="coerce")
    bad = first_bad_number(raw, values, low=low, high=high, integer=integer, missing_ok=missing_ok)
    if bad is not None:
        row, reason = bad
        raise DataFileError(path, f"line {row + header_rows + 1}: {column}={raw.iloc[row]!r} {reason}")
    return values


def iter_json_lines(path: str | Path) -> Iterator[dict]:
    """Records of a JSON-lines file, gzip-compressed or not (told by its content, not its name).

    A bad line, bytes that are not UTF-8 and a damaged or truncated gzip stream
    raise `DataFileError` naming the file and the line.
    """
    path = existing_file(path)
    n = 0
    try:
        with _open_binary(path) as fh:
            for n, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise DataFileError(path, f"line {n}: bytes that are not UTF-8 text "
                                              f"({exc.object[exc.start:exc.end]!r})") from exc
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataFileError(path, f"line {n}: invalid JSON ({exc.msg})") from exc
                if not isinstance(record, dict):
                    raise DataFileError(path, f"line {n}: expected a JSON object")
                yield record
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataFileError(path, f"damaged or truncated gzip data after line {n} "
                                  f"({type(exc).__name__}: {exc})") from exc


GZIP_MAGIC = b"\x1f\x8b"


def _open_binary(path: Path):
    """A byte stream of the file's content; decompressed when it starts with the gzip magic bytes."""
    with open(path, "rb") as fh:
        compressed = fh.read(2) == GZIP_MAGIC
    return gzip.open(path, "rb") if compressed else open(path, "rb")


def no_duplicates(df: pd.DataFrame, column: str, path: str | Path) -> None:
    dup = df[column][df[column].duplicated()]
    if len(dup):
        raise DataFileError(path, f"duplicate {column} values: {list(dup.unique()[:5])}")
