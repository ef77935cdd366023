"""A cache of parsed datasets: a run reads a built `Dataset` back instead of parsing its files again.

Parsing ml-100k from RecBole's atomic files (type checks, id normalisation, sorting, item texts)
costs more than everything else a fully cached rerun does; reading the built tables back costs a
few milliseconds. `load_dataset(spec, cache=folder)` keeps one entry per key in `folder`
(the runners pass `$CTRLSIM_CACHE/datasets`).

The key is a SHA-256 over everything the built dataset depends on, so an entry is never stale:
the format and the loader's options, the bytes of every file the loader reads (a file that is
absent counts too: adding `ml-100k.user` changes the key), the source of the loaders
(`ctrlsim/data/*.py`), and the Python, numpy and pandas versions (the pickle's readers). An entry
that cannot be read is damaged: it is removed with a `CacheCorruptionWarning` and the dataset is
parsed again. A folder that cannot be written only costs the saving (`CacheUnavailableWarning`).

The key says which dataset an entry should hold, not that it holds it: an entry replaced by another
valid dataset would be read as this one. So every entry carries a seal (`ctrlsim.cache_seal`: an
HMAC under the folder's own secret key of the entry's key and pickle), checked before anything is
unpickled. An entry whose seal does not verify was edited, replaced or copied from another key; it
is treated as damaged.

Entries are pickles read by an unpickler that accepts only the classes a `Dataset`'s tables are
made of (a pickle naming anything else is refused, not run). A dataset whose pickle would need
another class, or whose options are not plain JSON values, is simply not cached.
"""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import platform
import warnings
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ctrlsim.cache_seal import cache_secret, seal, verify
from ctrlsim.errors import CacheCorruptionWarning, CacheUnavailableWarning, CtrlsimError

if TYPE_CHECKING:
    from ctrlsim.data.dataset import Dataset

#: Part of every key: bumped when the entry layout changes (2: sealed entries).
CACHE_FORMAT = 2
# An entry is this header, its seal (64 hex digits), a newline, then the pickle.
_HEADER = b"ctrlsim-dataset-entry "

# (module, name) of every global a Dataset pickle may name (numpy 1 and 2 spell the first two
# modules differently). Nothing outside this list is ever looked up while reading an entry.
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    ("builtins", "slice"), ("ctrlsim.data.dataset", "Dataset"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("pandas._libs.internals", "_unpickle_block"),
    ("pandas._libs.missing", "NA"),
    ("pandas.core.arrays.integer", "Int64Dtype"), ("pandas.core.arrays.integer", "Int32Dtype"),
    ("pandas.core.arrays.integer", "IntegerArray"),
    ("pandas.core.arrays.floating", "Float64Dtype"), ("pandas.core.arrays.floating", "FloatingArray"),
    ("pandas.core.arrays.boolean", "BooleanDtype"), ("pandas.core.arrays.boolean", "BooleanArray"),
    ("pandas.core.frame", "DataFrame"), ("pandas.core.series", "Series"),
    ("pandas.core.indexes.base", "Index"), ("pandas.core.indexes.base", "_new_Index"),
    ("pandas.core.indexes.range", "RangeIndex"),
    ("pandas.core.internals.managers", "BlockManager"),
    ("pandas.core.internals.managers", "SingleBlockManager"),
})


class _DatasetUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"a dataset cache entry may not name {module}.{name}")
        return super().find_class(module, name)


def _read(blob: bytes) -> Dataset:
    from ctrlsim.data.dataset import Dataset

    value = _DatasetUnpickler(io.BytesIO(blob)).load()
    if not isinstance(value, Dataset):
        raise pickle.UnpicklingError(f"a dataset cache entry holds a {type(value).__name__}, not a Dataset")
    return value


