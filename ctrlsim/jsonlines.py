"""Append-only JSON-lines logs (provenance, HTTP exchanges, costs): one object per line, appended whole.

`append_object` is the one guarded appender every such log goes through (a run's records.jsonl has
its own, `ctrlsim.experiments.store`, under the run's lock):

- it takes an exclusive `flock` on the file, so writers in several processes (units on the local
  executor and its helpers) never interleave lines;
- it opens the path as given with `O_NOFOLLOW`, never a resolved one: a symbolic link planted where
  the log belongs is a `DataFileError` naming it, and nothing is written through it;
- a torn last line (a kill or a full disk mid-write) is repaired as torn before the new line goes
  in: its bytes are moved to `<log>.torn-<time>` beside the log (nothing is lost), the log is cut
  back to its last whole line, and a `TornLineWarning` names both. Ending the torn line instead
  would glue it into the log as a damaged middle line, which every later reader would refuse. A
  last line that is a whole object and only lacks its newline (a hand edit) is ended and kept.

Readers skip a torn last line (no newline after it); a damaged line anywhere else is a
`DataFileError` naming the line, and so is a log that is a link or not a regular file. A full disk
or a read-only folder is one `DataFileError`.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctrlsim.errors import DataFileError


def read_objects(path: str | Path, data: bytes | None = None) -> list[dict[str, Any]]:
    """Every object of the log (none when it does not exist); a torn last line (one without its
    newline) is skipped, a damaged line before it is a `DataFileError` naming the line. `data`: the
    log's bytes, when the caller read them itself (to digest exactly what is parsed)."""
    path = Path(path)
    if data is None:
        data = read_log_bytes(path)
        if data is None:
            return []
    lines = data.decode("utf-8", errors="replace").split("\n")
    objects = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            if n == len(lines):  # the last line, not ended: cut short by a kill
                continue
            raise DataFileError(path, f"line {n} is not JSON: {line[:80]!r}") from None
        if not isinstance(value, dict):
            if n == len(lines):
                continue
            raise DataFileError(path, f"line {n} is not an object")
        objects.append(value)
    return objects


def read_log_bytes(path: str | Path) -> bytes | None:
    """A log's bytes (None when it does not exist), read by the path as given: a link there, or
    something that is not a regular file (a FIFO would block), is a `DataFileError` naming it."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise DataFileError(path, "is a symbolic link; ctrlsim reads no log through a link "
                                      "(remove the link)") from None
        raise DataFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise DataFileError(path, "is not a regular file; a JSON-lines log must be one")
        return fh.read()


def append_object(path: str | Path, value: Mapping[str, Any], *, sync: bool = True,
                  chained: bool = False) -> None:
    """Append `value` as one line (credentials cut out, keys sorted), under an exclusive lock; see the
    module docstring for links and torn lines. `chained`: the line gets its chain digest (`CHAIN`)."""
    from ctrlsim.redact import redact_secrets

    path = Path(path)
    data = (redact_secrets(json.dumps(value, sort_keys=True, default=str)) + "\n").encode("utf-8")
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise DataFileError(path, "is a symbolic link; ctrlsim appends to no log through a link "
                                      "(remove the link)") from None
        raise _unwritable(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataFileError(path, "is not a regular file; a JSON-lines log must be one")
        fcntl.flock(fd, fcntl.LOCK_EX)
        _repair_tail(path, fd)
        if chained:
            data = _chained(fd, data)
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    finally:
        os.close(fd)


def _unwritable(path: Path, exc: OSError) -> DataFileError:
    return DataFileError(path, f"cannot be written ({exc.strerror or exc}); what was stored before is "
                               "kept, and the same command resumes")


def _repair_tail(path: Path, fd: int) -> None:
    """Under the lock: a last line without its newline is ended when it is a whole object, otherwise
    moved aside (`_keep_aside`) and cut off, with a `TornLineWarning`."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = _last_line_start(fd, size)
    tail = os.pread(fd, size - start, start)
    try:
        whole = isinstance(json.loads(tail), dict)
    except ValueError:  # not JSON, or not UTF-8
        whole = False
    if whole:
        os.write(fd, b"\n")
        return
    aside = _keep_aside(path, tail)  # first kept, then cut: a kill in between loses nothing
    os.ftruncate(fd, start)
    import warnings

    from ctrlsim.errors import TornLineWarning

    warnings.warn(TornLineWarning(f"{path}: its last line was cut short (a write stopped by a kill or a "
                                  f"full disk); its {len(tail)} bytes were moved to {aside.name} beside it, "
                                  "and the log goes on after its last whole line"), stacklevel=3)


def _last_line_start(fd: int, size: int) -> int:
    """The offset just after the file's last newline (0 when it has none), read from the end."""
    end = size
    while end > 0:
        begin = max(0, end - 65536)
        found = os.pread(fd, end - begin, begin).rfind(b"\n")
        if found >= 0:
            return begin + found + 1
        end = begin
    return 0


def _keep_aside(path: Path, tail: bytes) -> Path:
    """Write a torn line's bytes to a new `<log>.torn-<time>` (`-2`, ... never over an earlier one),
    created exclusively and never through a link."""
    import time

    stem = f"{path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for n in range(1, 1000):
        aside = path.with_name(stem if n == 1 else f"{stem}-{n}")
        try:
            fd = os.open(aside, flags, 0o644)
        except FileExistsError:
            continue
        try:
            view = memoryview(tail)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        return aside
    raise FileExistsError(f"no free name beside {path} for its torn last line")


# ----------------------------------------------------------------------------- chained logs

# A chained log (the HTTP exchanges a replay answers from) links each line to the one before it, as
# git links a commit to its parent: a line's digest covers its own content and the previous line's
# digest. A digest that only covered its own line proves nothing once the line is edited (whoever
# edits it recomputes the digest); in a chain, the edit also breaks every later line's link, which
# the editor would have to forge too, so an edited, inserted, removed or reordered line shows.
CHAIN = "chain_sha256"


def chain_digest(previous: str, value: Mapping[str, Any]) -> str:
    """A chained line's digest: SHA-256 of the previous line's digest ("" before the first, or after a
    line without one) and of this line's content, every field but `CHAIN`, as written (keys sorted)."""
    text = json.dumps({k: v for k, v in value.items() if k != CHAIN}, sort_keys=True, default=str)
    return hashlib.sha256(f"{previous}\n{text}".encode("utf-8")).hexdigest()


def _chained(fd: int, data: bytes) -> bytes:
    """Under the lock, after the tail's repair: the line `data` (as written: keys sorted, credentials
    cut) with its chain digest, linked to the log's last line."""
    size = os.fstat(fd).st_size
    previous = ""
    if size:
        start = _last_line_start(fd, size - 1)  # the line ended by the file's last newline
        try:
            last = json.loads(os.pread(fd, size - 1 - start, start))
        except ValueError:
            last = None
        if isinstance(last, dict) and isinstance(last.get(CHAIN), str):
            previous = last[CHAIN]
    value = json.loads(data)
    value[CHAIN] = chain_digest(previous, value)
    return (json.dumps(value, sort_keys=True) + "\n").encode("utf-8")


def chain_breaks(objects: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[int]]:
    """(lines without a chain digest, lines whose digest does not follow from the line before and
    their own content), numbered from 1, of a chained log's objects (`read_objects`)."""
    previous, unchained, broken = "", [], []
    for n, value in enumerate(objects, 1):
        stored = value.get(CHAIN)
        if not isinstance(stored, str):
            unchained.append(n)
            previous = ""
            continue
        if stored != chain_digest(previous, value):
            broken.append(n)
        previous = stored
    return unchained, broken
