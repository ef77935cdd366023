"""The exchange log of HTTP black boxes: every request and answer of a run as JSON lines, indexed by
the request's logical content, so a repeated request answered differently is detected and a
recorded run can be replayed offline (`ctrlsim.recommenders.http.client`)."""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from ctrlsim.errors import CtrlsimError
from ctrlsim.jsonlines import append_object, read_objects
from ctrlsim.redact import redact_secrets as _shown


class ReplayMissError(CtrlsimError, LookupError):
    """A replayed run asked the service something the recorded run did not."""


class ExchangeChangedWarning(UserWarning):
    """The service answered a request it had answered before (same logical content) differently."""


def exchange_key(base: str, endpoint: str, logical: Any) -> str:
    blob = json.dumps({"url": _shown(base), "endpoint": endpoint, "logical": logical}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class ExchangeLog:
    """Append-only JSON lines of exchanges (one writer at a time per line: `flock`), indexed by key."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._index: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._index is None:
            self._index = {}
            for entry in read_exchanges(self.path):
                if entry.get("key") and "response" in entry:
                    self._index.setdefault(entry["key"], entry["response"])
        return self._index

    def answer(self, key: str) -> Any:
        with self._lock:
            return self._load().get(key, MISSING)

    def append(self, entry: dict[str, Any]) -> bool:
        """Append `entry`; True when its key was answered differently before (`changed`)."""


        with self._lock:
            key = entry.get("key")
            known = self._load().get(key, MISSING) if key else MISSING
            changed = known is not MISSING and known != entry["response"]
            if changed:
                entry = {**entry, "changed": True}
            if key:
                self._index.setdefault(key, entry["response"])  # type: ignore[union-attr]
            append_object(self.path, entry, sync=False)
            return changed


MISSING = object()


def read_exchanges(path: str | Path) -> list[dict[str, Any]]:
    """The entries of an exchange log (a torn last line, from a kill, is skipped)."""
    return read_objects(path)


_LOGS: dict[str, ExchangeLog] = {}
_LOGS_LOCK = threading.Lock()


def log_for(path: str) -> ExchangeLog:
    """One `ExchangeLog` per file and process (its index is shared by every box using it); a file
    moved away or replaced since (a new run in the same folder) gets a fresh one."""
    resolved = Path(path).expanduser().resolve()
    try:
        identity = f"{resolved}@{resolved.stat().st_ino}"
    except FileNotFoundError:
        identity = f"{resolved}@new"
    with _LOGS_LOCK:
        log = _LOGS.get(identity)
        if log is None:
            for stale in [k for k in _LOGS if k.startswith(f"{resolved}@")]:
                del _LOGS[stale]
            log = _LOGS[identity] = ExchangeLog(resolved)
        return log
