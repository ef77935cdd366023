"""Token accounting: every LLM call adds its prompt and completion tokens here.

A call whose runtime did not report its counts (an OpenAI-compatible server that sends no
`usage`) adds None: it is counted in `Usage.unknown_calls`, its tokens are unknown, and every
total it belongs to is a lower bound that tables show as unknown (`unknown_tokens`), never as 0.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import asdict, dataclass


@dataclass
class Usage:
    """Token totals. `cached_calls` counts calls answered from the response cache
    (their tokens are still counted, so a resumed run reports the same totals). `unknown_calls`
    counts calls whose token counts were not reported (a cached reply of such a call replays the
    same): the totals then hold only the counts that were reported, a lower bound.

    `to_dict()` includes `unknown_calls` only when it is non-zero, so the records of runs where
    every count is known stay byte-identical to those written before the field existed."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cached_calls: int = 0
    unknown_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def known(self) -> bool:
        """Whether every call's counts were reported (the totals are exact, not lower bounds)."""
        return not self.unknown_calls

    def to_dict(self) -> dict:
        out = {**asdict(self), "total_tokens": self.total_tokens}
        if not self.unknown_calls:
            del out["unknown_calls"]
        return out


def unknown_tokens(unknown_calls: int, calls: int | None = None, known: int | float = 0, *,
                   at_least: bool = False) -> str:
    """How a table shows a token figure some of whose calls had no counts: "unknown (3 of 40 calls
    without counts)", or "≥1,234 + unknown (...)" when `known` counted tokens are a lower bound;
    `at_least`: `unknown_calls` is itself a lower bound ("≥3 calls")."""
    of = f" of {calls:,}" if calls is not None else ""
    plural = "s" if (calls if calls is not None else unknown_calls) != 1 or at_least else ""
    note = f"{'≥' if at_least else ''}{unknown_calls:,}{of} call{plural} without counts"
    return f"≥{known:,.0f} + unknown ({note})" if known else f"unknown ({note})"


class TokenMeter:
    """Thread-safe token totals, overall and per key (a probe id, a protocol stage, ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = Usage()
        self._by_key: dict[str, Usage] = defaultdict(Usage)

    def __getstate__(self) -> dict:
        """Pickle / deepcopy: the totals, not the lock (a copy counts on its own from there)."""
        with self._lock:
            state = self.__dict__.copy()
            state["_by_key"] = defaultdict(Usage, {k: Usage(**asdict(v)) for k, v in self._by_key.items()})
            state["_total"] = Usage(**asdict(self._total))
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def add(self, prompt_tokens: int | None, completion_tokens: int | None, *, key: str | None = None,
            cached: bool = False) -> None:
        """One call; a count given as None was not reported: the call is one of `unknown_calls`."""
        unknown = prompt_tokens is None or completion_tokens is None
        with self._lock:
            targets = [self._total] + ([self._by_key[str(key)]] if key is not None else [])
            for usage in targets:
                usage.prompt_tokens += int(prompt_tokens or 0)
                usage.completion_tokens += int(completion_tokens or 0)
                usage.calls += 1
                usage.cached_calls += int(cached)
                usage.unknown_calls += int(unknown)

    @property
    def total(self) -> Usage:
        with self._lock:
            return Usage(**asdict(self._total))

    def usage(self, key: str) -> Usage:
        """Usage charged to `key` (zeros if none)."""
        with self._lock:
            return Usage(**asdict(self._by_key.get(str(key), Usage())))

    def by_key(self) -> dict[str, Usage]:
        with self._lock:
            return {k: Usage(**asdict(v)) for k, v in self._by_key.items()}

    def reset(self) -> None:
        with self._lock:
            self._total = Usage()
            self._by_key.clear()
