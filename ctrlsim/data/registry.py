"""`load_dataset`: built-in dataset names and format detection for paths."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable, Mapping

from ctrlsim.data import formats, parsed_cache
from ctrlsim.data.dataset import Dataset
from ctrlsim.errors import DataFileError, MissingDependencyError, UnknownDatasetError

#: How RecBole is installed: its runtime needs through ctrlsim's extra, then RecBole itself without its
#: stale `ray<=2.6.3` pin (which has no wheels past Python 3.11); see docs/recbole.md.
RECBOLE_INSTALL = 'pip install "ctrlsim[recbole]" && pip install --no-deps recbole==1.2.1'


def recbole_missing(purpose: str) -> MissingDependencyError:
    """The `MissingDependencyError` for a missing `recbole` package, naming both install steps."""
    exc = MissingDependencyError("recbole", "recbole", purpose)
    message = f"Python package 'recbole' is not installed (needed for {purpose}). Install it with: " \
              f"{RECBOLE_INSTALL}"
    exc.args, exc.msg = (message,), message
    return exc


def recbole_example_dir(name: str) -> Path:
    """Folder of a dataset shipped inside the `recbole` wheel, found without importing recbole."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise recbole_missing(f"the bundled {name} data")
    folder = Path(list(spec.submodule_search_locations)[0]) / "dataset_example" / name
    if not folder.is_dir():
        raise DataFileError(folder, f"the installed recbole has no bundled {name}")
    return folder


def _ml100k() -> Dataset:
    ds = formats.load_atomic(recbole_example_dir("ml-100k"), "ml-100k")
    ds.source["provider"] = "recbole wheel (dataset_example/ml-100k)"
    return ds


BUILTIN: dict[str, Callable[[], Dataset]] = {"ml-100k": _ml100k}
# The folder each built-in dataset is parsed from (what its cache key hashes).
BUILTIN_FOLDERS: dict[str, Callable[[], Path]] = {"ml-100k": lambda: recbole_example_dir("ml-100k")}

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


def _atomic_files(folder: Path, options: Mapping[str, Any]) -> list[Path]:
    """The files `formats.load_atomic` reads (present or not)."""
    name = options.get("name") or folder.name
    return [folder / f"{name}{suffix}" for suffix in (".inter", ".item", ".user")]


def load_dataset(name_or_path: str | Path, *, format: str | None = None,
                 cache: str | Path | None = None, **options) -> Dataset:
    """Load a dataset by built-in name ("ml-100k") or from a path in one of `FORMATS`.

    Options go to the format's loader (e.g. `metadata=` for Amazon reviews). With `cache` (a
    folder; the runners pass `$CTRLSIM_CACHE/datasets`) the built dataset is kept there, keyed
    by the digest of the files it was parsed from, and read back instead of parsed next time
    (`ctrlsim.data.parsed_cache`).
    """
    key = str(name_or_path)
    if format is None and key in BUILTIN:
        if cache is None or options:
            return BUILTIN[key](**options)
        folder = BUILTIN_FOLDERS[key]()
        return parsed_cache.cached_load(cache, parsed_cache.dataset_key(f"builtin:{key}", folder, {},
                                                                        _atomic_files),
                                        BUILTIN[key])
    if cache is not None:
        return _load_path(name_or_path, format, cache, options)
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


def _load_path(name_or_path: str | Path, format: str | None, cache: str | Path,
               options: dict[str, Any]) -> Dataset:
    """`load_dataset` of a path through the parsed-dataset cache in `cache`."""
    path = Path(name_or_path)
    if not path.exists():
        return load_dataset(name_or_path, format=format, **options)  # its error
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        return load_dataset(name_or_path, format=format, **options)  # its error
    if fmt == "recbole-atomic" and path.is_dir() and "name" not in options:
        inter = sorted(path.glob("*.inter"))
        options = {**options, "name": inter[0].stem if inter else path.name}
    read = _atomic_files if fmt == "recbole-atomic" and path.is_dir() else None
    return parsed_cache.cached_load(cache, parsed_cache.dataset_key(fmt, path, options, read),
                                    lambda: FORMATS[fmt](path, **options))
