"""File reading with errors that name the file and the problem."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterable, Iterator

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
    """pandas.read_csv with file-naming errors; every row must have the expected field count."""
    path = existing_file(path)
    engine = "python" if len(sep) > 1 else "c"
    try:
        df = pd.read_csv(path, sep=sep, names=names, header=header, encoding=encoding, engine=engine,
                         dtype=str, keep_default_na=False, na_values=[""], quoting=csv.QUOTE_MINIMAL
                         if sep == "," else csv.QUOTE_NONE, on_bad_lines="error", **kwargs)
    except pd.errors.EmptyDataError as exc:  # before ValueError: EmptyDataError subclasses it
        raise DataFileError(path, "file has no rows") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise DataFileError(path, f"cannot parse: {exc}") from exc
    if df.empty:
        raise DataFileError(path, "file has no rows" if header is None else "file has a header but no rows")
    if names is not None and df.isna().all(axis=1).any():
        bad = int(df.index[df.isna().all(axis=1)][0])
        raise DataFileError(path, f"row {bad + 1} is blank")
    return df


def require_columns(df: pd.DataFrame, columns: Iterable[str], path: str | Path) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataFileError(path, f"missing column(s) {missing}; found {list(df.columns)}")


def require_complete(df: pd.DataFrame, columns: Iterable[str], path: str | Path, *, header_rows: int = 1) -> None:
    """Every value of `columns` is present (a short row shows up as missing values)."""
    for col in columns:
        missing = df[col].isna()
        if missing.any():
            row = int(df.index[missing][0]) + header_rows + 1
            raise DataFileError(path, f"line {row}: missing value for {col!r}")


def to_numeric(df: pd.DataFrame, column: str, path: str | Path, *, header_rows: int = 1) -> pd.Series:
    """Column as numbers; an unparsable value raises naming the line."""
    values = pd.to_numeric(df[column], errors="coerce")
    bad = values.isna() & df[column].notna()
    if bad.any():
        row = int(df.index[bad][0])
        raise DataFileError(path, f"line {row + header_rows + 1}: {column}={df[column].iloc[row]!r} is not a number")
    return values


def iter_json_lines(path: str | Path) -> Iterator[dict]:
    """Records of a JSON-lines file (optionally gzip); a bad line raises naming its number."""
    path = existing_file(path)
    opener = _open_maybe_gzip(path)
    with opener as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFileError(path, f"line {n}: invalid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise DataFileError(path, f"line {n}: expected a JSON object")
            yield record


def _open_maybe_gzip(path: Path):
    if path.suffix == ".gz":
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def no_duplicates(df: pd.DataFrame, column: str, path: str | Path) -> None:
    dup = df[column][df[column].duplicated()]
    if len(dup):
        raise DataFileError(path, f"duplicate {column} values: {list(dup.unique()[:5])}")
