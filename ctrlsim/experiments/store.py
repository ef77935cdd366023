"""Incremental, resumable result files (JSON lines), one locked writer, append-only.

The first line holds the run's config; every later line is one finished unit of work
(a scenario, a user, an episode) under a unique key. A run that is interrupted and
started again with the same config skips the keys already written, so nothing computed
is lost and nothing is paid for twice. A different config on the same file is an error
(rather than silently mixing results).

Safety rules, because a lost finished result costs hours of LLM time:
- one writer: the store holds an exclusive `flock` on `<file>.lock` for its lifetime (the
  OS drops it when the process dies, even on SIGKILL); a second writer gets
  `StoreLockedError` naming the holder's pid, host and start time;
- append-only: existing lines are never rewritten or truncated. A line torn by a kill is
  left where it is; the next writer first ends it and appends a repair marker, and readers
  skip a torn line that is last in the file or followed by that marker;
- duplicates are resolved on read by key: the first complete record wins.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ctrlsim.atomic import atomic_write_text
from ctrlsim.errors import ConfigError, DataFileError, RunLockedError
from ctrlsim.experiments.units import is_failure
from ctrlsim.redact import redact_secrets

REPAIR_MARKER = {"repair": "the line above was cut short by an interruption and is ignored"}


class StoreLockedError(RunLockedError):
    """Another process is writing this result file."""


class ResultStore:
    """The records of one run; `extensible` names the config fields that may grow (see `identity`).

    After an extension the stored config is the union: an `{"extend": config}` line records it
    (appended, like everything else), and `config` is the union from then on.
    """

    def __init__(self, path: str | Path, config: dict, *, overwrite: bool = False,
                 extensible: tuple[str, ...] = (), on_locked: Callable[[], None] | None = None,
                 record_fields: tuple[str, ...] = ()):
        self.path = Path(path)
        # Normalised (tuples -> lists) and with credentials cut out, as it is stored: a resume compares equal.
        self.config = normalised_config(config)
        self.extensible = tuple(extensible)
        self.record_fields = tuple(record_fields)  # a stored record without one of them is damaged
        if self.path.is_dir():
            raise DataFileError(self.path, "is a folder, expected a JSON-lines result file")
        if self.path.is_symlink():
            raise DataFileError(self.path, "is a symbolic link; a run's records are written only into "
                                           "its own folder")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock_fh = _acquire_lock(self._lock_path)
        if on_locked is not None:  # the run folder's own steps under the lock, before anything is read
            try:
                on_locked()
            except BaseException:
                self.close()
                raise
        self._records: dict[str, dict] = {}
        self._needs_repair = False
        if overwrite and self.path.exists() and self.path.stat().st_size:
            # Explicitly discarded results are moved aside, never deleted, never over an older backup.
            self.path.rename(unique_path(self.path.with_name(f"{self.path.name}.{time_stamp()}"), ".bak"))
        if self.path.exists() and self.path.stat().st_size:
            self._load()
        else:
            atomic_write_text(self.path, redact_secrets(json.dumps({"config": self.config})) + "\n")

    # ------------------------------------------------------------------ reading

    def _load(self) -> None:
        try:
            text = self.path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataFileError(self.path, f"is not a UTF-8 text file (byte {exc.start})") from None
        lines = text.split("\n")
        torn_tail = not text.endswith("\n")
        if not torn_tail:
            lines = lines[:-1]
        header = _parse_line(lines[0])
        if not isinstance(header, dict) or "config" not in header:
            raise DataFileError(self.path, "line 1 is not a result-file header ({\"config\": ...})")
        stored = header["config"]
        for n, line in enumerate(lines[1:], 2):
            row = _parse_line(line)
            if row is None:
                last = n == len(lines)
                followed_by_marker = not last and _parse_line(lines[n]) == REPAIR_MARKER
                if last or followed_by_marker:
                    continue
                raise DataFileError(self.path, f"line {n} is not JSON: {line[:80]!r}")
            if row == REPAIR_MARKER:
                continue
            if isinstance(row, dict) and set(row) == {"extend"}:
                stored = row["extend"]
                continue
            if not isinstance(row, dict) or "key" not in row or "record" not in row:
                raise DataFileError(self.path, f"line {n} is not a record "
                                                "({{\"key\": ..., \"record\": ...}})")
            record, key = row["record"], str(row["key"])
            damage = self._damage(record)
            if damage:
                import warnings

                from ctrlsim.errors import DamagedRecordWarning

                warnings.warn(DamagedRecordWarning(f"{self.path} line {n} (key {key!r}): {damage}; "
                                                   "the unit runs again"), stacklevel=2)
                continue
            if not is_failure(record):
                # Failure records (older versions stored some) are not results: the unit runs again.
                self._records.setdefault(key, record)
        self._needs_repair = torn_tail
        if stored != self.config:
            from ctrlsim.experiments.identity import extend_config

            merged = extend_config(stored, self.config, self.extensible, where=str(self.path))
            if merged != stored:
                self._append({"extend": merged})
            self.config = merged

    def _damage(self, record: Any) -> str | None:
        """Why a stored record is not a complete one (None when it is)."""
        if not isinstance(record, dict):
            return f"the record is a {type(record).__name__}, not an object"
        if is_failure(record):
            return None
        missing = [f for f in self.record_fields if f not in record]
        return f"the record lacks {', '.join(missing)}" if missing else None

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str, default=None):
        return self._records.get(key, default)

    def records(self) -> Iterator[tuple[str, dict]]:
        return iter(list(self._records.items()))

    # ------------------------------------------------------------------ writing

    def add(self, key: str, record: dict[str, Any]) -> None:
        """Append one finished unit (flushed and synced at once)."""
        if self._lock_fh is None:
            raise ConfigError(f"result store {self.path} is closed")
        if key in self._records:
            raise ConfigError(f"result key {key!r} already recorded in {self.path}")
        # What is kept in memory is what is on disk: normalised, credentials cut out.
        record = json.loads(redact_secrets(json.dumps(record, default=_jsonable)))
        self._append({"key": key, "record": record})
        self._records[key] = record

    def _append(self, row: dict) -> None:
        self._check_lock_held()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                if self._needs_repair:
                    fh.write("\n" + json.dumps(REPAIR_MARKER) + "\n")
                    self._needs_repair = False
                fh.write(json.dumps(row, default=_jsonable) + "\n")  # rows are redacted already
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            # A line cut short by a full disk is a torn line: the next writer repairs it.
            self._needs_repair = True
            raise DataFileError(self.path, f"cannot be written ({exc.strerror or exc}); what was stored "
                                           "before is kept, and the same command resumes") from None

    def _check_lock_held(self) -> None:
        """The lock file is still the one this store locked: deleted or replaced, another run may have
        taken a new lock on this folder, so nothing more is written (a rerun resumes)."""
        if self._lock_fh is None:
            raise ConfigError(f"result store {self.path} is closed")
        try:
            same = os.path.samestat(os.fstat(self._lock_fh.fileno()), os.lstat(self._lock_path))
        except FileNotFoundError:
            same = False
        if not same:
            raise StoreLockedError(f"the lock file {self._lock_path} was deleted or replaced while this run "
                                   "held it, so another run may be writing this folder; this run stops "
                                   "without writing (rerun the command to resume)")

    def close(self) -> None:
        """Release the writer lock (also released when the process ends)."""
        if self._lock_fh is not None:
            import fcntl

            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; the OS releases the lock anyway
            pass


def normalised_config(config: dict) -> dict:
    """`config` as a result file stores it: JSON values only (tuples -> lists), credentials cut out."""
    return json.loads(redact_secrets(json.dumps(config, default=_jsonable)))


def holds_records(path: Path) -> bool:
    """Whether result file `path` has any line after its header (read no further than that)."""
    try:
        with open(path, "rb") as fh:
            fh.readline()
            return any(line.strip() for line in iter(fh.readline, b""))
    except FileNotFoundError:
        return False


def _parse_line(line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def time_stamp() -> str:
    """The local time in backup names: 20261201-145300."""
    return time.strftime("%Y%m%d-%H%M%S")


def unique_path(stem: Path, suffix: str = "") -> Path:
    """`stem + suffix`, or `stem-2 + suffix`, `stem-3 + suffix`, ...: the first name not taken."""
    candidate, n = stem.with_name(stem.name + suffix), 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = stem.with_name(f"{stem.name}-{n}{suffix}")
    return candidate


def _acquire_lock(lock_path: Path):
    """An exclusive `flock` on `lock_path`, opened without following a symbolic link (a planted link
    would otherwise send the holder's line into its target) and checked to be the file locked."""
    import fcntl

    for _ in range(5):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if lock_path.is_symlink():
                raise DataFileError(lock_path, "is a symbolic link; a run's lock file must be its own "
                                               "(remove the link)") from None
            raise DataFileError(lock_path, f"cannot be opened ({exc.strerror})") from None
        fh = os.fdopen(fd, "r+", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StoreLockedError(f"{lock_path.with_suffix('')} is being written by {holder}; "
                                   f"wait for it to finish or choose another output") from None
        try:  # the path may have been replaced between open and lock: lock what it names now
            if os.path.samestat(os.fstat(fh.fileno()), os.lstat(lock_path)):
                break
        except FileNotFoundError:
            pass
        fh.close()
    else:
        raise StoreLockedError(f"{lock_path} keeps being replaced while this run takes it")
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    fh.flush()
    return fh


def _jsonable(value):
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def read_run_records(path: str | Path, record_fields: tuple[str, ...] = ()) -> tuple[dict, dict[str, dict]]:
    """(config, finished records by key) of a result file, read without taking its writer lock.

    Safe while a run is still appending: a torn last line and repair markers are skipped, an
    `extend` line updates the config, failure records (older folders stored some) are left out, and
    so are damaged records (not an object, or without one of `record_fields`), as the writer skips them.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataFileError(path, "does not exist (not a run folder?)") from None
    except UnicodeDecodeError as exc:
        raise DataFileError(path, f"is not a UTF-8 text file (byte {exc.start})") from None
    header = _parse_line(lines[0]) if lines else None
    if not isinstance(header, dict) or "config" not in header:
        raise DataFileError(path, "line 1 is not a result-file header ({\"config\": ...})")
    config = header["config"]
    records: dict[str, dict] = {}
    for line in lines[1:]:
        row = _parse_line(line)
        if isinstance(row, dict) and set(row) == {"extend"}:
            config = row["extend"]
        elif isinstance(row, dict) and "key" in row and isinstance(row.get("record"), dict) \
                and not is_failure(row["record"]) and all(f in row["record"] for f in record_fields):
            records.setdefault(str(row["key"]), row["record"])
    return config, records
