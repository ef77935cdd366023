"""`load_dataset`: built-in dataset names and format detection for paths."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from ctrlsim.data import formats
from ctrlsim.data.dataset import Dataset
from ctrlsim.errors import DataFileError, MissingDependencyError, UnknownDatasetError


def recbole_example_dir(name: str) -> Path:
    """Folder of a dataset shipped inside the `recbole` wheel, found without importing recbole."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("recbole", "recbole", f"the bundled {name} data")
    folder = Path(list(spec.submodule_search_locations)[0]) / "dataset_example" / name
    if not folder.is_dir():
        raise DataFileError(folder, f"the installed recbole has no bundled {name}")
    return folder


def _ml100k() -> Dataset:
    ds = formats.load_atomic(recbole_example_dir("ml-100k"), "ml-100k")
    ds.source["provider"] = "recbole wheel (dataset_example/ml-100k)"
    return ds


BUILTIN: dict[str, Callable[[], Dataset]] = {"ml-100k": _ml100k}

FORMATS: dict[str, Callable[..., Dataset]] = {
    "recbole-atomic": formats.load_atomic,
    "movielens-dat": formats.load_movielens_dat,
    "movielens-csv": formats.load_movielens_csv,
    "lastfm-1k": formats.load_lastfm_1k,
    "amazon-jsonl": formats.load_amazon,
}


def detect_format(path: Path) -> str:
    """Guess the format of a dataset path from the files present."""
    if path.is_dir():
        if any(path.glob("*.inter")):
            return "recbole-atomic"
        if (path / "ratings.dat").exists():
            return "movielens-dat"
        if (path / "ratings.csv").exists():
            return "movielens-csv"
        if (path / formats.LASTFM_EVENTS).exists():
            return "lastfm-1k"
        raise DataFileError(path, "cannot tell the dataset format from the files in this folder; "
                                  f"pass format= one of {sorted(FORMATS)}")
    if path.suffix == ".tsv":
        return "lastfm-1k"
    if path.name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "amazon-jsonl"
    raise DataFileError(path, f"cannot tell the dataset format; pass format= one of {sorted(FORMATS)}")


def load_dataset(name_or_path: str | Path, *, format: str | None = None, **options) -> Dataset:
    """Load a dataset by built-in name ("ml-100k") or from a path in one of `FORMATS`.

    Options go to the format's loader (e.g. `metadata=` for Amazon reviews).
    """
    key = str(name_or_path)
    if format is None and key in BUILTIN:
        return BUILTIN[key](**options)
    path = Path(name_or_path)
    if not path.exists():
        raise UnknownDatasetError(
            f"unknown dataset {key!r}: not a built-in name ({sorted(BUILTIN)}) and no such path"
        )
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise UnknownDatasetError(f"unknown dataset format {fmt!r}; known: {sorted(FORMATS)}")
    if fmt == "recbole-atomic" and path.is_dir() and "name" not in options:
        inter = sorted(path.glob("*.inter"))
        options["name"] = inter[0].stem if inter else path.name
    return FORMATS[fmt](path, **options)
