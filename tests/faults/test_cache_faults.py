"""Faults in the response and embedding caches, and in LLM specs (issue 14, points 2 and 8).

Covered: a cache file that is not SQLite, a SQLite file with damaged pages, a
non-JSON response value, a JSON value of the wrong shape, a truncated embedding
blob, and an empty LLM spec. A damaged cache never stops a run: the file is moved
aside with a `CacheCorruptionWarning` naming it, and its entries are recomputed.

Issue 20 (reliability part 2): a cache locked by another process (a brief lock is waited
for; one held past the busy timeout, on open, read or write, is a `CacheLockedError` naming
the file), a read-only cache file, a cache folder that cannot be created or written (a
`CacheUnwritableError` naming the path), and two runs sharing one cache: the first stored
value of a key wins and every run uses what the cache holds, at the store level and for
`LLM.chat` / `LLM.rate` with two runs computing the same key at the same time.
"""
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ctrlsim.backends import ResponseCache, load_llm
from ctrlsim.backends.cache import BUSY_TIMEOUT_S
from ctrlsim.backends.encoders import EmbeddingCache
from ctrlsim.backends.llm import LLM, Completion, DigitScores
from ctrlsim.errors import CacheCorruptionWarning, CacheLockedError, CacheUnwritableError, ConfigError

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
        # A hand-edited value (put_many never replaces a good one: the first stored value wins).
        cache._conn.execute("UPDATE responses SET value = ? WHERE key = ?", ("[1, 2, 3]", key))
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
        with pytest.raises(CacheLockedError, match="locked") as caught:
            ResponseCache(path, timeout=0.1)
        assert caught.value.path == str(path)
        assert not list(tmp_path.glob("*.corrupt-*"))  # nothing moved aside
    finally:
        holder.rollback()
        holder.close()
    assert ResponseCache(path).get_many(["k"]) == {"k": {"v": 1}}


@pytest.mark.parametrize("spec", ["", "   ", "llamacpp:", None])
def test_empty_llm_spec_is_a_config_error(spec):
    with pytest.raises(ConfigError, match="spec"):
        load_llm(spec)


# ----------------------------------------------------------------------------- locks (issue 20)

def test_the_busy_timeout_is_long_enough_for_another_runs_writes(tmp_path):
    """Python's sqlite3 waits 5 s by default; a cache waits BUSY_TIMEOUT_S (a minute) for a lock."""
    cache = ResponseCache(tmp_path / "responses.sqlite")
    assert BUSY_TIMEOUT_S >= 30
    assert cache._conn.execute("PRAGMA busy_timeout").fetchone()[0] == int(BUSY_TIMEOUT_S * 1000)


def test_a_brief_write_by_another_process_is_waited_for_not_failed(tmp_path):
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path, timeout=30)
    holder = sqlite3.connect(path, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO responses VALUES ('theirs', '{\"text\": \"B\"}')")
    release = threading.Timer(0.4, holder.commit)  # the other run's write ends 0.4 s from now
    release.start()
    started = time.monotonic()
    try:
        held = cache.put_many({"mine": {"text": "A"}, "theirs": {"text": "A"}})
    finally:
        release.join()
        holder.close()
    assert time.monotonic() - started >= 0.3  # it waited for the lock ...
    assert held == {"mine": {"text": "A"}, "theirs": {"text": "B"}}  # ... and then saw the other's write


def test_a_lock_held_past_the_timeout_is_a_typed_error_naming_the_file(tmp_path):
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path, timeout=0.2)
    cache.put_many({"old": {"v": 1}})
    holder = sqlite3.connect(path)
    holder.execute("BEGIN IMMEDIATE")  # another run is writing (it holds the write lock)
    try:
        assert cache.get_many(["old"]) == {"old": {"v": 1}}  # reading goes on beside a writer
        with pytest.raises(CacheLockedError) as caught:
            cache.put_many({"new": {"v": 2}})
        message = str(caught.value)
        assert caught.value.path == str(path) and str(path) in message
        assert "another run" in message and "its own cache" in message  # what to do
        assert isinstance(caught.value, ConfigError)  # a CtrlsimError: exit code 2 from the CLI
        holder.execute("COMMIT")
        holder.execute("BEGIN EXCLUSIVE")  # now readers are shut out too
        with pytest.raises(CacheLockedError, match="locked"):
            cache.get_many(["old"])
    finally:
        holder.rollback()
        holder.close()
    assert cache.put_many({"new": {"v": 2}}) == {"new": {"v": 2}}  # usable once the lock is gone
    assert cache.get_many(["old", "new"]) == {"old": {"v": 1}, "new": {"v": 2}}


