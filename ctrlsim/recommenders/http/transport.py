"""HTTP transport of the HTTP black boxes: a whole-request deadline, retries with backoff on connection
errors, timeouts and 5xx, 429s waited out (honouring Retry-After), a rate limit, concurrent batches
cancelled on Ctrl-C, and a bearer token read from the environment at each request."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Mapping

from ctrlsim.errors import BackendUnavailableError, CtrlsimError
from ctrlsim.redact import redact_secrets as _shown


class RecommenderResponseError(CtrlsimError, ValueError):
    """A service's response breaks the contract (malformed body, unknown or duplicate items, ...), or
    the service refused the request (a 4xx: `status` says which)."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status


class Transport:
    """POSTs and GETs with a whole-request deadline, retries, throttling waits and a rate limit."""

    def __init__(self, base: str, options: Mapping[str, Any]):
        from ctrlsim.backends.http_deadline import RequestScope

        self.base, self.options = base, options
        self.scope = RequestScope()
        self._client = None
        self._client_lock = threading.Lock()
        self._rate_lock = threading.Lock()
        self._next_start = 0.0
        self.stats = {"requests": 0, "retries": 0, "throttled": 0, "throttle_seconds": 0.0}

    def client(self):
        with self._client_lock:
            if self._client is None:
                from ctrlsim.backends.http_deadline import deadline_client

                self._client = deadline_client(
                    self.scope, verify=self.options["verify"], timeout=self.options["timeout"]
                )
            return self._client

    def _headers(self) -> dict[str, str]:
        token = os.environ.get(self.options["token_env"])
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _wait_for_rate(self) -> None:
        rate = self.options["rate"]
        if not rate:
            return
        with self._rate_lock:
            now = time.monotonic()
            start = max(now, self._next_start)
            self._next_start = start + 1.0 / rate
        if start > now:
            time.sleep(start - now)

    def call(self, method: str, endpoint: str, body: Any = None) -> tuple[int, Any, float]:
        """(status, parsed JSON body, seconds) of a successful exchange; a failure after the retries
        is a `BackendUnavailableError` naming the URL (credentials cut) and the reason."""
        import httpx2

        url = self.base + endpoint
        attempts, throttled_for, began = 0, 0.0, time.perf_counter()
        while True:
            self._wait_for_rate()
            self.stats["requests"] += 1
            reason = ""
            try:
                with self.scope.bounded(self.options["timeout"]):
                    response = self.client().request(method, url, json=body, headers=self._headers())
            except (httpx2.TransportError, OSError) as exc:  # refused, dropped, timed out
                reason = f"{type(exc).__name__}: {exc}"
                response = None
            if response is not None:
                if response.status_code == 429:
                    wait = retry_after(response.headers.get("retry-after"), self._backoff(attempts))
                    if throttled_for + wait <= self.options["throttle_wait"]:
                        self.stats["throttled"] += 1
                        self.stats["throttle_seconds"] += wait
                        throttled_for += wait
                        time.sleep(wait)
                        continue
                    limit = self.options["throttle_wait"]
                    reason = f"HTTP 429 for {throttled_for:.0f} s (throttle_wait {limit:g} s)"
                elif response.status_code >= 500:
                    reason = f"HTTP {response.status_code}: {response.text[:200]}"
                elif response.status_code >= 400:
                    raise RecommenderResponseError(
                        f"{_shown(url)} refused the request with HTTP {response.status_code}: "
                        f"{_shown(response.text[:300])}",
                        status=response.status_code,
                    )
                else:
                    try:
                        return response.status_code, response.json(), time.perf_counter() - began
                    except ValueError:
                        raise RecommenderResponseError(
                            f"{_shown(url)} answered with a body that is not JSON: "
                            f"{_shown(response.text[:200])!r}"
                        ) from None
            if attempts >= self.options["retries"] or reason.startswith("HTTP 429"):
                raise BackendUnavailableError(
                    f"recommender service {_shown(url)} failed after {attempts + 1} attempt(s): "
                    f"{_shown(reason)}"
                )
            self.stats["retries"] += 1
            time.sleep(self._backoff(attempts))
            attempts += 1

    def _backoff(self, attempt: int) -> float:
        return min(self.options["max_backoff"], self.options["backoff"] * 2**attempt)

    def map(self, fn, items: list) -> list:
        from ctrlsim.backends.http_deadline import concurrent_map

        return concurrent_map(fn, items, self.options["concurrency"], self.scope, on_interrupt=self.reset)

    def reset(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
            self._client = None

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k != "scope"}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["base"], state["options"])  # type: ignore[misc]
        self.stats = state["stats"]


def retry_after(header: str | None, default: float) -> float:
    """Seconds a 429's Retry-After asks for (a number of seconds or an HTTP date)."""
    if not header:
        return default
    try:
        return max(0.0, float(header))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
        except (TypeError, ValueError):
            return default
