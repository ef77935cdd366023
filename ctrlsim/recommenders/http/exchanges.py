"""The exchange log of HTTP black boxes: every request and answer of a run as JSON lines, indexed by
the request's logical content, so a repeated request answered differently is detected and a
recorded run can be replayed offline (`ctrlsim.recommenders.http.client`).

Each line carries the digest of its answer (`answer_sha256`) and a chain digest linking it to the
line before (`ctrlsim.jsonlines.CHAIN`), both computed when it is written. A replay answers from a
log only once every line verifies (`ExchangeLog.check_replay`): an answer edited since, a line
inserted, removed or reordered, or lines without digests (a log recorded before ctrlsim wrote them)
are a `ReplayLogError` naming the log and the lines, unless the user replays it anyway
(`--replay-unverified`), which the run's provenance records."""
from __future__ import annotations

import hashlib
import json
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrlsim.errors import CtrlsimError, ReplayLogError, UnverifiedReplayWarning
from ctrlsim.jsonlines import CHAIN, append_object, chain_breaks, read_objects
from ctrlsim.redact import redact_secrets as _shown
from ctrlsim.run_settings import ExchangeSettings

ANSWER = "answer_sha256"
UNVERIFIED_FLAG = "--replay-unverified"
SHOWN = 5  # lines named in a refusal; the rest are counted


class ReplayMissError(CtrlsimError, LookupError):
    """A replayed run asked the service something the recorded run did not."""


class ExchangeChangedWarning(UserWarning):
    """The service answered a request it had answered before (same logical content) differently."""


def exchange_key(base: str, endpoint: str, logical: Any) -> str:
    blob = json.dumps({"url": _shown(base), "endpoint": endpoint, "logical": logical}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def answer_digest(response: Any) -> str:
    """SHA-256 of an answer as the log holds it (JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(response, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _index_of(entries: list[dict[str, Any]]) -> dict[str, Any]:
    index: dict[str, Any] = {}
    for entry in entries:
        if entry.get("key") and "response" in entry:
            index.setdefault(entry["key"], entry["response"])  # the first answer to a key is the one used
    return index


@dataclass(frozen=True)
class LogCheck:
    """What a replay answers from: the log, its SHA-256 and length as read, the last line's chain
    digest, and what failed its check (empty when every line verified)."""

    path: str
    sha256: str
    lines: int
    chain_sha256: str | None
    problems: tuple[str, ...]

    def facts(self) -> dict[str, Any]:
        """The replay as the run's provenance records it."""
        facts: dict[str, Any] = {"path": self.path, "sha256": self.sha256, "lines": self.lines,
                                 "chain_sha256": self.chain_sha256, "verified": not self.problems}
        if self.problems:
            facts["problems"] = list(self.problems)
        return facts

    def refusal(self) -> ReplayLogError:
        return ReplayLogError(self.path, "cannot be trusted for a replay: " + "; ".join(self.problems)
                              + f". Replay it anyway with {UNVERIFIED_FLAG} (recorded in the run's "
                              "provenance), or record the run again")


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:SHOWN]))
    return shown + (f" and {len(numbers) - SHOWN} more" if len(numbers) > SHOWN else "")


