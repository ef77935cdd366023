"""The one run-folder layout every runner writes.

```
<out>/config.json     the run's config (what identifies its results) and the software that ran it
<out>/records.jsonl   one line per finished unit of work; append-only, one locked writer
<out>/tables.md       the paper-style tables, rewritten (atomically) as results come in
<out>/figures/*.png   plots
<out>/<name>.json     other artefacts (rosters, transcripts, ...), each written atomically
```

Rerunning a runner with the same config on the same folder resumes it: units already in
`records.jsonl` are skipped. Only the driver process writes the folder.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ctrlsim.atomic import atomic_write_bytes, atomic_write_text
from ctrlsim.errors import ConfigError
from ctrlsim.redact import redact_secrets

from .cost import FOLDER_LOG
from .provenance import software_versions
from .store import ResultStore, _jsonable, normalised_config

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(figsize: tuple[float, float], nrows: int = 1, ncols: int = 1, *,
               squeeze: bool = True) -> tuple[Figure, Any]:
    """A figure and its axes, like `plt.subplots`, without pyplot.

    pyplot keeps every open figure in a process-wide registry (a figure not closed
    leaks), switches backends, and adds to import time; a bare `Figure` needs none of
    that: `Figure.savefig` renders with Agg by itself. Axes as `Figure.subplots` returns them.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def figure_png(fig) -> bytes:
    """A matplotlib figure as the PNG bytes every run folder stores (120 dpi, tight box).

    Figures from `new_figure` need no closing. One made with pyplot (a caller's own)
    is closed, so pyplot's registry does not keep it alive; pyplot is only ever
    already imported then, never imported here.
    """
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)
    return buffer.getvalue()


RECORDS, LOCK = "records.jsonl", "records.jsonl.lock"
# The run's other append-only logs (`ctrlsim.jsonlines`; provenance.jsonl is appended here, by `file`).
APPENDED_LOGS = (FOLDER_LOG, "exchanges.jsonl")


def artefact_path(folder: Path, name: str) -> Path:
    """The path of `name` inside a folder ctrlsim owns (a run folder, an audit folder); no part of it
    may be a symbolic link, so nothing is written through a link out of the folder."""
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ConfigError(f"artefact name {name!r} must be a relative path inside the run folder")
    path = Path(folder)
    for part in relative.parts:
        path = path / part
        if path.is_symlink():
            from ctrlsim.errors import DataFileError

            raise DataFileError(path, "is a symbolic link; ctrlsim writes nothing through a link out "
                                      "of the run folder (remove the link)")
    return path


def move_aside(folder: Path, keep: tuple[str, ...] = ()) -> Path | None:
    """Move everything in `folder` but `keep` into one new folder beside it (`<folder>.previous-<time>`,
    `-2`, ... never over an earlier one) and return that (None when there was nothing): what
    `--overwrite` does to a folder ctrlsim owns, so nothing in it is ever deleted."""
    from ctrlsim.experiments.store import time_stamp, unique_path

    entries = [p for p in Path(folder).iterdir() if p.name not in keep]
    if not entries:
        return None
    backup = unique_path(Path(folder).with_name(f"{Path(folder).name}.previous-{time_stamp()}"))
    backup.mkdir()
    for entry in entries:
        entry.rename(backup / entry.name)
    return backup


def _own_before_records(entry: Path) -> bool:
    """What may already sit in a run folder before its records exist: the lock, and LLM response
    caches (`llm-cache.sqlite` and its journal files) a caller opened there first."""
    return entry.name == LOCK or (entry.is_file() and ".sqlite" in entry.name)


class GuardedFolder:
    """A folder ctrlsim writes artefacts into (a run folder, an audit folder): every path inside it
    refuses symbolic links, every write is atomic with credentials cut out."""

    path: Path

    def file(self, name: str) -> Path:
        """The path of artefact `name` inside the folder; no part of it may be a symbolic link."""
        return artefact_path(self.path, name)

    def write_text(self, name: str, text: str) -> Path:
        """Write an artefact atomically, with any credentials cut out (`ctrlsim.redact`)."""
        return atomic_write_text(self.file(name), redact_secrets(text))


