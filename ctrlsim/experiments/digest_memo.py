"""File digests remembered between runs, so a large input (a GGUF, a big dataset) is hashed once.

`file_digest(path)` keeps the SHA-256 of a file's bytes under `$CTRLSIM_CACHE/digests`, next to the
file's (size, mtime, inode, ctime), as git's index does. The memo answers only while all four are
unchanged. A file rewritten in place changes its mtime and ctime. Setting the mtime back
(`touch -d`, `os.utime`) still changes the ctime, which no user call can set.

Two more rules keep a memo from answering for bytes it never saw:

- As in git, a memo that was "racily clean" is not trusted. If it was recorded less than `RACY_NS`
  after the file's mtime, the file may have been written again within the same timestamp (coarse
  filesystem clocks), so it is hashed again. The time of recording is taken before the file is
  stat'ed and read, so a write during hashing also leaves the memo racy.
- Each memo is sealed (`ctrlsim.cache_seal`). A memo edited to name another digest fails its seal:
  a `CacheCorruptionWarning` names it, and the file is hashed again. Memos written before seals
  existed are hashed again quietly.
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from pathlib import Path

from ctrlsim.errors import CacheCorruptionWarning, CtrlsimError

#: A memo recorded less than this long after its file's mtime is "racily clean" and not trusted. Some
#: filesystems keep mtimes to 1-2 s, and a network share's clock may differ a little from this one.
RACY_NS = 2_000_000_000


def _memo_path(path: Path) -> Path | None:
    try:
        from ctrlsim.backends.bundled import cache_dir

        return cache_dir("digests") / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")
    except OSError:
        return None


def _memo_fields(path: Path, stamp: list[int], sha256: str, recorded_ns: int) -> str:
    return json.dumps({"path": str(path), "stat": stamp, "sha256": sha256, "recorded_ns": recorded_ns},
                      sort_keys=True)


def _remembered(memo: Path, path: Path, stamp: list[int]) -> str | None:
    """The memo's digest of `path`: only if its seal verifies, it is of this very stat, and it was
    recorded at least RACY_NS after the file's mtime."""
    from ctrlsim.cache_seal import cache_secret, verify

    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        if "seal" not in known:  # absent, or the layout before seals: hashed again, quietly
            return None
        fields = _memo_fields(path, stamp, known["sha256"], known["recorded_ns"])
        if known.get("stat") != stamp or known.get("path") != str(path):
            return None  # the file changed (or another path's memo): the usual miss
        trusted = verify(cache_secret(memo.parent), known["seal"], "digest", fields)
        racy = known["recorded_ns"] - stamp[1] < RACY_NS
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not trusted:
        warnings.warn(CacheCorruptionWarning(f"digest memo {memo} of {path} does not match its seal (edited "
                                             "since it was written): hashing the file again"), stacklevel=3)
        return None
    return None if racy else str(known["sha256"])


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, remembered by (size, mtime_ns, inode, ctime_ns) so a big file is
    hashed once; a racily clean or unsealed memo is not trusted (see the module docstring)."""
    path = Path(path).resolve()
    recorded_ns = time.time_ns()  # before the stat: a write while hashing leaves the memo racy
    stat = path.stat()
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns]
    memo = _memo_path(path)
    known = _remembered(memo, path, stamp) if memo is not None else None
    if known is not None:
        return known
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    value = digest.hexdigest()
    if memo is not None:
        from ctrlsim.atomic import atomic_write_text
        from ctrlsim.cache_seal import cache_secret, seal

        fields = _memo_fields(path, stamp, value, recorded_ns)
        try:
            sealed = {**json.loads(fields), "seal": seal(cache_secret(memo.parent), "digest", fields)}
            atomic_write_text(memo, json.dumps(sealed))
        except (OSError, CtrlsimError):  # an unwritable cache: the memo only saves time
            pass
    return value
