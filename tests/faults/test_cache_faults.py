"""Faults in the response and embedding caches, and in LLM specs (issue 14, points 2 and 8).

Covered: a cache file that is not SQLite, a SQLite file with damaged pages, a
non-JSON response value, a JSON value of the wrong shape, a truncated embedding
blob, and an empty LLM spec. A damaged cache never stops a run: the file is moved
aside with a `CacheCorruptionWarning` naming it, and its entries are recomputed.
"""
import json
import sqlite3

import numpy as np
import pytest

from ctrlsim.backends import ResponseCache, load_llm
from ctrlsim.backends.encoders import EmbeddingCache
from ctrlsim.errors import CacheCorruptionWarning, ConfigError

QUESTION = [[{"role": "user", "content": "Name one colour."}]]


def test_a_file_that_is_not_sqlite_is_moved_aside_and_replaced(tmp_path):
    path = tmp_path / "responses.sqlite"
    path.write_bytes(b"this is not a database, just text that happens to be here" * 40)
    with pytest.warns(CacheCorruptionWarning, match=str(path)):
        cache = ResponseCache(path)
    assert cache.recovered_from is not None
    assert cache.recovered_from.name.startswith("responses.sqlite.corrupt-")
    assert cache.recovered_from.read_bytes().startswith(b"this is not a database")  # kept for inspection
    cache.put_many({"k": {"x": 1}})
    assert cache.get_many(["k"]) == {"k": {"x": 1}}


def _damage_pages(path):
    """Overwrite everything after the SQLite header page: the header still parses, the b-trees do not."""
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)
    path.write_bytes(bytes(data))


def test_damaged_pages_are_found_on_read_and_the_cache_starts_fresh(tmp_path):
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path)
    cache.put_many({f"key{i}": {"text": "x" * 200} for i in range(400)})
    cache.close()
    _damage_pages(path)
    with pytest.warns(CacheCorruptionWarning, match=str(path)):
        cache = ResponseCache(path)
        assert cache.get_many([f"key{i}" for i in range(400)]) == {}  # nothing usable: everything a miss
    cache.put_many({"fresh": {"ok": True}})
    assert cache.get_many(["fresh"]) == {"fresh": {"ok": True}}


@pytest.mark.llm
def test_non_json_value_is_deleted_and_recomputed(tmp_path, smol):
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path)
    smol.cache = cache
    try:
        first = smol.chat(QUESTION, max_tokens=6)[0]
        (key,) = [row[0] for row in cache._conn.execute("SELECT key FROM responses")]
        cache._conn.execute("UPDATE responses SET value = ? WHERE key = ?", ("{not json", key))
        cache._conn.commit()
        with pytest.warns(CacheCorruptionWarning, match=f"{path}.*could not be read"):
            again = smol.chat(QUESTION, max_tokens=6)[0]
        assert not again.cached and again.text == first.text
        stored = cache._conn.execute("SELECT value FROM responses").fetchone()[0]
        assert json.loads(stored)["text"] == first.text
    finally:
        smol.cache = None
        cache.close()


@pytest.mark.llm
def test_json_value_of_the_wrong_shape_is_recomputed(tmp_path, smol):
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path)
    smol.cache = cache
    try:
        first = smol.rate([QUESTION[0] + [{"role": "user", "content": "Rate red from 0 to 5."}]])
        (key,) = [row[0] for row in cache._conn.execute("SELECT key FROM responses")]
        cache.put_many({key: [1, 2, 3]})
        with pytest.warns(CacheCorruptionWarning, match=f"{path}.*lack the fields"):
            again = smol.rate([QUESTION[0] + [{"role": "user", "content": "Rate red from 0 to 5."}]])
        assert np.allclose(again, first, atol=0.05)
        assert cache.get_many([key])[key]["prompt_tokens"] > 0  # overwritten with a good value
    finally:
        smol.cache = None
        cache.close()


def test_truncated_embedding_blob_is_deleted(tmp_path):
    path = tmp_path / "vectors.sqlite"
    cache = EmbeddingCache(path)
    cache.put_many({"good": np.ones(4, dtype=np.float32)})
    cache._conn.execute("INSERT INTO vectors VALUES (?, ?)", ("bad", b"\x00\x01\x02"))  # 3 bytes: no float32
    cache._conn.commit()
    with pytest.warns(CacheCorruptionWarning, match=str(path)):
        found = cache.get_many(["good", "bad"])
    assert list(found) == ["good"] and np.array_equal(found["good"], np.ones(4, dtype=np.float32))
    assert cache._conn.execute("SELECT COUNT(*) FROM vectors WHERE key = 'bad'").fetchone()[0] == 0


def test_a_locked_cache_is_not_mistaken_for_damage(tmp_path):
    path = tmp_path / "responses.sqlite"
    ResponseCache(path).put_many({"k": {"v": 1}})
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing: readers wait, then see "locked"
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            ResponseCache(path)
        assert not list(tmp_path.glob("*.corrupt-*"))  # nothing moved aside
    finally:
        holder.rollback()
        holder.close()
    assert ResponseCache(path).get_many(["k"]) == {"k": {"v": 1}}


@pytest.mark.parametrize("spec", ["", "   ", "llamacpp:", None])
def test_empty_llm_spec_is_a_config_error(spec):
    with pytest.raises(ConfigError, match="spec"):
        load_llm(spec)
