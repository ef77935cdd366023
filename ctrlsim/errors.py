"""Every exception ctrlsim raises on purpose, in one place.

Catch `CtrlsimError` to handle any of them; each subclass names one kind of
problem so callers (and tests) can react to exactly that kind.

Failure semantics inside an episode (one rule for every catch site):

* A probe's own deterministic failure -- its LLM reply cannot be parsed (`LLMOutputError`),
  it ran past a budget (`BudgetExceededError`, including a prompt that does not fit the
  model's context, `PromptTooLongError`), it produced an action the env rejects
  (`InvalidAction`), or its policy reported an `AgentFailure` -- is absorbed: the round is
  skipped or the probe dropped, the unit finishes, and the count is in its record. These
  classes are `PROBE_FAILURES`; catch sites write ``except PROBE_FAILURES`` (or call
  `is_probe_failure`) and nothing broader.
* Everything else propagates out of the episode and fails the whole unit, which is then not
  stored, so a rerun retries it: the infrastructure (`BackendUnavailableError`: a server that
  refused or dropped the connection, timed out or answered 5xx after its retries; a server
  answering malformed JSON, `ServerResponseError`; a model that cannot be loaded or found,
  `ModelError` / `ModelNotFoundError`; a dead worker, out-of-memory) and any unexpected
  exception (a bug). A rerun of a deterministic probe failure would fail the same way, which
  is why only those are absorbed.
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


class UnsafeArtefactError(DataFileError):
    """A file ctrlsim was asked to load carries something that would run code when read the usual way
    (a pickled object in a saved policy, a non-tensor in its weights): ctrlsim never runs it and
    refuses the file. The message names the file and the entry."""


class ReplayLogError(DataFileError):
    """A recorded exchange log cannot be trusted for a replay (`--replay`): a line was edited,
    inserted, removed or reordered since it was written (its chain digest no longer follows), or
    lines carry no digest at all (a log recorded before ctrlsim wrote them). Names the log, the
    lines and the flag that replays it anyway (`--replay-unverified`, recorded)."""


class UnverifiedReplayWarning(UserWarning):
    """A replay answers from a log that failed its check, because the user allowed it
    (`--replay-unverified`); the run's provenance records that, and what failed."""


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


class BackendUnavailableError(ModelError):
    """An LLM server or runtime could not be reached or kept failing after its retries (connection
    refused or dropped, a timeout, HTTP 5xx / 429 / 408 / 409); the message names the server and
    the cause. An infrastructure failure: the unit that meets it fails (not stored, so a rerun
    retries it); never a dropped probe or a skipped round."""


class ServerResponseError(ModelError, ValueError):
    """A model server answered with a body that is not the API's JSON (invalid JSON, no `choices`,
    no logprobs where they were asked for). The server's failure, not the probe's: it propagates
    like `BackendUnavailableError` (it is not an `LLMOutputError`)."""


class ModelNotFoundError(ModelError, LookupError):
    """A model spec resolves to nothing; the message says what would provide it."""


class CacheCorruptionWarning(UserWarning):
    """A response or embedding cache file was damaged: it was moved aside (the warning names both
    paths) and a fresh cache started, so its entries are recomputed instead of failing the run.
    Also raised for an entry of a sealed cache (parsed datasets, outputs, digest memo;
    `ctrlsim.cache_seal`) whose seal does not verify, or a cache key others may know. The warning
    names the entry or key, and the entry is built again from its source."""


class CacheLockedError(ConfigError):
    """Another process holds a cache file's write lock for longer than the busy timeout (SQLite waits
    that long first, so brief writes of two runs sharing a cache never fail). The message names the
    file: wait for the other run, or give this run a cache of its own ($CTRLSIM_CACHE, or the run's
    cache option). The unit that meets it fails and is not stored, so a rerun retries it."""

    def __init__(self, path: str | Path, detail: str = ""):
        self.path = str(path)
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"cache file {self.path} is locked by another process{why}: another run is writing it. "
            "Wait for that run to finish, or give this run its own cache (another $CTRLSIM_CACHE "
            "folder or cache path)")


