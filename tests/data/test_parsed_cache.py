"""The parsed-dataset cache: a dataset read back equals the parsed one, and no entry is ever stale."""
from __future__ import annotations

import os
import pickle
import stat
import warnings
from pathlib import Path

import pandas as pd
import pandas.testing as pdt
import pytest

from ctrlsim.cache_seal import cache_secret
from ctrlsim.data import FORMATS, formats, load_dataset, parsed_cache
from ctrlsim.data.registry import recbole_example_dir
from ctrlsim.errors import CacheCorruptionWarning, CacheUnavailableWarning, MissingDependencyError

TABLES = ("items", "interactions", "users", "item_tags")


def assert_same(a, b) -> None:
    """The same tables to the last value, dtype and index, and the same name and source."""
    for table in TABLES:
        pdt.assert_frame_equal(getattr(a, table), getattr(b, table), check_exact=True)
    assert (a.name, a.source) == (b.name, b.source)


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.pickle"))


def no_parse(*args, **kwargs):
    raise AssertionError("parsed again although the cache holds the dataset")


def test_ml100k_read_back_equals_the_parsed_dataset(tmp_path, monkeypatch):
    try:
        recbole_example_dir("ml-100k")
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    parsed = load_dataset("ml-100k")  # no cache: what every run got before
    first = load_dataset("ml-100k", cache=tmp_path)
    assert len(entries(tmp_path)) == 1
    monkeypatch.setattr(formats, "load_atomic", no_parse)
    again = load_dataset("ml-100k", cache=tmp_path)
    assert_same(parsed, first)
    assert_same(parsed, again)
    assert again is not first  # a fresh object per call, as parsing gives
    assert (len(again.items), len(again.interactions), len(again.users)) == (1682, 100_000, 943)
    assert again.history_ids("1")[:3] == parsed.history_ids("1")[:3]


def test_an_atomic_folder_is_read_back_and_rekeyed_when_a_file_changes(atomic_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = load_dataset(atomic_dir, cache=cache)
    assert_same(first, load_dataset(atomic_dir))
    real = formats.load_atomic
    monkeypatch.setitem(FORMATS, "recbole-atomic", no_parse)
    assert_same(first, load_dataset(atomic_dir, cache=cache))  # read back, not parsed

    monkeypatch.setitem(FORMATS, "recbole-atomic", real)
    inter = atomic_dir / "mini.inter"
    inter.write_text(inter.read_text().replace("1\t101\t4\t", "1\t101\t1\t"))  # user 1 now rates 101 a 1
    changed = load_dataset(atomic_dir, cache=cache)
    rating = changed.interactions.query("user_id == '1' and item_id == '101'")["rating"].item()
    assert rating == 1.0 and len(entries(cache)) == 2

    (atomic_dir / "mini.user").unlink()  # a file the loader reads disappears: another key
    without_users = load_dataset(atomic_dir, cache=cache)
    assert without_users.users.empty and len(entries(cache)) == 3


def test_a_change_to_the_loaders_source_is_a_new_key(atomic_dir, monkeypatch):
    before = parsed_cache.dataset_key("recbole-atomic", atomic_dir, {"name": "mini"})
    monkeypatch.setattr(parsed_cache, "_loader_source_digest", lambda: "0" * 64)
    assert parsed_cache.dataset_key("recbole-atomic", atomic_dir, {"name": "mini"}) != before


def test_options_that_are_not_json_are_never_cached(atomic_dir):
    assert parsed_cache.dataset_key("recbole-atomic", atomic_dir, {"name": object()}) is None


def test_a_damaged_entry_is_removed_and_the_dataset_parsed_again(atomic_dir, tmp_path):
    cache = tmp_path / "cache"
    expected = load_dataset(atomic_dir, cache=cache)
    (entry,) = entries(cache)
    entry.write_bytes(entry.read_bytes()[:100])  # torn
    with pytest.warns(CacheCorruptionWarning, match="damaged"):
        assert_same(expected, load_dataset(atomic_dir, cache=cache))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(expected, load_dataset(atomic_dir, cache=cache))  # rewritten, read back


class _Runs:
    """A pickle that would call `os.system` when loaded by a plain unpickler."""

    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


def test_an_entry_naming_another_class_is_refused_not_run(atomic_dir, tmp_path):
    cache = tmp_path / "cache"
    expected = load_dataset(atomic_dir, cache=cache)
    (entry,) = entries(cache)
    entry.write_bytes(pickle.dumps(_Runs()))  # unsealed: refused before anything is unpickled
    with pytest.warns(CacheCorruptionWarning, match="seal does not verify"):
        assert_same(expected, load_dataset(atomic_dir, cache=cache))
    # Sealed by someone holding the cache's key: the restricted unpickler still refuses to run it.
    entry.write_bytes(parsed_cache.sealed_entry(cache_secret(cache), entry.stem, pickle.dumps(_Runs())))
    with pytest.warns(CacheCorruptionWarning, match="may not name posix.system|may not name os.system"):
        assert_same(expected, load_dataset(atomic_dir, cache=cache))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_cache_folder_only_costs_the_saving(atomic_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.warns(CacheUnavailableWarning, match="cannot be written"):
            assert_same(load_dataset(atomic_dir), load_dataset(atomic_dir, cache=cache))
    finally:
        cache.chmod(stat.S_IRWXU)


def test_an_unwritable_cache_path_only_costs_the_saving(atomic_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder belongs")
    with pytest.warns(CacheUnavailableWarning, match="cannot be written"):
        assert_same(load_dataset(atomic_dir), load_dataset(atomic_dir, cache=blocker / "cache"))


def test_a_table_of_another_type_is_not_cached(atomic_dir, tmp_path, monkeypatch):
    real = formats.load_atomic

    def with_categories(*args, **kwargs):
        ds = real(*args, **kwargs)
        ds.items["kind"] = pd.Categorical(["film"] * len(ds.items))  # a class the reader does not allow
        return ds

    monkeypatch.setitem(FORMATS, "recbole-atomic", with_categories)
    ds = load_dataset(atomic_dir, cache=tmp_path / "cache")
    assert "kind" in ds.items and entries(tmp_path / "cache") == []
