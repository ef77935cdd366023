"""The audit folder is the audit's own, in the sense a run folder is the run's (`runfolder.RunFolder`).

```
<out>/audit.json      what identifies the audit; written first, it marks the folder as an audit's
<out>/audit.lock      held while an audit writes the folder: a second audit on it is refused
<out>/cost.jsonl      every invocation's cost, appended (`ctrlsim.jsonlines`)
<out>/summary.json    every number of the report; then report.html, rendered from it
<out>/<sub-run>/      the sub-runs' run folders (`<out>/llm=<model>/`: one audit per probe model)
```

An existing folder that holds anything but has no audit.json (a user's folder, another command's
run folder) is refused, naming it, unless `--overwrite`: then everything in it moves, under the
lock, into one new folder beside it (`<out>.previous-<time>`, never over an earlier one), so nothing
of the user's is deleted. Every file is written atomically (a temporary file renamed over it), no
file is written through a symbolic link inside the folder, and a sub-run folder that is a link is
refused too.
"""
from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from ctrlsim.errors import ConfigError, DataFileError, RunLockedError
from ctrlsim.experiments.audit.config import AUDIT_FILE, COST_FILE, REPORT, SUMMARY
from ctrlsim.experiments.runfolder import GuardedFolder

LOCK = "audit.lock"
OWN_FILES = (AUDIT_FILE, COST_FILE, SUMMARY, REPORT)


def is_audit_folder(path: Path) -> bool:
    """Whether `path` holds an audit's marker: audit.json as a regular file (a link is no marker). A
    `--llms` folder written before its top level had one holds per-model audit folders, its report
    and nothing else."""
    try:
        if stat.S_ISREG((path / AUDIT_FILE).lstat().st_mode):
            return True
    except OSError:
        pass
    from ctrlsim.experiments.sensitivity.run import SUBFOLDER_PREFIX

    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    models = [p for p in entries if p.name.startswith(SUBFOLDER_PREFIX) and not p.is_symlink()
              and is_audit_folder(p)]
    return bool(models) and all(p in models or p.name in (REPORT, SUMMARY, LOCK) for p in entries)


class AuditFolder(GuardedFolder):
    """An audit's output folder; holds the audit's lock until `close()` (see the module docstring)."""

    def __init__(self, out: str | Path, *, overwrite: bool = False):
        from ctrlsim.experiments.store import StoreLockedError, _acquire_lock

        self.path = Path(out)
        self.previous: Path | None = None
        self._lock: Any = None
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"audit output {str(self.path)!r} is a file, not a folder")
        if not overwrite and self.path.is_dir():
            self.file(AUDIT_FILE)  # a link planted at the marker is refused as a link
        if not overwrite and self.path.is_dir() and not is_audit_folder(self.path) \
                and any(p.name != LOCK for p in self.path.iterdir()):
            raise ConfigError(f"audit output {str(self.path)!r} is a folder with other files in it, not a "
                              f"ctrlsim audit folder (it has no {AUDIT_FILE}); nothing in it was changed. "
                              "Choose another --out, or pass --overwrite to move its contents into a new "
                              "folder beside it")
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = _acquire_lock(self.file(LOCK))
        except StoreLockedError as exc:
            raise RunLockedError(f"audit folder {str(self.path)!r} is being written by another audit "
                                 f"({exc})") from None
        try:
            if overwrite:
                self._move_previous()
            for name in OWN_FILES:  # a link planted at one is refused now, before anything runs
                self.file(name)
        except BaseException:
            self.close()
            raise

    def _move_previous(self) -> None:
        """Move everything but the held lock into a new folder beside this one (under the lock)."""
        from ctrlsim.experiments.runfolder import move_aside

        self.previous = move_aside(self.path, keep=(LOCK,))

    # ------------------------------------------------------------------ files

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, json.dumps(obj, indent=2, allow_nan=False, default=str) + "\n")

    def remove_report(self) -> None:
        """Remove the report of an earlier audit in this (the audit's own) folder: a folder never
        holds a report beside sub-runs that may now fail."""
        for name in (REPORT, SUMMARY):
            self.file(name).unlink(missing_ok=True)

    def append_cost(self, row: dict) -> None:
        from ctrlsim.jsonlines import append_object

        append_object(self.file(COST_FILE), row)

    def read_costs(self) -> list[dict]:
        """Every invocation's cost in this folder (`cost.jsonl`), oldest first; a torn last line is
        skipped, an entry without its seconds is a `DataFileError` naming the file."""
        from ctrlsim.jsonlines import read_objects

        path = self.file(COST_FILE)
        rows = read_objects(path)
        for n, row in enumerate(rows, 1):
            if not all(isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                       for k in ("wall_s", "cpu_s")):
                raise DataFileError(path, f"entry {n} is not an invocation's cost (no wall_s and cpu_s "
                                          "in seconds)")
        return rows

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Release the audit's lock (also released when the process ends)."""
        if self._lock is not None:
            import fcntl

            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "AuditFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
