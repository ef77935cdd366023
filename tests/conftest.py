"""Shared fixtures for the whole test suite."""
from __future__ import annotations

import importlib.util

import pytest

from ctrlsim.errors import MissingDependencyError, ModelNotFoundError


@pytest.fixture(scope="session")
def ml100k():
    """MovieLens-100K as bundled in the recbole wheel, loaded once per test session.

    Tests must treat it as read-only (the side-table helpers return copies).
    """
    if importlib.util.find_spec("recbole") is None:
        pytest.skip('ml-100k comes from the recbole wheel; install "ctrlsim[recbole]"')
    from ctrlsim.data import load_dataset

    return load_dataset("ml-100k")



def load_or_skip(spec, **kwargs):
    """Load a bundled LLM; skip only when its optional packages are missing."""
    from ctrlsim.backends import load_llm

    try:
        return load_llm(spec, **kwargs)
    except (MissingDependencyError, ModelNotFoundError) as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smol():
    return load_or_skip("smollm2-135m")


@pytest.fixture(scope="session")
def qwen05():
    return load_or_skip("qwen2.5-0.5b")


@pytest.fixture(scope="session")
def minilm():
    from ctrlsim.backends import load_encoder

    try:
        return load_encoder("minilm", cache=False)
    except (MissingDependencyError, ModelNotFoundError) as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def llm_or_skip():
    """The `load_or_skip` function, for tests that load their own model instance."""
    return load_or_skip
