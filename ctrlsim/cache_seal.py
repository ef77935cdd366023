"""Seals on cache entries, so that a cache returns only what it wrote itself.

A digest stored beside a cache entry only proves that the entry is whole: whoever edits the bytes
can recompute it. So each cache folder whose entries ctrlsim reads back (the parsed datasets, the
derived outputs, the file-digest memo) holds a secret, `.seal-key`: 32 random bytes, created once
with mode 0600. Every entry is written with a *seal*, an HMAC-SHA256 under that secret of the
entry's key and content. A reader uses an entry only when its seal verifies; an entry that was
edited, replaced, or copied from another key or another cache folder fails, and its cache builds it
again from the source with a `CacheCorruptionWarning` naming it.

The secret is trusted only while nobody else could have read it. A key file that is a symbolic
link, is not a regular file of `KEY_BYTES` bytes, belongs to another user or can be read or
written by group or others is replaced by a fresh key, with a warning; every entry sealed with the
old key is then rebuilt. A key that cannot be read or created is a `CacheUnwritableError` (an
`OSError`). The cache is then not used, because nothing it holds can be verified.

What a seal does not stop: anyone who can read the key (this account, or root) can seal an
entry. It protects against edits by hand, other tools and copied cache folders, but not against
this account itself.
"""
from __future__ import annotations

import errno
import hmac
import os
import secrets
import stat
import warnings
from pathlib import Path

KEY_NAME = ".seal-key"
KEY_BYTES = 32
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class _Untrusted(Exception):
    """The key file exists, but others may know its bytes (the message says why)."""


def _read_key(path: Path) -> bytes:
    """The key's bytes. FileNotFoundError when there is none; _Untrusted when it is not private."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link: its target is someone's file
            raise _Untrusted("a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != KEY_BYTES:
            raise _Untrusted(f"not a {KEY_BYTES}-byte file")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise _Untrusted(f"owned by user {info.st_uid}, not by this user")
        if hasattr(os, "getuid") and info.st_mode & 0o077:
            raise _Untrusted(f"mode {stat.S_IMODE(info.st_mode):04o}, open to group or others")
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:  # the file changed size between fstat and read
        raise _Untrusted(f"not a {KEY_BYTES}-byte file")
    return data


def _new_key(path: Path, replace: bool) -> bytes | None:
    """Write a fresh key at `path` (over an untrusted one when `replace`); None when another process
    created one first (the caller reads that one). A reader never sees a partly written key: the
    bytes go to a private temporary file that is then linked or renamed into place."""
    secret = secrets.token_bytes(KEY_BYTES)
    tmp = path.with_name(f"{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        if os.write(fd, secret) != KEY_BYTES:
            raise OSError(errno.EIO, "short write")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(tmp, path)  # replaces a planted symlink itself, never its target
            return secret
        try:
            os.link(tmp, path)  # create-if-absent, atomically: two first runs agree on one key
        except FileExistsError:
            return None
        except OSError:  # a filesystem without hard links: a rename, unless a key appeared meanwhile
            if os.path.lexists(path):
                return None
            os.rename(tmp, path)
        return secret
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def cache_secret(folder: str | Path) -> bytes:
    """The secret of cache folder `folder` (`folder/.seal-key`), created on first use."""
    from ctrlsim.errors import CacheCorruptionWarning, CacheUnwritableError

    path = Path(folder) / KEY_NAME
    for _ in range(3):  # a key another process creates or replaces meanwhile is read again
        replace = False
        try:
            return _read_key(path)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except _Untrusted as exc:
            warnings.warn(CacheCorruptionWarning(
                f"cache key {path} is {exc}, so others may know it: replaced it with a new key; every "
                "entry sealed with the old one is made again"), stacklevel=3)
            replace = True
        except OSError as exc:
            problem = f"the cache key cannot be read ({exc.strerror or exc})"
            raise CacheUnwritableError(path, problem) from None
        try:
            made = _new_key(path, replace)
        except OSError as exc:
            raise CacheUnwritableError(
                path, f"the cache key cannot be written ({exc.strerror or exc}); without it no entry "
                "can be verified, so the cache is not used") from None
        if made is not None:
            return made
    raise CacheUnwritableError(path, "the cache key kept changing while it was read")


def seal(secret: bytes, *parts: str | bytes) -> str:
    """HMAC-SHA256 under `secret` of `parts`, each length-prefixed (no two lists of parts collide)."""
    mac = hmac.new(secret, digestmod="sha256")
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        mac.update(len(data).to_bytes(8, "big"))
        mac.update(data)  # not concatenated: a dataset's pickle is megabytes
    return mac.hexdigest()


def verify(secret: bytes, stored: object, *parts: str | bytes) -> bool:
    """Whether `stored` is the seal of `parts` under `secret` (compared in constant time)."""
    if not isinstance(stored, str) or not stored.isascii():
        return False
    return hmac.compare_digest(stored, seal(secret, *parts))
