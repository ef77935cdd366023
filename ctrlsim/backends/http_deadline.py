"""A deadline for a whole HTTP request, and cancellation, under the `openai` client's httpx2 transport.

httpx2's timeouts are per operation: a server that trickles one byte just inside the read timeout
never times out. Here every socket operation of a request (connect, TLS, each write, each read)
gets at most the time left until the request's deadline, so the whole request (connect, send, the
whole response) ends by it with httpx2's own `ReadTimeout` (the client's timeout error, retried like
any timeout). Reads wait in slices of at most `POLL` seconds and check a cancellation event between
them, so a request cancelled from another thread (Ctrl-C in the main thread) ends within `POLL`.

The deadline and the event live in a `RequestScope`, one per client (its per-thread state): the
thread that sends a request sets them around it. `concurrent_map` runs a batch of requests on a
thread pool and, on Ctrl-C, sets the batch's event and leaves without waiting for the pool.
Needs httpx2 (installed with `openai`); the `openai` package itself only for `DeadlineHttpClient`.
"""
from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator, TypeVar

import httpcore2
import httpx2

POLL = 0.25  # seconds a read waits before it looks at the cancellation event again
T = TypeVar("T")
R = TypeVar("R")


class RequestScope(threading.local):
    """Per thread: when the request in flight must end (`time.monotonic()` seconds) and its cancel event."""

    deadline: float | None = None
    cancel: threading.Event | None = None

    @contextmanager
    def bounded(self, seconds: float) -> Iterator[None]:
        """Every socket operation inside ends within `seconds` from now."""
        self.deadline = time.monotonic() + seconds
        try:
            yield
        finally:
            self.deadline = None

    @contextmanager
    def cancellable(self, event: threading.Event) -> Iterator[None]:
        """Requests sent inside end soon after `event` is set."""
        self.cancel = event
        try:
            yield
        finally:
            self.cancel = None

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def limit(self, timeout: float | None, error: type[Exception]) -> float | None:
        """The operation's timeout cut to the time left; `error` once none is left or on cancellation."""
        if self.cancelled:
            raise error("request cancelled")
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise error("the request's deadline passed")
        return left if timeout is None else min(timeout, left)


class _Stream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream, scope: RequestScope):
        self._inner, self._scope = inner, scope

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        waited_until = None if timeout is None else time.monotonic() + timeout
        while True:
            limit = self._scope.limit(timeout, httpcore2.ReadTimeout)
            if waited_until is not None:
                left = waited_until - time.monotonic()
                limit = left if limit is None else min(limit, left)
                if limit <= 0:
                    raise httpcore2.ReadTimeout("timed out")
            step = POLL if limit is None else min(limit, POLL)
            try:
                return self._inner.read(max_bytes, step)
            except httpcore2.ReadTimeout:
                if limit is not None and step >= limit:
                    raise
                # a slice ran out with time left: look at the deadline and the event again

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # Not sliced: a timed-out send cannot say how much of the buffer went out.
        self._inner.write(buffer, self._scope.limit(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname,
                                      self._scope.limit(timeout, httpcore2.ConnectTimeout))
        return _Stream(inner, self._scope)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore2.NetworkBackend):
    """httpcore2's socket backend with every operation bounded by the scope's deadline."""

    def __init__(self, scope: RequestScope, inner: httpcore2.NetworkBackend | None = None):
        self._scope, self._inner = scope, inner or httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options=None) -> httpcore2.NetworkStream:
        timeout = self._scope.limit(timeout, httpcore2.ConnectTimeout)
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _Stream(stream, self._scope)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options=None) -> httpcore2.NetworkStream:
        timeout = self._scope.limit(timeout, httpcore2.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options), self._scope)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _bounded(transport, scope: RequestScope):
    """`transport` with its connection pool opening connections through a `DeadlineBackend`."""
    pool = getattr(transport, "_pool", None)
    if pool is None or not hasattr(pool, "_network_backend"):
        from ctrlsim.errors import ModelError

        raise ModelError(f"this httpx2 version's {type(transport).__name__} has no connection pool whose "
                         "sockets a request deadline can bound; install the version ctrlsim[serve] pins")
    pool._network_backend = DeadlineBackend(scope, pool._network_backend)
    return transport


@lru_cache(maxsize=1)
def _openai_client_class() -> type:
    import openai  # only the OpenAI-compatible runtime needs it

    class DeadlineHttpClient(openai.DefaultHttpxClient):
        """The `openai` client's default httpx2 client (its limits, redirects, proxies from the
        environment), with every connection bounded by `scope` (see the module docstring)."""

        def __init__(self, scope: RequestScope, **kwargs):
            self._scope = scope  # read by the transport hooks below, which the base __init__ calls
            super().__init__(**kwargs)

        def _init_transport(self, *args, **kwargs):
            return _bounded(super()._init_transport(*args, **kwargs), self._scope)

        def _init_proxy_transport(self, *args, **kwargs):
            return _bounded(super()._init_proxy_transport(*args, **kwargs), self._scope)

    return DeadlineHttpClient


def DeadlineHttpClient(scope: RequestScope, **kwargs):  # noqa: N802 - used as the class it builds
    """An `openai` httpx2 client whose requests end by their deadline (`scope`)."""
    return _openai_client_class()(scope, **kwargs)


def deadline_client(scope: RequestScope, *, verify: bool = True, **kwargs) -> httpx2.Client:
    """A plain `httpx2.Client` (TLS verified unless `verify=False`) whose every socket operation is
    bounded by `scope`'s deadline and cancel event, as the OpenAI-compatible client's are."""
    transport = _bounded(httpx2.HTTPTransport(verify=verify), scope)
    return httpx2.Client(transport=transport, **kwargs)


def concurrent_map(fn: Callable[[T], R], items: list[T], max_workers: int, scope: RequestScope, *,
                   on_interrupt: Callable[[], None] = lambda: None) -> list[R]:
    """`[fn(x) for x in items]` on up to `max_workers` threads, results in order. The first error
    cancels the calls not yet started (those running finish, then it is raised). An interrupt in the
    waiting thread (Ctrl-C's `KeyboardInterrupt`, `SystemExit`: not an `Exception`) also cancels the
    requests in flight through `scope`, shuts the pool down without waiting for them, calls
    `on_interrupt()` (close the clients) and propagates at once."""
    if len(items) <= 1 or max_workers == 1:
        return [fn(x) for x in items]  # in this thread: Ctrl-C interrupts its own socket read
    cancel = threading.Event()

    def cancellable(x: T) -> R:
        with scope.cancellable(cancel):
            return fn(x)

    pool = ThreadPoolExecutor(max_workers=min(max_workers, len(items)), thread_name_prefix="ctrlsim-openai")
    # Each call runs in a copy of the caller's context: what a run lends its code
    # (`ctrlsim.run_settings`) reaches the pool's threads too.
    futures = [pool.submit(contextvars.copy_context().run, cancellable, x) for x in items]
    interrupted = False
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
        return [f.result() for f in futures]
    except BaseException as exc:
        interrupted = not isinstance(exc, Exception)
        raise
    finally:
        if interrupted:  # never wait for requests that may take timeout x retries
            cancel.set()
            pool.shutdown(wait=False, cancel_futures=True)
            on_interrupt()
        else:
            pool.shutdown(wait=True, cancel_futures=True)
