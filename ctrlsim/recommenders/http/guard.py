"""What stands in front of `ctrlsim serve`'s routes: its limits, the checks made from a request's
headers before a byte of its body is read, and the refusal to listen on the network without a token.

A route's body is read and validated by FastAPI before any dependency of the route runs, so a check
made there comes too late: a client without a token could make the server parse a body of any size
before its 401. `Guard` is an ASGI middleware, outside FastAPI, that decides from the headers alone:

1. the `Host` header must name this service (Starlette's `TrustedHostMiddleware` rules; against DNS
   rebinding, where a web page the user visits reaches a service bound to 127.0.0.1): 400 otherwise;
2. every path but the public ones (`/health`, the OpenAPI document and its pages) needs the bearer
   token: 401 otherwise;
3. a `Content-Length` above the body limit is 413; a body without one (chunked) is read up to the
   limit and cut off there with 413.

Each refusal sent before the body was read closes the connection, so the client stops sending.
Lists inside a body that fits are bounded by `check_lengths` once FastAPI has parsed it (413 too).
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import socket
from typing import Any, Awaitable, Callable, MutableMapping, Sequence

from ctrlsim.errors import ConfigError, ExposedServiceError
from ctrlsim.serve_limits import FLAGS, MIB, ServeLimits  # noqa: F401 - re-exported

__all__ = ["Guard", "Refused", "ServeLimits", "allowed_hosts_for", "check_exposure", "check_lengths"]

class Refused(Exception):
    """A request the service refuses: HTTP `status` with a `Problem` detail."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def check_lengths(request: Any, limits: ServeLimits) -> None:
    """413 naming the field and the limit when a parsed request holds a batch or a list above them."""
    for batch_name in ("states", "accounts", "events"):
        batch = getattr(request, batch_name, None)
        if batch is None:
            continue
        if len(batch) > limits.max_batch:
            raise Refused(413, f"{batch_name} holds {len(batch)} entries, more than this service's limit "
                               f"of {limits.max_batch} ({FLAGS['max_batch']})")
        for n, entry in enumerate(batch):
            for list_name in ("history", "shown", "candidates", "attributes", "not_interested", "disliked",
                              "blocked_tags", "settings"):
                value = getattr(entry, list_name, None)
                if value is not None and len(value) > limits.max_list:
                    raise Refused(413, f"{batch_name}[{n}].{list_name} holds {len(value)} entries, "
                                       f"more than this service's limit of {limits.max_list} "
                                       f"({FLAGS['max_list']})")


# ---------------------------------------------------------------------- where the service listens
def _is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback address (a name that does not resolve is not)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return False
        return bool(infos) and all(_is_loopback(str(info[4][0])) for info in infos)
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def check_exposure(host: str, token_env: str, has_token: bool) -> None:
    """`ExposedServiceError` for a non-loopback `host` without a token: anyone who can reach the port
    could then drive the box and fill the account table. Checked before the port is bound."""
    if not has_token and not _is_loopback(host):
        raise ExposedServiceError(
            f"refusing to listen on {host!r} without a token: that address is reachable from other "
            f"machines. Set ${token_env} to a secret that clients send as a bearer token, or listen on "
            "127.0.0.1 (the default)")


def allowed_hosts_for(host: str, extra: Sequence[str] = ()) -> list[str]:
    """The `Host` header values a service bound to `host` answers: that host, localhost, 127.0.0.1,
    and `extra` (the names clients use to reach it, `--allowed-hosts`). IPv6 literals are bracketed,
    as a `Host` header writes them."""
    def header_form(name: str) -> str:
        name = name.strip().lower()
        return f"[{name}]" if ":" in name and not name.startswith("[") else name

    names = [header_form(h) for h in (host, "localhost", "127.0.0.1", *extra) if h.strip()]
    for name in names:
        if "*" in name[1:] or (name.startswith("*") and name != "*" and not name.startswith("*.")):
            raise ConfigError(f"allowed host {name!r}: a wildcard is '*' or a leading '*.' (*.example.org)")
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------- the middleware
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _problem(status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> list[Message]:
    body = json.dumps({"detail": detail}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"), *headers]
    return [{"type": "http.response.start", "status": status, "headers": head},
            {"type": "http.response.body", "body": body}]


class Guard:
    """ASGI middleware: Host, bearer token and body size, decided before the body is read (module
    docstring). `public`: paths that need no token; `allowed_hosts` None: any Host (in-process use)."""

    def __init__(self, app, *, token: str | None, max_body: int, public: Sequence[str],
                 allowed_hosts: Sequence[str] | None = None):
        self.app = app
        self.expected = token.encode("utf-8") if token is not None else None
        self.max_body = max_body
        self.public = frozenset(public)
        self.allowed_hosts = None if allowed_hosts is None else list(allowed_hosts)
        self._hosts = None
        if allowed_hosts is not None and "*" not in allowed_hosts:
            from starlette.middleware.trustedhost import TrustedHostMiddleware

            # Starlette decides (its parsing of the header and its matching rules); the answer is ours,
            # a Problem body naming the host. The inner app only marks the request as passed.
            async def passed(scope: Scope, receive: Receive, send: Send) -> None:
                scope["ctrlsim.host_ok"] = True

            self._hosts = TrustedHostMiddleware(passed, allowed_hosts=self.allowed_hosts, www_redirect=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; the app has no websocket routes
            await self.app(scope, receive, send)
            return
        refusal = await self._refusal(scope, receive)
        if refusal is not None:
            for message in refusal:
                await send(message)
            return
        body, refusal = await self._read_body(scope, receive)
        if refusal is not None:
            for message in refusal:
                await send(message)
            return
        if body is None:  # the client left before its body was complete
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # afterwards: the disconnect, as usual

        await self.app(scope, replay, send)

    async def _refusal(self, scope: Scope, receive: Receive) -> list[Message] | None:
        headers: dict[bytes, list[bytes]] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.lower(), []).append(value)
        if self._hosts is not None:
            async def discard(message: Message) -> None:
                pass

            await self._hosts(scope, receive, discard)
            if not scope.pop("ctrlsim.host_ok", False):
                given = b", ".join(headers.get(b"host", [])).decode("latin-1")
                names = ", ".join(self.allowed_hosts or ())
                return _problem(400, f"host {given!r} is not one this service answers ({names}; "
                                     "ctrlsim serve --allowed-hosts)")
        if self.expected is not None and scope.get("path") not in self.public:
            sent = headers.get(b"authorization", [])
            scheme, _, credentials = (sent[0] if len(sent) == 1 else b"").partition(b" ")
            if not (scheme.lower() == b"bearer" and hmac.compare_digest(credentials, self.expected)):
                return _problem(401, "missing or invalid bearer token", [(b"www-authenticate", b"Bearer")])
        lengths = headers.get(b"content-length", [])
        if lengths:
            try:
                declared = {int(v) for v in lengths}
            except ValueError:
                declared = {-1}
            if len(declared) != 1 or min(declared) < 0:
                return _problem(400, "the Content-Length header is not one non-negative integer")
            size = declared.pop()
            if size > self.max_body:
                return _problem(413, self._too_large(f"Content-Length {size}"))
        return None

    def _too_large(self, what: str) -> str:
        return (f"request body too large: {what} is more than this service's limit of {self.max_body} bytes "
                f"({self.max_body / MIB:g} MiB; ctrlsim serve --max-body-mb)")

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes | None, list[Message] | None]:
        """The whole body, read up to the limit (a chunked body is cut off there: 413)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None, _problem(413, self._too_large(f"a streamed body past {size} bytes"))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None