# ----------------------------------------------------------------------------- unwritable caches (issue 20)

def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder that cannot be created or written here: a child of a 0o500 folder, or for root
    (whom modes do not bind) a folder under sysfs, which refuses new entries even to root."""
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o500)
    if not os.access(parent, os.W_OK):
        return parent / "cache"
    if Path("/sys/kernel").is_dir() and not (Path("/sys/kernel") / "ctrlsim-cache").exists():
        try:
            (Path("/sys/kernel") / "ctrlsim-cache").mkdir()
        except OSError:
            return Path("/sys/kernel") / "ctrlsim-cache"
        (Path("/sys/kernel") / "ctrlsim-cache").rmdir()
    pytest.skip("no unwritable folder available (running as root without sysfs)")


def test_a_cache_in_a_folder_that_cannot_be_created_is_a_typed_error_naming_it(tmp_path):
    path = _unwritable_folder(tmp_path) / "responses.sqlite"
    with pytest.raises(CacheUnwritableError) as caught:
        ResponseCache(path)
    assert caught.value.path == str(path) and str(path.parent) in str(caught.value)
    assert not path.exists()


def test_a_cache_under_a_file_is_a_typed_error_naming_it(tmp_path):
    (tmp_path / "a-file").write_text("not a folder\n")
    path = tmp_path / "a-file" / "responses.sqlite"
    with pytest.raises(CacheUnwritableError, match=str(tmp_path / "a-file")):
        EmbeddingCache(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="file modes do not bind root")
def test_a_read_only_cache_file_or_folder_is_a_typed_error_naming_it(tmp_path):
    path = tmp_path / "responses.sqlite"
    ResponseCache(path).put_many({"k": {"v": 1}})
    path.chmod(0o400)
    with pytest.raises(CacheUnwritableError, match=f"{path}.*read-only"):
        ResponseCache(path)
    path.chmod(0o600)
    tmp_path.chmod(0o500)  # the file is writable, its folder (where the journal goes) is not
    try:
        with pytest.raises(CacheUnwritableError, match=f"{tmp_path}.*not writable"):
            ResponseCache(path)
    finally:
        tmp_path.chmod(0o700)


# ----------------------------------------------------------------------------- shared caches (issue 20)

def test_the_first_stored_value_of_a_key_wins_and_every_writer_gets_it(tmp_path):
    path = tmp_path / "responses.sqlite"
    run_a, run_b = ResponseCache(path), ResponseCache(path)
    assert run_a.put_many({"k": {"text": "A"}}) == {"k": {"text": "A"}}
    held = run_b.put_many({"k": {"text": "B"}, "only-b": {"text": "b"}})
    assert held == {"k": {"text": "A"}, "only-b": {"text": "b"}}  # B is told what the cache holds
    raw = sqlite3.connect(path).execute("SELECT key, value FROM responses ORDER BY key").fetchall()
    assert raw == [("k", '{"text": "A"}'), ("only-b", '{"text": "b"}')]  # nothing replaced


def test_only_a_damaged_or_rejected_stored_value_is_replaced(tmp_path):
    cache = ResponseCache(tmp_path / "responses.sqlite")
    cache._conn.execute("INSERT INTO responses VALUES ('bad', '{not json')")
    cache._conn.execute("INSERT INTO responses VALUES ('shape', '[1, 2]')")
    cache._conn.execute("INSERT INTO responses VALUES ('good', '{\"v\": 0}')")
    held = cache.put_many({"bad": {"v": 1}, "shape": {"v": 2}, "good": {"v": 3}},
                          valid=lambda value: isinstance(value, dict))
    assert held == {"bad": {"v": 1}, "shape": {"v": 2}, "good": {"v": 0}}
    assert cache.get_many(["bad", "shape", "good"]) == held


def test_two_embedding_caches_on_one_file_keep_the_first_vector(tmp_path):
    path = tmp_path / "vectors.sqlite"
    first, second = np.array([0.6, 0.8], dtype=np.float32), np.array([0.8, 0.6], dtype=np.float32)
    EmbeddingCache(path).put_many({"text": first})
    held = EmbeddingCache(path).put_many({"text": second})
    assert np.array_equal(held["text"], first)


class _RunLLM(LLM):
    """A runtime whose every reply differs (like float noise from batching differing between runs).
    `meanwhile` runs inside each generation: another run computing the same call at the same time."""

    runtime = "fake"

    def __init__(self, run: str, cache: ResponseCache, meanwhile=None, rating: int = 0):
        super().__init__("fake-model", cache=cache)  # one model spec: both runs share cache keys
        self.run, self.meanwhile, self.rating = run, meanwhile, rating
        self.made: list[str] = []

    def _generate(self, conversations, params):
        if self.meanwhile is not None:
            self.meanwhile()
        out = []
        for _ in conversations:
            self.made.append(f"{self.run} reply {len(self.made)}")
            out.append(Completion(self.made[-1], 7, len(self.run) + len(self.made)))
        return out

    def _digit_logprobs(self, conversations, prefix):
        if self.meanwhile is not None:
            self.meanwhile()
        with np.errstate(divide="ignore"):  # all mass on one digit: the others are -inf
            logprobs = np.log(np.eye(6)[self.rating])
        self.made.append(f"{self.run} rating {self.rating}")
        return [DigitScores(logprobs, 9) for _ in conversations]


def test_two_runs_computing_one_reply_at_once_both_use_the_stored_one(tmp_path):
    """Run A misses the cache and generates; meanwhile run B (same model, same prompt) generates and
    stores its own, different reply. A must return B's stored reply, not its own, so a rerun of A
    from the cache replays what A used."""
    path = tmp_path / "shared.sqlite"
    run_b = _RunLLM("run-B", ResponseCache(path))  # its replies cost 5 + 1 completion tokens, A's 1 + 1
    run_a = _RunLLM("A", ResponseCache(path), meanwhile=lambda: run_b.chat(QUESTION, max_tokens=8))
    used_by_a = run_a.chat(QUESTION, max_tokens=8)[0]
    assert run_a.made == ["A reply 0"] and run_b.made == ["run-B reply 0"]  # both really generated
    assert (used_by_a.text, used_by_a.completion_tokens) == ("run-B reply 0", 6)  # B's reply, B's tokens
    assert run_a.meter.total.completion_tokens == 6  # what A reports is what the cache holds
    replay = _RunLLM("C", ResponseCache(path)).chat(QUESTION, max_tokens=8)[0]
    assert replay.cached and (replay.text, replay.completion_tokens) == (used_by_a.text, 6)


def test_two_runs_rating_one_prompt_at_once_both_use_the_stored_scores(tmp_path):
    prompt = [[{"role": "user", "content": "Rate red from 0 to 5."}]]
    path = tmp_path / "shared.sqlite"
    run_b = _RunLLM("B", ResponseCache(path), rating=1)
    run_a = _RunLLM("A", ResponseCache(path), meanwhile=lambda: run_b.rate(prompt), rating=5)
    used_by_a = run_a.rate(prompt)
    assert run_a.made == ["A rating 5"] and run_b.made == ["B rating 1"]
    assert used_by_a.tolist() == [1.0]  # all of B's mass on the digit 1: expected rating exactly 1
    replay = _RunLLM("C", ResponseCache(path), rating=3).rate(prompt)
    assert replay.tolist() == [1.0] and run_a.meter.total.cached_calls == 0
