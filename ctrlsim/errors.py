"""Every exception ctrlsim raises on purpose, in one place.

Catch `CtrlsimError` to handle any of them; each subclass names one kind of
problem so callers (and tests) can react to exactly that kind.
"""
from __future__ import annotations

from pathlib import Path


class CtrlsimError(Exception):
    """Base class of all ctrlsim errors."""


class ConfigError(CtrlsimError, ValueError):
    """A configuration value is out of range or inconsistent."""


class MissingDependencyError(CtrlsimError, ImportError):
    """An optional dependency is not installed; the message names the extra."""

    def __init__(self, module: str, extra: str, purpose: str = ""):
        self.module = module
        self.extra = extra
        why = f" (needed for {purpose})" if purpose else ""
        super().__init__(
            f"Python package {module!r} is not installed{why}. "
            f'Install it with: pip install "ctrlsim[{extra}]"'
        )


# --- data -----------------------------------------------------------------

class DataError(CtrlsimError, ValueError):
    """A dataset could not be loaded or used."""


class UnknownDatasetError(DataError, KeyError):
    """`load_dataset` was given a name that is neither registered nor a path."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DataFileError(DataError):
    """A data file is missing, empty, or malformed; names the file and the problem."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnknownItemError(DataError, KeyError):
    """An item id is not in the catalogue."""

    def __init__(self, item_ids, dataset: str = ""):
        ids = list(item_ids) if not isinstance(item_ids, str) else [item_ids]
        self.item_ids = ids
        shown = ", ".join(repr(i) for i in ids[:5]) + (" ..." if len(ids) > 5 else "")
        where = f" in dataset {dataset!r}" if dataset else ""
        super().__init__(f"unknown item id(s){where}: {shown}")

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownUserError(DataError, KeyError):
    """A user id is not in the dataset."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class EmptyHistoryError(DataError):
    """An operation needs at least one item in a user's history."""


# --- models ---------------------------------------------------------------

class ModelError(CtrlsimError, RuntimeError):
    """A model (LLM, encoder, recommender) failed."""


class ServerResponseError(ModelError, ValueError):
    """A model server answered with a body that is not the API's JSON (invalid JSON, no `choices`)."""


class ModelNotFoundError(ModelError, LookupError):
    """A model spec resolves to nothing; the message says what would provide it."""


class CacheCorruptionWarning(UserWarning):
    """A response or embedding cache file was damaged: it was moved aside (the warning names both
    paths) and a fresh cache started, so its entries are recomputed instead of failing the run."""


class LLMOutputError(ModelError, ValueError):
    """An LLM reply could not be parsed into what the caller needs."""

    def __init__(self, problem: str, text: str):
        self.text = text
        snippet = text if len(text) <= 200 else text[:200] + "..."
        super().__init__(f"{problem}; reply was: {snippet!r}")


# --- environments / agents ------------------------------------------------

class BudgetExceededError(CtrlsimError, RuntimeError):
    """A probe acted after its round or token budget was spent."""


class AgentFailure(CtrlsimError, RuntimeError):
    """A probe's policy failed; the population records it and drops the probe."""


class InvalidAction(CtrlsimError, ValueError):
    """An env action that does not fit the action space; the message names the offending value."""


class ResetNeededError(CtrlsimError, RuntimeError):
    """An env was stepped (or rendered) before its first `reset()`."""


# --- runs / executors -----------------------------------------------------

class ExecutorError(CtrlsimError, RuntimeError):
    """An executor could not start or reach its workers (e.g. no Ray cluster at the address)."""
