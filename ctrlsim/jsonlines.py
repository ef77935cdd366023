"""Append-only JSON-lines logs (provenance, HTTP exchanges): one object per line, appended whole.

A kill mid-write leaves a torn last line: readers skip it, and the next append ends it first, so a
later line is never glued to it. Appends take an exclusive `flock` on the file, so writers in
several processes (units on the local executor and its helpers) never interleave lines; the file is
never opened through a symbolic link. A full disk or a read-only folder is one `DataFileError`.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Mapping

from ctrlsim.errors import DataFileError


def read_objects(path: str | Path) -> list[dict[str, Any]]:
    """Every object of the log (none when it does not exist); a torn last line is skipped, a damaged
    line before it is a `DataFileError` naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    objects = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            if n >= len(lines) - 1:  # the last line, cut short by a kill
                continue
            raise DataFileError(path, f"line {n} is not JSON: {line[:80]!r}") from None
        if not isinstance(value, dict):
            raise DataFileError(path, f"line {n} is not an object")
        objects.append(value)
    return objects


def append_object(path: str | Path, value: Mapping[str, Any], *, sync: bool = True) -> None:
    """Append `value` as one line (credentials cut out, keys sorted), under an exclusive lock."""
    from ctrlsim.redact import redact_secrets

    path = Path(path)
    data = (redact_secrets(json.dumps(value, sort_keys=True, default=str)) + "\n").encode("utf-8")
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataFileError(path, f"cannot be written ({exc.strerror or exc}); what was stored before is "
                                  "kept, and the same command resumes") from None
