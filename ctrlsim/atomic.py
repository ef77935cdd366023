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
    tmp = path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _new_temporary(path)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # replaces a link at `path` itself, never writes through it
    except OSError as exc:
        if tmp != path:
            try:
                tmp.unlink()
            except OSError:
                pass
        raise DataFileError(path, f"cannot be written ({exc.strerror or exc})") from None
    return path


def _new_temporary(path: Path) -> tuple[int, Path]:
    """A new temporary file beside `path`, opened for writing: a name nobody can guess in advance,
    created exclusively and never through a symbolic link (a link planted at a predictable name,
    such as one made of the pid, would otherwise send the data into the link's target)."""
    import secrets

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp  # the umask applies, as for any new file
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))
