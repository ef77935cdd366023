"""Shared fixtures for the whole test suite."""
from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="session")
def ml100k():
    """MovieLens-100K as bundled in the recbole wheel, loaded once per test session.

    Tests must treat it as read-only (the side-table helpers return copies).
    """
    if importlib.util.find_spec("recbole") is None:
        pytest.skip('ml-100k comes from the recbole wheel; install "ctrlsim[recbole]"')
    from ctrlsim.data import load_dataset

    return load_dataset("ml-100k")