def check_log(path: str | Path) -> tuple[LogCheck, list[dict[str, Any]]]:
    """(the check of an exchange log, its entries as checked): each line's answer against the digest
    written with it, and each line's chain digest against the line before (`ctrlsim.jsonlines`)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ReplayLogError(path, "does not exist: there is no recorded exchange to replay") from None
    except OSError as exc:
        raise ReplayLogError(path, f"cannot be read ({exc.strerror or exc})") from None
    entries = read_objects(path, data)
    unchained, broken = chain_breaks(entries)
    edited = [n for n, e in enumerate(entries, 1)
              if ANSWER in e and answer_digest(e.get("response")) != e[ANSWER]]
    problems = []
    if edited:
        first = entries[edited[0] - 1]
        problems.append(f"the answer on line(s) {_lines(edited)} no longer matches the digest written "
                        f"with it (first: {first.get('endpoint')} key {str(first.get('key'))[:12]})")
    broken = [n for n in broken if n not in set(edited)]
    if broken:
        problems.append(f"the chain of digests breaks at line(s) {_lines(broken)} (a line was edited, "
                        "inserted, removed or reordered before or at it)")
    if unchained:
        problems.append(f"{len(unchained)} of {len(entries)} line(s) carry no digest (line(s) "
                        f"{_lines(unchained)}: recorded before ctrlsim wrote digests, or stripped of them)")
    last = entries[-1].get(CHAIN) if entries else None
    check = LogCheck(str(path), hashlib.sha256(data).hexdigest(), len(entries),
                     last if isinstance(last, str) else None, tuple(problems))
    return check, entries


class ExchangeLog:
    """Append-only JSON lines of exchanges (one writer at a time per line: `flock`), indexed by key."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._index: dict[str, Any] | None = None
        self._check: LogCheck | None = None
        self._checked_stat: tuple[int, int] | None = None
        self._warned = False

    def _load(self) -> dict[str, Any]:
        if self._index is None:
            self._index = _index_of(read_exchanges(self.path))
        return self._index

    def check_replay(self, *, unverified: bool = False) -> LogCheck:
        """Check the log (`check_log`; again whenever the file changed since) and answer from exactly
        the entries checked. A log that fails is a `ReplayLogError`, unless `unverified` (then an
        `UnverifiedReplayWarning`, once)."""
        try:
            info = self.path.stat()
            stat: tuple[int, int] | None = (info.st_size, info.st_mtime_ns)
        except OSError:
            stat = None
        with self._lock:
            if self._check is None or stat != self._checked_stat:
                self._check, entries = check_log(self.path)
                self._index, self._checked_stat = _index_of(entries), stat
            check = self._check
        if check.problems:
            if not unverified:
                raise check.refusal()
            if not self._warned:
                self._warned = True
                warnings.warn(UnverifiedReplayWarning(
                    f"replaying {check.path} unverified ({UNVERIFIED_FLAG}): " + "; ".join(check.problems)),
                    stacklevel=3)
        return check

    def answer(self, key: str) -> Any:
        with self._lock:
            return self._load().get(key, MISSING)

    def append(self, entry: dict[str, Any]) -> bool:
        """Append `entry` with its answer's digest, chained to the line before; True when its key was
        answered differently before (`changed`)."""
        # As the line will hold it (JSON, credentials cut), so the digest is of the answer as written.
        entry = json.loads(_shown(json.dumps(entry, sort_keys=True, default=str)))
        if "response" in entry:
            entry[ANSWER] = answer_digest(entry["response"])
        with self._lock:
            key = entry.get("key")
            known = self._load().get(key, MISSING) if key else MISSING
            changed = known is not MISSING and known != entry["response"]
            if changed:
                entry = {**entry, "changed": True}
            if key:
                self._index.setdefault(key, entry["response"])  # type: ignore[union-attr]
            append_object(self.path, entry, sync=False, chained=True)
            return changed


MISSING = object()


def read_exchanges(path: str | Path) -> list[dict[str, Any]]:
    """The entries of an exchange log (a torn last line, from a kill, is skipped)."""
    return read_objects(path)


def replay_notes(settings: ExchangeSettings) -> dict[str, Any]:
    """What a run's replay answers from, for its provenance (`LogCheck.facts`: the log's path, SHA-256,
    length, last chain digest, and whether it verified); empty without a replay. The driver calls it
    before the run folder opens, so a log that fails is one `ReplayLogError` before any unit runs."""
    if settings.replay is None:
        return {}
    return {"replay": log_for(settings.replay).check_replay(unverified=settings.replay_unverified).facts()}


_LOGS: dict[str, ExchangeLog] = {}
_LOGS_LOCK = threading.Lock()


def log_for(path: str) -> ExchangeLog:
    """One `ExchangeLog` per file and process (its index is shared by every box using it); a file
    moved away or replaced since (a new run in the same folder) gets a fresh one.

    The path is made absolute, never resolved: the log is appended to by this very path with
    `O_NOFOLLOW` (`ctrlsim.jsonlines`), so a link planted at it is refused, not followed."""
    absolute = Path(path).expanduser().absolute()
    try:
        identity = f"{absolute}@{absolute.lstat().st_ino}"
    except FileNotFoundError:
        identity = f"{absolute}@new"
    with _LOGS_LOCK:
        log = _LOGS.get(identity)
        if log is None:
            for stale in [k for k in _LOGS if k.startswith(f"{absolute}@")]:
                del _LOGS[stale]
            log = _LOGS[identity] = ExchangeLog(absolute)
        return log
