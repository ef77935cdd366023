"""Resolve Hugging Face hub ids: local cache first, then the hub only if it answers.

Without this, loading an uncached hub id on an offline machine spends a minute
in retries before failing.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from ctrlsim.errors import ModelNotFoundError

HUB_HOST = "huggingface.co"


def hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


def cached_snapshot(name: str) -> str | None:
    """Local folder of `name` in the Hugging Face cache, or None (never touches the network)."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure here just means "not in the local cache"
        return None


def resolve_model(name: str, *, offline_default: str = "") -> str:
    """A local path for `name`: itself if it is a folder, else its snapshot in the HF cache,
    else `name` unchanged when the hub is reachable (the library downloads it)."""
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    local = cached_snapshot(name)
    if local:
        return local
    if hub_reachable():
        return name
    hint = f"; the offline default is {offline_default!r}" if offline_default else ""
    raise ModelNotFoundError(
        f"model {name!r} is not a local folder, not in the Hugging Face cache, and the hub ({HUB_HOST}) "
        f"cannot be reached{hint}")
