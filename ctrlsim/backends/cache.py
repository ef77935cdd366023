"""A persistent response cache so experiments replay bit-identically and resume for free.

Keys hash the model identity, the call kind, the messages and every generation
parameter (seed included). Calls that are not reproducible (temperature > 0
without a seed) are never cached.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


def cache_key(model_id: str, kind: str, payload: Any, params: dict) -> str:
    blob = json.dumps({"model": model_id, "kind": kind, "payload": payload, "params": params},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class SqliteStore:
    """A key -> value table in one SQLite file (thread-safe, batched lookups).

    Subclasses choose the table, the value column's type and how values are encoded.
    """

    table = "store"
    value_column = "value TEXT NOT NULL"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False)
        self._conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (key TEXT PRIMARY KEY, {self.value_column})")
        self._conn.commit()

    def encode(self, value: Any):
        return value

    def decode(self, stored) -> Any:
        return stored

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        with self._lock:
            for start in range(0, len(keys), 500):  # SQLite caps the number of bound parameters
                chunk = keys[start:start + 500]
                marks = ",".join("?" * len(chunk))
                for key, stored in self._conn.execute(f"SELECT * FROM {self.table} WHERE key IN ({marks})", chunk):
                    found[key] = self.decode(stored)
        return found

    def put_many(self, items: dict[str, Any]) -> None:
        if not items:
            return
        with self._lock:
            self._conn.executemany(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)",
                                   [(k, self.encode(v)) for k, v in items.items()])
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
