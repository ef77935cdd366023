"""Small torch helpers shared by the torch-based runtimes (imported lazily)."""
from __future__ import annotations

import contextlib

from ctrlsim.errors import MissingDependencyError


def import_torch(extra: str = "encoders", purpose: str = "torch-based models"):
    """torch, or a MissingDependencyError naming the extra that installs it for `purpose`."""
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError("torch", extra, purpose) from exc
    return torch


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run with `n` intra-op threads, then restore the previous setting (no global side effect)."""
    torch = import_torch()
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def default_device(device: str | None) -> str:
    torch = import_torch()
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"
