"""Atomic file writes: a reader sees the old file or the whole new one, never a half-written one.

Used for every artefact a long run leaves behind (run folders, evolution phases), so a run
killed mid-write never leaves a truncated file that a resume would trust.
"""
from __future__ import annotations

import os
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to a temporary file beside `path`, sync it, then rename it over `path`.

    A full disk or a folder turned read-only is one `DataFileError` naming the path (and the OS's
    reason); the temporary file is removed, and the old file, if any, is left as it was."""
    from ctrlsim.errors import DataFileError

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise DataFileError(path, f"cannot be written ({exc.strerror or exc})") from None
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))
