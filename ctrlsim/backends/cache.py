"""A persistent response cache so experiments replay bit-identically and resume for free.

Keys hash the model identity, the call kind, the messages and every generation
parameter (seed included). Calls that are not reproducible (temperature > 0
without a seed) are never cached. A damaged cache file is moved aside with a
warning and rebuilt (see `SqliteStore`).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from ctrlsim.errors import CacheCorruptionWarning


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
    """

    table = "store"
    value_column = "value TEXT NOT NULL"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.recovered_from: Path | None = None
        try:
            self._conn = self._connect()
        except sqlite3.OperationalError:
            raise  # locked, read-only, unreachable: a real problem, not damage
        except sqlite3.DatabaseError as exc:
            self._conn = self._start_fresh(exc)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False)
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

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        bad: dict[str, Exception] = {}
        with self._lock:
            try:
                for start in range(0, len(keys), 500):  # SQLite caps the number of bound parameters
                    chunk = keys[start:start + 500]
                    marks = ",".join("?" * len(chunk))
                    for key, stored in self._conn.execute(
                            f"SELECT * FROM {self.table} WHERE key IN ({marks})", chunk):
                        try:
                            found[key] = self.decode(stored)
                        except (ValueError, TypeError) as exc:  # json errors are ValueErrors
                            bad[key] = exc
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                return {}
            if bad:
                self._conn.executemany(f"DELETE FROM {self.table} WHERE key = ?", [(k,) for k in bad])
                self._conn.commit()
        if bad:
            first_key, first_error = next(iter(bad.items()))
            warnings.warn(CacheCorruptionWarning(
                f"cache file {self.path}: {len(bad)} stored value(s) could not be read "
                f"(key {first_key}: {first_error}); "
                "deleted them, they will be recomputed"), stacklevel=2)
        return found

    def put_many(self, items: dict[str, Any]) -> None:
        if not items:
            return
        rows = [(k, self.encode(v)) for k, v in items.items()]
        with self._lock:
            try:
                self._write(rows)
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                self._write(rows)

    def _write(self, rows: list[tuple]) -> None:
        self._conn.executemany(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", rows)
        self._conn.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class ResponseCache(SqliteStore):
    """LLM responses: key -> JSON value (one file; safe across runs)."""

    table = "responses"

    def encode(self, value: Any) -> str:
        return json.dumps(value)

    def decode(self, stored: str) -> Any:
        return json.loads(stored)