class RunFolder(GuardedFolder):
    """A run's output folder; holds the records' writer lock until `close()`.

    The folder is the run's own: an existing folder without `records.jsonl` (not a run folder)
    holding anything but SQLite caches is refused unless `overwrite`; with `overwrite` everything
    in it (records, config, tables, figures, rosters, artefacts) moves, under the lock, into one new
    folder beside it (`<out>.previous-<time>`, `-2`, ... never over an earlier one: `previous` says
    where); and nothing is written through a symbolic link inside it."""

    def __init__(self, out: str | Path, config: dict, *, overwrite: bool = False,
                 extensible: tuple[str, ...] = (), about: dict | None = None,
                 record_fields: tuple[str, ...] = (), resolved: dict | None = None,
                 allow_code_change: bool = False, provenance: Mapping[str, Any] | None = None,
                 notes: Mapping[str, Any] | None = None):
        """`resolved`: the values the runner gave to config fields left open; with the code version
        and the digests of the inputs it is the run's provenance (`ctrlsim.experiments.provenance`),
        checked on resume (`allow_code_change` lets a resume run on other code, and records that).
        `provenance`: the entry of records made elsewhere, recorded instead of this process's own (a
        merge of run folders records its sources', `ctrlsim.experiments.report`). `notes`: more of what
        produced the run, recorded beside its entry (the exchange log a replay answered from)."""
        self.path = Path(out)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"output {str(self.path)!r} is a file, not a folder")
        if not overwrite and self.path.is_dir() and not (self.path / RECORDS).exists() \
                and any(not _own_before_records(p) for p in self.path.iterdir()):
            raise ConfigError(f"output {str(self.path)!r} is a folder with other files in it, not a ctrlsim "
                              "run folder (it has no records.jsonl); choose another --out, or pass "
                              "--overwrite to move its contents into a new folder beside it")
        self.path.mkdir(parents=True, exist_ok=True)
        self.previous: Path | None = None
        self.provenance: dict = {}

        def under_lock() -> None:  # before the store reads or extends anything
            if overwrite:
                self._move_previous_run()
            for log in APPENDED_LOGS:  # appended to later, by name: a link planted at one is refused now
                self.file(log)
            self.provenance = self._check_provenance(normalised_config(config), resolved, allow_code_change,
                                                     provenance, notes)

        self.store = ResultStore(self.path / RECORDS, config, extensible=extensible, on_locked=under_lock,
                                 record_fields=record_fields)
        # The store normalises the config; after an extension it is the union of stored and asked-for.
        self.config = self.store.config
        # `about`: what else config.json says of the run (the runner's name, open choices).
        self.write_json("config.json", {**(about or {}), "config": self.config,
                                        "provenance": self.provenance, "software": software_versions()})

    def _check_provenance(self, config: dict, resolved: dict | None, allow_code_change: bool,
                          given: Mapping[str, Any] | None = None,
                          notes: Mapping[str, Any] | None = None) -> dict:
        """This run's provenance; a folder holding results must have been made with the same inputs,
        resolved defaults and (unless allowed) code. A new or changed entry is appended (under the lock);
        so is one whose notes changed (a replay after a live run, or the other way round).

        Inputs the folder's earlier entries name and this config does not (an extension asked for
        only the new values) are carried over, so a later resume still checks them."""
        from ctrlsim.experiments import provenance as prov
        from ctrlsim.experiments.store import time_stamp

        keys = prov.ENTRY_KEYS
        if given is None:
            now = prov.provenance(config, resolved)
        else:  # records made elsewhere: their entry, not this process's
            now = {k: dict(given.get(k) or {}) for k in keys}
        extra = {k: v for k, v in {**(given or {}), **(notes or {})}.items() if k not in (*keys, "time")}
        # As the log will hold them (JSON, credentials cut), so an unchanged note compares equal.
        extra = json.loads(redact_secrets(json.dumps(extra, sort_keys=True, default=str)))
        log = self.file(prov.PROVENANCE)
        entries = prov.read_entries(log)
        last = {k: entries[-1].get(k) or {} for k in keys} if entries else None
        plain = (*keys, "time", "allowed_code_change")  # what is not a note
        notes_then = {k: v for k, v in entries[-1].items() if k not in plain} if entries else {}
        notes_now = {k: v for k, v in extra.items() if k not in plain}
        allowed: list[str] = []
        if last is not None:
            if self._holds_results():
                allowed = prov.check_resume(str(self.path), last, now, allow_code_change=allow_code_change)
            now["inputs"] = {**last["inputs"], **now["inputs"]}
            now["resolved"] = prov.merged(last["resolved"], now["resolved"])
            if last["code"].get("user_code"):  # user modules carried over as inputs are, and checked later
                now["code"] = {**now["code"], "user_code": {**last["code"]["user_code"],
                                                            **(now["code"].get("user_code") or {})}}
        if last != now or notes_then != notes_now:
            entry = {"time": time_stamp(), **now, **extra}
            allowed = [*extra.get("allowed_code_change", []), *allowed]
            if allowed:
                entry["allowed_code_change"] = allowed
            prov.append_entry(log, entry)
        return {**now, **extra}

    def _holds_results(self) -> bool:
        """Records, or artefacts a resume would reuse (an evolution ledger, rosters, ...)."""
        from ctrlsim.experiments.provenance import PROVENANCE
        from ctrlsim.experiments.store import holds_records

        plain = {RECORDS, LOCK, PROVENANCE, "config.json", "tables.md", "figures"}
        return holds_records(self.path / RECORDS) or any(
            p.name not in plain and not _own_before_records(p) for p in self.path.iterdir())

    def _move_previous_run(self) -> None:
        """Move everything but the held lock into a new folder beside this one (called under the lock)."""
        self.previous = move_aside(self.path, keep=(LOCK,))

    # ------------------------------------------------------------------ artefacts

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, json.dumps(obj, indent=2, default=_jsonable) + "\n")

    def read_json(self, name: str, default: Any = None) -> Any:
        path = self.file(name)
        if not path.exists():
            return default
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            from ctrlsim.errors import DataFileError

            raise DataFileError(path, f"is not valid JSON ({exc})") from None

    def write_tables(self, markdown: str) -> Path:
        return self.write_text("tables.md", markdown.rstrip() + "\n")

    def figure_path(self, name: str) -> Path:
        """Where figure `name` goes (`figures/<name>.png`); write it via `save_figure` to stay atomic."""
        self.file("figures").mkdir(exist_ok=True)
        return self.file(f"figures/{name if name.endswith('.png') else f'{name}.png'}")

    def save_figure(self, fig, name: str) -> Path:
        """Save a matplotlib figure atomically as `figures/<name>.png` (rendered by `figure_png`)."""
        return self.write_figure(name, figure_png(fig))

    def write_figure(self, name: str, png: bytes) -> Path:
        """Write a figure's PNG bytes atomically as `figures/<name>.png`."""
        return atomic_write_bytes(self.figure_path(name), png)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
