"""Token accounting: every LLM call adds its prompt and completion tokens here."""
from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import asdict, dataclass


@dataclass
class Usage:
    """Token totals. `cached_calls` counts calls answered from the response cache
    (their tokens are still counted, so a resumed run reports the same totals)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cached_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict:
        return {**asdict(self), "total_tokens": self.total_tokens}


class TokenMeter:
    """Thread-safe token totals, overall and per key (a probe id, a protocol stage, ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = Usage()
        self._by_key: dict[str, Usage] = defaultdict(Usage)

    def add(self, prompt_tokens: int, completion_tokens: int, *, key: str | None = None,
            cached: bool = False) -> None:
        with self._lock:
            targets = [self._total] + ([self._by_key[str(key)]] if key is not None else [])
            for usage in targets:
                usage.prompt_tokens += int(prompt_tokens)
                usage.completion_tokens += int(completion_tokens)
                usage.calls += 1
                usage.cached_calls += int(cached)

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