@lru_cache(maxsize=1)
def _loader_source_digest() -> str:
    """SHA-256 over the names and bytes of the loaders' source files (ctrlsim/data/*.py)."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _file_entry(path: Path) -> list[str]:
    if not path.is_file():
        return [str(path), "absent"]
    return [str(path), hashlib.sha256(path.read_bytes()).hexdigest()]


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [path]


def dataset_key(fmt: str, path: Path, options: Mapping[str, Any],
                read_files: Callable[[Path, Mapping[str, Any]], list[Path]] | None = None) -> str | None:
    """The cache key of `fmt` read from `path` with `options`, or None when it cannot have one
    (an option that is not a plain JSON value). `read_files(path, options)` lists the files the
    loader reads (default: `path` itself, or every file under the folder `path`); option values
    naming existing files (e.g. Amazon's `metadata=`) count as inputs too."""
    import numpy as np
    import pandas as pd

    try:
        shown_options = json.dumps(dict(options), sort_keys=True, default=_refuse)
    except (TypeError, ValueError):
        return None
    inputs = list(read_files(path, options) if read_files else _files(path))
    for value in options.values():
        if isinstance(value, (str, Path)) and str(value) and Path(value).is_file():
            inputs.append(Path(value))
    versions = {"numpy": np.__version__, "pandas": pd.__version__}  # the readers of the pickle
    blob = json.dumps({"cache_format": CACHE_FORMAT, "format": fmt, "path": str(path.resolve()),
                       "options": shown_options, "files": [_file_entry(p.resolve()) for p in inputs],
                       "loaders": _loader_source_digest(), "python": platform.python_version(),
                       **versions}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _refuse(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not a plain JSON option: {type(value).__name__}")


def sealed_entry(secret: bytes, key: str, blob: bytes) -> bytes:
    """The bytes of the entry holding pickle `blob` under `key`, sealed with `secret`."""
    return _HEADER + seal(secret, "dataset", key, blob).encode("ascii") + b"\n" + blob


def _unsealed(entry: bytes, secret: bytes, key: str) -> bytes:
    """The pickle of an entry whose seal verifies (else a ValueError: the entry is not used)."""
    head, newline, blob = entry.partition(b"\n")
    mac = head[len(_HEADER):].decode("ascii", "replace")
    if not newline or not head.startswith(_HEADER) or not verify(secret, mac, "dataset", key, blob):
        raise ValueError("its seal does not verify: it was changed or replaced since this cache wrote it")
    return blob


def cached_load(folder: str | Path, key: str | None, parse: Callable[[], Dataset]) -> Dataset:
    """The dataset stored under `key` in `folder`, else `parse()`'s, stored there for next time."""
    if key is None:
        return parse()
    entry = Path(folder) / f"{key}.pickle"
    try:
        blob = entry.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no folder) yet
        blob = None
    except OSError as exc:
        warnings.warn(CacheUnavailableWarning(f"dataset cache entry {entry} cannot be read ({exc}); "
                                              "parsing the dataset"), stacklevel=3)
        return parse()
    if blob is not None:
        try:
            secret = cache_secret(entry.parent)
        except OSError as exc:  # CacheUnwritableError: nothing stored can be verified, or kept
            warnings.warn(CacheUnavailableWarning(f"{exc}; parsing the dataset"), stacklevel=3)
            return parse()
        try:
            return _read(_unsealed(blob, secret, key))
        except Exception as exc:  # noqa: BLE001 - any unreadable entry is damage: parse again
            warnings.warn(CacheCorruptionWarning(
                f"dataset cache entry {entry} is damaged ({type(exc).__name__}: {exc}); removed it, "
                "parsing the dataset again"), stacklevel=3)
            entry.unlink(missing_ok=True)
    dataset = parse()
    _store(entry, dataset)
    return dataset


def _store(entry: Path, dataset: Dataset) -> None:
    """Write the entry if its pickle reads back with the restricted unpickler (else keep no entry)."""
    from ctrlsim.atomic import atomic_write_bytes

    blob = pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        _read(blob)
    except pickle.UnpicklingError:  # a table of another type: not cacheable, parsed every time
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(entry, sealed_entry(cache_secret(entry.parent), entry.stem, blob))
    except (OSError, CtrlsimError) as exc:
        warnings.warn(CacheUnavailableWarning(
            f"parsed dataset not cached: {entry} cannot be written ({exc}); the next run parses it again"),
            stacklevel=4)
