"""What a run lends the code it runs, through a context variable instead of the environment.

HTTP black boxes record every exchange in the run folder's `exchanges.jsonl` and, with
`--replay RUN`, answer from an earlier run's log. The driver sets these paths for the whole run
(`using_exchange_settings`) and wraps each unit so the paths travel with the unit to wherever it
runs (`unit_with_exchange_settings`: a Ray worker gets them in the task, not from its environment).
No environment variable carries them, so nothing outside a run can switch a box into replay.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class ExchangeSettings:
    """Where HTTP boxes append their exchanges (`log`), and the recorded log they answer from
    (`replay`); both None outside a run. `replay_unverified`: the user allowed a replay log that
    fails its check (`--replay-unverified`)."""

    log: str | None = None
    replay: str | None = None
    replay_unverified: bool = False


NO_RUN = ExchangeSettings()  # frozen: the one value outside any run
_CURRENT: ContextVar[ExchangeSettings | None] = ContextVar("ctrlsim_exchange_settings", default=None)


def current_exchange_settings() -> ExchangeSettings:
    """The settings of the run this code runs in (empty settings outside a run)."""
    return _CURRENT.get() or NO_RUN


@contextmanager
def using_exchange_settings(settings: ExchangeSettings) -> Iterator[None]:
    """Code inside the block (in this thread and context) runs under `settings`."""
    token = _CURRENT.set(settings)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def unit_with_exchange_settings(settings: ExchangeSettings, unit_fn: Callable[[Any, str], dict],
                                payload: Any, key: str) -> dict:
    """`unit_fn(payload, key)` under `settings`; top-level, so `functools.partial(this, settings,
    unit_fn)` pickles to a Ray worker with the settings inside."""
    with using_exchange_settings(settings):
        return unit_fn(payload, key)
