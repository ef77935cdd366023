"""A persistent response cache so experiments replay bit-identically and resume for free.

Keys hash the model identity, the call kind, the messages and every generation
parameter (seed included). Calls that are not reproducible (temperature > 0
without a seed) are never cached. A damaged cache file is moved aside with a
warning and rebuilt (see `SqliteStore`).

What a key does not hold: the model's weights. A key names the model by its spec (a bundled
name, a file path with its digest where the runtime computes one, a server's URL and model
name), so after the model behind the same URL and name changes, the cache replays the old
model's replies. Give such a run another cache path (or switch its cache off).

Concurrent runs may share one cache file, and no run's stored replies ever differ from the
ones it used:

* SQLite serialises writers. A writer waits up to `BUSY_TIMEOUT_S` for another's lock, so two
  runs writing now and then never fail; a lock held longer is a `CacheLockedError` naming the
  file (another run holds it: wait, or give this run its own cache).
* The first stored value of a key wins. `put_many` inserts only keys the file does not hold yet
  (`INSERT OR IGNORE`, never `REPLACE`) and returns, read back in the same write transaction,
  the value the file holds for every key it was given; callers (`LLM.chat`, `LLM.rate`, the
  persona and embedding caches) use those values, not the ones they computed. Two runs that
  compute the same key at once, and get replies that differ (float noise from batching), both
  use the one stored reply, and a rerun from the cache replays exactly what each run used.
* A stored value that does not decode (or that the caller's check rejects) is damaged and is
  the only one ever replaced.

A cache file that is read-only, or whose folder cannot be created or written, is a
`CacheUnwritableError` naming the path, raised when the cache opens (not at the first write).
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from ctrlsim.errors import CacheCorruptionWarning, CacheLockedError, CacheUnwritableError

#: Seconds a cache operation waits for another process's lock before `CacheLockedError` (Python's
#: sqlite3 default is 5 s): long enough for any write of a run sharing the file, short enough that
#: a cache held by a stuck process fails the unit instead of hanging it.
BUSY_TIMEOUT_S = 60.0
SQL_CHUNK = 500  # keys per statement: SQLite caps the number of bound parameters


def _problem_kind(exc: sqlite3.OperationalError) -> str:
    """'locked', 'unwritable' or '' for an `OperationalError` (by SQLite's error name, else its text)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text or "busy" in text:
        return "locked"
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_IOERR", "SQLITE_FULL")) \
            or "readonly" in text or "unable to open" in text or "disk i/o" in text or "is full" in text:
        return "unwritable"
    return ""


def cache_key(model_id: str, kind: str, payload: Any, params: dict) -> str:
    blob = json.dumps({"model": model_id, "kind": kind, "payload": payload, "params": params},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class SqliteStore:
    """A key -> value table in one SQLite file (thread-safe, batched lookups).

    Subclasses choose the table, the value column's type and how values are encoded.
    A cache only saves work, so damage never stops a run: a file SQLite cannot read is
    moved aside to `<name>.corrupt-<time>` and a fresh, empty one started; a stored value
    that does not decode is deleted and recomputed. Both emit `CacheCorruptionWarning`
    naming the file (`recovered_from` keeps the moved file's path).

    Several processes may share the file (see the module docstring): each operation waits up to
    `timeout` seconds (default `BUSY_TIMEOUT_S`) for another's lock, then raises
    `CacheLockedError`; the first stored value of a key wins (`put_many`). A file or folder that
    cannot be written is a `CacheUnwritableError` when the store opens.
    """

    table = "store"
    value_column = "value TEXT NOT NULL"

    def __init__(self, path: str | Path, *, timeout: float | None = None):
        self.path = Path(path)
        self.timeout = BUSY_TIMEOUT_S if timeout is None else float(timeout)
        self._lock = threading.Lock()
        self.recovered_from: Path | None = None
        self._check_writable()
        try:
            self._conn = self._connect()
        except sqlite3.OperationalError as exc:  # locked, read-only, unreachable: not damage
            raise self._typed(exc) from None
        except sqlite3.DatabaseError as exc:
            self._conn = self._start_fresh(exc)

    def __getstate__(self) -> dict:
        """Pickle / deepcopy: the path and settings, not the lock or the open connection."""
        state = self.__dict__.copy()
        state.pop("_lock", None)
        state.pop("_conn", None)
        return state

    def __setstate__(self, state: dict) -> None:
        """Recreate the lock and reopen the file by its path (a copy shares the file, like a second
        run would: the first stored value of a key still wins)."""
        self.__dict__.update(state)
        self._lock = threading.Lock()
        try:
            self._conn = self._connect()
        except sqlite3.OperationalError as exc:
            raise self._typed(exc) from None
        except sqlite3.DatabaseError as exc:
            self._conn = self._start_fresh(exc)

    def _check_writable(self) -> None:
        """The file and its folder can be written (SQLite writes its journal beside the file)."""
        folder = self.path.parent
        advice = "make it writable, or give this run another cache path (e.g. another $CTRLSIM_CACHE)"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheUnwritableError(self.path, f"its folder {folder} cannot be created "
                                                  f"({exc.strerror or exc}); {advice}") from None
        if self.path.is_dir():
            raise CacheUnwritableError(self.path, "is a folder, not a cache file; give this run another "
                                                  "cache path")
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise CacheUnwritableError(self.path, f"the file is read-only; {advice}")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise CacheUnwritableError(self.path, f"its folder {folder} is not writable; {advice}")

    def _typed(self, exc: sqlite3.OperationalError) -> Exception:
        """The typed error for a lock held too long or a file SQLite cannot write, else `exc` itself."""
        kind = _problem_kind(exc)
        if kind == "locked":
            return CacheLockedError(self.path, f"SQLite waited {self.timeout:g} s for its lock: {exc}")
        if kind == "unwritable":
            return CacheUnwritableError(self.path, f"SQLite cannot write it ({exc}); make the file and its "
                                                   "folder writable, or give this run another cache path")
        return exc

    def _connect(self) -> sqlite3.Connection:
        # Autocommit: reads take no lasting lock, and every write is one explicit transaction.
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} "
                         f"(key TEXT PRIMARY KEY, {self.value_column})")
            conn.execute(f"SELECT key FROM {self.table} LIMIT 1").fetchall()
            conn.commit()
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _start_fresh(self, problem: Exception) -> sqlite3.Connection:
        """Move the damaged file (and its journal) aside, warn, and open an empty cache in its place."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-journal", "-wal", "-shm"):
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                source.replace(Path(f"{aside}{suffix}"))
        self.recovered_from = aside
        warnings.warn(CacheCorruptionWarning(
            f"cache file {self.path} is damaged ({problem}); moved it to {aside} and started an empty cache "
            "(its entries will be recomputed)"), stacklevel=3)
        return self._connect()

    def _recover(self, problem: Exception) -> None:
        """Called with the lock held when an open file turns out to be damaged."""
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
        self._conn = self._start_fresh(problem)

    def encode(self, value: Any):
        return value

    def decode(self, stored) -> Any:
        return stored

    def _select(self, keys: list[str]) -> list[tuple]:
        rows: list[tuple] = []
        for start in range(0, len(keys), SQL_CHUNK):
            chunk = keys[start:start + SQL_CHUNK]
            marks = ",".join("?" * len(chunk))
            rows.extend(self._conn.execute(f"SELECT * FROM {self.table} WHERE key IN ({marks})", chunk))
        return rows

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        bad: dict[str, Exception] = {}
        stored_bad: dict[str, Any] = {}
        with self._lock:
            try:
                rows = self._select(list(keys))
            except sqlite3.OperationalError as exc:
                raise self._typed(exc) from None
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                return {}
            for key, stored in rows:
                try:
                    found[key] = self.decode(stored)
                except (ValueError, TypeError) as exc:  # json errors are ValueErrors
                    bad[key], stored_bad[key] = exc, stored
            if bad:
                try:  # only the damaged value: another run may have stored a good one since
                    self._conn.executemany(
                        f"DELETE FROM {self.table} WHERE key = ? AND {self._value_name} = ?",
                        list(stored_bad.items()))
                except sqlite3.OperationalError as exc:
                    raise self._typed(exc) from None
        if bad:
            first_key, first_error = next(iter(bad.items()))
            warnings.warn(CacheCorruptionWarning(
                f"cache file {self.path}: {len(bad)} stored value(s) could not be read "
                f"(key {first_key}: {first_error}); "
                "deleted them, they will be recomputed"), stacklevel=2)
        return found

    @property
    def _value_name(self) -> str:
        return self.value_column.split()[0]

    def put_many(self, items: dict[str, Any], *,
                 valid: Callable[[Any], bool] | None = None) -> dict[str, Any]:
        """Store `items` where the file holds no value yet, and return the value the file holds for
        every key of `items`, read back in the same transaction. The first writer of a key wins: a
        key another run (or an earlier call) stored keeps its value, and the caller must use the
        returned values, never its own, so what a run used is what its cache replays. A stored value
        that does not decode, or that `valid(value)` rejects, is damaged: it is replaced."""
        if not items:
            return {}
        rows = [(k, self.encode(v)) for k, v in items.items()]
        with self._lock:
            try:
                try:
                    return self._write(rows, valid)
                except sqlite3.OperationalError:
                    raise
                except sqlite3.DatabaseError as exc:
                    self._recover(exc)
                    return self._write(rows, valid)
            except sqlite3.OperationalError as exc:
                raise self._typed(exc) from None

    def _write(self, rows: list[tuple], valid: Callable[[Any], bool] | None) -> dict[str, Any]:
        conn = self._conn
        # The write lock up front (IMMEDIATE): a deferred transaction that reads and then writes can
        # meet another such writer and fail at once, without waiting for the busy timeout.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(f"INSERT OR IGNORE INTO {self.table} VALUES (?, ?)", rows)
            mine = dict(rows)
            held: dict[str, Any] = {}
            for key, stored in self._select(list(mine)):
                try:
                    value = self.decode(stored)
                    if valid is None or valid(value):
                        held[key] = value
                except (ValueError, TypeError):
                    pass
            damaged = [(key, mine[key]) for key in mine if key not in held]
            if damaged:
                conn.executemany(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", damaged)
                held.update({key: self.decode(stored) for key, stored in damaged})
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise
        return held

    def __len__(self) -> int:
        with self._lock:
            try:
                return self._conn.execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0]
            except sqlite3.OperationalError as exc:
                raise self._typed(exc) from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class ResponseCache(SqliteStore):
    """LLM responses: key -> JSON value (one file; runs may share it: the first stored reply wins)."""

    table = "responses"

    def encode(self, value: Any) -> str:
        return json.dumps(value)

    def decode(self, stored: str) -> Any:
        return json.loads(stored)