class CacheUnwritableError(ConfigError, OSError):
    """A cache file, or the folder it belongs in, cannot be written (read-only file or folder, a
    file where the folder belongs); the message names the path and what to do. Also an `OSError`,
    so code that treats a cache it cannot write as optional (`except OSError`) goes on without it."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"cache {self.path}: {problem}")


class CacheUnavailableWarning(UserWarning):
    """An optional disk cache (text embeddings) could not be opened because its folder cannot be
    written; the run goes on with an in-memory cache only (nothing is stored between runs)."""


class SlowKernelWarning(UserWarning):
    """A model form chosen for speed has no fast kernel in this llama.cpp build (a BF16 copy on a
    CPU or build without AVX512-BF16): it runs, correctly but slower than the original."""


class DamagedRecordWarning(UserWarning):
    """A line of a run's records.jsonl is not a complete record (hand-edited or damaged): it is
    reported by line and its unit runs again; the line itself is left where it is."""


class TornLineWarning(UserWarning):
    """The last line of an append-only JSON-lines log (provenance, exchanges, costs) was cut short by
    a kill or a full disk: before the next line is appended, its bytes are moved to a file beside the
    log (the warning names it) and the log is cut back to its last whole line, so the torn line is
    never joined to a new one and never turns into a damaged line in the middle of the log."""


class LLMOutputError(ModelError, ValueError):
    """An LLM reply (the model's text) could not be parsed into what the caller needs. A probe
    failure (`PROBE_FAILURES`): the probe skips that round, counted in its record."""

    def __init__(self, problem: str, text: str):
        self.text = text
        snippet = text if len(text) <= 200 else text[:200] + "..."
        super().__init__(f"{problem}; reply was: {snippet!r}")


# --- environments / agents ------------------------------------------------

class BudgetExceededError(CtrlsimError, RuntimeError):
    """A probe acted after its round or token budget was spent (a probe failure: it is dropped)."""


class PromptTooLongError(BudgetExceededError, ConfigError):
    """A probe's prompt does not fit the model's context window: its token budget is exceeded, so
    the probe is dropped (a `BudgetExceededError`); still a `ConfigError` for callers that check
    their prompts up front."""


class AgentFailure(CtrlsimError, RuntimeError):
    """A probe's policy failed on its own (deterministically); the population records it and
    drops the probe. Raise it from a policy only for such failures, never for infrastructure."""


class InvalidAction(CtrlsimError, ValueError):
    """An env action that does not fit the action space; the message names the offending value.
    A probe failure: the population drops the probe that sent it."""


class ResetNeededError(CtrlsimError, RuntimeError):
    """An env was stepped (or rendered) before its first `reset()`."""


#: The probe-deterministic failures: the only exceptions an episode absorbs (a skipped round or
#: a dropped probe, counted in the record). Everything else -- `BackendUnavailableError`,
#: `ServerResponseError`, other `ModelError`s, `ConfigError`, any non-ctrlsim exception --
#: propagates and fails the unit. `LLMOutputError` is a `ModelError` but is listed here;
#: `ServerResponseError` is a `ModelError` that is not.
PROBE_FAILURES: tuple[type[CtrlsimError], ...] = (LLMOutputError, BudgetExceededError, InvalidAction,
                                                  AgentFailure)


def is_probe_failure(exc: BaseException) -> bool:
    """Whether `exc` is a probe's own deterministic failure (`PROBE_FAILURES`), which an episode
    absorbs; any other exception must propagate and fail the unit."""
    return isinstance(exc, PROBE_FAILURES)


# --- runs / executors -----------------------------------------------------

class ExecutorError(CtrlsimError, RuntimeError):
    """An executor could not start or reach its workers (e.g. no Ray cluster at the address)."""


class ExposedServiceError(ConfigError):
    """`ctrlsim serve` was asked to listen on an address other machines can reach without a bearer
    token (refused before the port is bound); the message names the address and the variable."""


class RunLockedError(ConfigError):
    """Another process is writing these run files (a result file, an evolution folder); the
    message names them. Wait for that run to finish, or write somewhere else. Every writer holds
    an exclusive `flock` that the OS drops when the process dies, so a stale lock cannot block."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped a run. What finished before it is stored (records are appended one
    by one), nothing of the unit in flight is, and the same command resumes. A `KeyboardInterrupt`
    (not an `Exception`), so no `except Exception` swallows it and Python callers see an interrupt;
    the CLI prints its one-line message and exits 130."""

    def __init__(self, protocol: str, out: str | Path, stored: int):
        self.protocol, self.out, self.stored = protocol, str(out), stored
        super().__init__(f"interrupted: {stored} finished {protocol} unit(s) are stored in {self.out}; "
                         "rerun the same command to resume")
