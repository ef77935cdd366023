"""Shared fixtures for the whole test suite, and the guard of the `llm` mark.

Every test that loads an LLM carries `@pytest.mark.llm`, so `-m "not llm"` really runs without
models. Two checks keep that rule from rotting:

- a test that requests one of `LLM_FIXTURES` without the mark fails at setup, before any model
  loads (whether or not the model is installed on this machine);
- a test that builds a model-backed LLM (llama.cpp, transformers, vLLM) in this process without
  the mark fails at teardown, naming the model: that catches direct `load_llm` calls and runners
  handed a model spec. LLMs loaded in a subprocess are not seen; those tests are marked by hand.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import pytest

from ctrlsim.errors import MissingDependencyError, ModelNotFoundError


def pytest_configure(config):
    """Under pytest-xdist every worker runs its LLMs on one llama.cpp thread, unless the caller chose a
    count: two workers on two cores each asking for every core would oversubscribe them, and
    llama.cpp's threads spin while they wait for each other."""
    if os.environ.get("PYTEST_XDIST_WORKER") and "CTRLSIM_THREADS" not in os.environ:
        os.environ["CTRLSIM_THREADS"] = "1"


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


# --------------------------------------------------------------------------- the `llm` mark
LLM_FIXTURES = frozenset({"smol", "qwen05", "llm_or_skip", "llama_server"})
_LLMS_BUILT: list[str] = []  # model-backed LLMs built since the last test's teardown


def _mark_missing(item, what: str) -> str | None:
    if item.get_closest_marker("llm") is not None:
        return None
    return (f"{item.nodeid} {what} but has no @pytest.mark.llm: add the mark "
            "(the rule and its guard are in tests/conftest.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    wanted = sorted(LLM_FIXTURES & set(getattr(item, "fixturenames", ())))
    problem = _mark_missing(item, f"requests the LLM fixture(s) {wanted}") if wanted else None
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _watch_llm_construction():
    """Record every model-backed LLM built during the session (the runtimes are cheap to import)."""
    from ctrlsim.backends.hf import TransformersLLM
    from ctrlsim.backends.llamacpp.llm import LlamaCppLLM
    from ctrlsim.backends.vllm_backend import VLLMLLM

    def watched(cls):
        original = cls.__init__

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            _LLMS_BUILT.append(f"{type(self).__name__}({self.model_id!r})")

        return __init__

    with pytest.MonkeyPatch.context() as patch:
        for cls in (LlamaCppLLM, TransformersLLM, VLLMLLM):
            patch.setattr(cls, "__init__", watched(cls))
        yield


@pytest.fixture(autouse=True)
def _llm_mark_guard(request):
    yield
    built, _LLMS_BUILT[:] = list(_LLMS_BUILT), []
    problem = _mark_missing(request.node, f"built the LLM(s) {', '.join(built)}") if built else None
    if problem:
        pytest.fail(problem, pytrace=False)
