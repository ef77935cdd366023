"""The evolution loop's artefact folder: atomic JSON/NumPy files plus a ledger of finished phases.

A phase writes its artefacts first and its ledger entry last, so a killed run finds either a
finished phase (entry present: load its artefacts) or an unfinished one (entry absent: run it
again; its LLM calls come back from the response cache). The ledger (`phases.json`) also holds
each phase's wall time and token use. Rosters (`roster_g{g}.json`, `final_roster.json`) are stored
as `roster_to_json` writes them.

One writer at a time: `locked_folder` holds an exclusive, non-blocking `flock` on the folder's
`LOCK_FILE` while a run writes it; a second process gets `RunLockedError` naming the folder.
`EVOLUTION_FORMAT` versions what the loop does, for caches keyed on it.
"""

from __future__ import annotations

import errno
import io
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ctrlsim.atomic import atomic_write_bytes
from ctrlsim.errors import ConfigError, DataFileError, RunLockedError

from ..persona import Persona

LEDGER = "phases.json"
FINAL_ROSTER = "final_roster.json"
LOCK_FILE = ".evolution.lock"

#: The evolution loop's behaviour version, part of every evolution cache key (with the prompt
#: texts and `ctrlsim.__version__`): bump when the loop's behaviour changes (what a phase does, how
#: it seeds, what it writes), so no cached super probes from an older loop are reused.
EVOLUTION_FORMAT = 1


@contextmanager
def locked_folder(path: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on folder `path` (created if missing) for the body of the `with`.

    The lock is a `flock` on `path/LOCK_FILE`, opened without following a symlink and never
    truncated or written; the OS drops it when the process ends, even on SIGKILL. A second
    holder, in this process or another, gets `RunLockedError` at once (no waiting)."""
    import fcntl

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_FILE
    flags = os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock, flags, 0o644)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
        raise ConfigError(f"the lock file {lock} of evolution folder {folder} {why}; remove it") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLockedError(
                f"evolution folder {folder} is being written by another run (it holds {lock}); wait "
                "for that run to finish, or give this one another work dir"
            ) from None
        try:
            yield folder
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def roster_to_json(personas: Sequence[Persona], **extra) -> dict:
    return {**extra, "personas": [p.to_dict() for p in personas]}


def roster_from_json(data: dict) -> list[Persona]:
    return [Persona.from_dict(d) for d in data["personas"]]


class ArtefactFolder:
    """Phase artefacts under one folder (the run folder of `ctrlsim evolve`, or a method's work dir)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        ledger = self.read_json(LEDGER, {"phases": {}})
        if not isinstance(ledger, dict) or not isinstance(ledger.get("phases"), dict):
            raise DataFileError(self.path / LEDGER, "is not an evolution ledger ({\"phases\": {...}})")
        self._ledger: dict[str, dict] = ledger["phases"]
        # What the finished phases were run for; None: not bound (a ledger from before binding).
        self._identity: dict | None = ledger.get("identity")

    def bind(self, identity: dict) -> None:
        """The ledger belongs to `identity` (what the loop's phases depend on): finished phases of
        another identity are never reused (a `ConfigError` names the fields that differ). A ledger
        written before ledgers were bound adopts `identity`."""
        identity = json.loads(json.dumps(identity, sort_keys=True, default=str))
        if self._ledger and self._identity is not None and self._identity != identity:
            fields = sorted(k for k in set(self._identity) | set(identity)
                            if self._identity.get(k) != identity.get(k))
            raise ConfigError(
                f"evolution folder {self.path} holds phases of another run ({LEDGER}; these fields differ: "
                f"{', '.join(fields)}); give this run another folder, or move the old one aside "
                "(ctrlsim evolve --overwrite does)")
        self._identity = identity

    def write_json(self, name: str, obj: Any) -> Path:
        return atomic_write_bytes(
            self.path / name, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()
        )

    def read_json(self, name: str, default: Any = None) -> Any:
        path = self.path / name
        if not path.exists():
            if default is None:
                raise DataFileError(path, "is missing (the phase that writes it has not finished)")
            return default
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataFileError(path, f"is not valid JSON ({exc})") from None

    def write_array(self, name: str, array: np.ndarray) -> Path:
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(array), allow_pickle=False)
        return atomic_write_bytes(self.path / name, buffer.getvalue())

    def read_array(self, name: str) -> np.ndarray:
        return np.load(self.path / name, allow_pickle=False)

    # ------------------------------------------------------------------ ledger
    def done(self, phase: str) -> bool:
        return phase in self._ledger

    def entry(self, phase: str) -> dict:
        return dict(self._ledger[phase])

    def finish(self, phase: str, entry: dict) -> None:
        """Record `phase` as finished (call after its artefacts are written)."""
        self._ledger[phase] = dict(entry)
        bound = {"identity": self._identity} if self._identity is not None else {}
        self.write_json(LEDGER, {"phases": self._ledger, **bound})

    def ledger(self) -> dict[str, dict]:
        return {k: dict(v) for k, v in self._ledger.items()}
