"""`make_app(recommender, dataset=...)`: any ctrlsim black box served over the HTTP contract.

`ctrlsim serve BOX` runs this app with uvicorn; tests run it in-process. The routes' request and
response models are those of `ctrlsim.recommenders.http.contract`, so the app's `/openapi.json` is
the contract's published document (docs/http-recommenders.md).

Choices a client can rely on:

* Scores: a list's `scores` are the box's own scores as JSON numbers. JSON has no infinity or NaN,
  so a list holding any non-finite score (a box may rank an item at +inf) is sent with
  `scores: null`; its `items` still carry the ranking. No number is ever made up.
* Errors are `Problem` bodies: an unknown item id is 404 naming the id and the field
  (`states[0].history`), an unknown account 404 naming it; a request the schema rejects or one
  that cannot be served as asked (k larger than the catalogue, an empty candidate pool, an account
  named twice) 422; any other `CtrlsimError` of the box 400 (as is a body that is not UTF-8,
  FastAPI's own answer), except a `ModelError` (the box's model or backend failed: not the
  caller's fault, a retry may succeed) 500, like any unexpected error. Above a limit: 413; a `Host`
  the service does not answer: 400 (both from `guard`).
* Concurrency: uvicorn runs the (synchronous) routes in a thread pool. The box is called under
  one lock, since each call sets the request's `exclude_history` / `mask_shown` on the box and
  restores them afterwards; the account table has a lock of its own, held for the whole of a
  stateful request (read the state, rank, record what was shown), so concurrent requests for
  one account behave as if they ran one after the other. Lock order: accounts, then box.
* Authentication: with `token` set, every contract endpoint but `/health` needs
  `Authorization: Bearer <token>` (401 otherwise; the token is compared in constant time and
  never echoed). The OpenAPI document stays readable without it. The token, the `Host` header and
  the body size are checked by `guard.Guard` before the body is read; the OpenAPI document's
  bearer scheme comes from the routes' own (second) check.
* Bounds (`guard.ServeLimits`): body size, entries per request and per list (413 naming the limit),
  and accounts kept (`accounts.AccountTable`, least recently used evicted).
* Versions: the app speaks contract `contract` (the newest by default) and every version before it.
  A version-1 request is a version-2 one without the new fields, so the routes read every request as
  the newest version. With `contract="1"` the app is a version-1 service exactly (its schemas, its
  `/health`, no `/controls`), which is how the tests stand in for a service that predates version 2.
"""
import hmac
import json
import math
import threading
from contextlib import contextmanager
from typing import Annotated, Iterator, Sequence

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError, CtrlsimError, MissingDependencyError, ModelError, UnknownItemError
from ctrlsim.recommenders.base import Recommender, Slate, UserState
from ctrlsim.recommenders.http.accounts import AccountState, AccountTable
from ctrlsim.recommenders.http.contract import (
    CONTRACT_VERSION,
    CONTRACT_VERSIONS,
    ENDPOINTS,
    REQUESTS,
    SINCE,
    AccountRecommendRequest,
    AccountsRequest,
    AccountsResponse,
    ControlsResponse,
    DeleteAccountsRequest,
    DeleteAccountsResponse,
    FeedbackRequest,
    FeedbackResponse,
    Health,
    Problem,
    RankedList,
    RecommendRequest,
    RecommendResponse,
    State,
)
from ctrlsim.recommenders.http.guard import Guard, Refused, ServeLimits, check_lengths

__all__ = ["make_app", "AccountTable", "ServeLimits", "encode_scores"]

_PURPOSE = "serving a black box over HTTP (ctrlsim serve)"


def _fastapi():
    try:
        import fastapi
    except ImportError as exc:
        raise MissingDependencyError("fastapi", "serve", _PURPOSE) from exc
    return fastapi


def encode_scores(scores) -> list[float] | None:
    """A slate's scores as JSON numbers, or None when any is not finite (JSON has no inf/NaN)."""
    values = [float(s) for s in scores]
    return values if all(math.isfinite(v) for v in values) else None


def _check_known(index: dict, ids: Sequence[str], where: str) -> None:
    missing = [i for i in ids if i not in index]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise Refused(404, f"unknown item id {missing[0]!r} in {where}{more}")


def _identity(recommender: Recommender) -> dict:
    """The box's identity as plain JSON values (what /health reports)."""
    return json.loads(json.dumps(recommender.identity, default=str))


def controls_answer(recommender: Recommender) -> ControlsResponse:
    """What `GET /controls` answers for a box: its declared controls and its negative-feedback statement.
    A box whose declaration does not fit the contract is a `ConfigError` (before the port is bound)."""
    from pydantic import ValidationError

    try:
        declared = json.loads(json.dumps(recommender.controls.to_dict(), default=str))
        return ControlsResponse(**declared, negative_feedback=str(recommender.negative_feedback),
                                reads_negative_feedback=bool(recommender.reads_negative_feedback))
    except (ValidationError, TypeError) as exc:
        raise ConfigError(f"the box's declared controls do not fit the HTTP contract: {exc}") from None


def _user_state(s: State) -> UserState:
    return UserState(history=tuple(s.history), profile=s.profile, attributes=dict(s.attributes),
                     shown=tuple(s.shown), not_interested=tuple(s.not_interested),
                     disliked=tuple(s.disliked), blocked_tags=tuple(s.blocked_tags),
                     settings=dict(s.settings))


def _as_newest(request, kind: str):
    """A request of any version as the newest version's model (versions add optional fields only)."""
    model = REQUESTS[CONTRACT_VERSION][kind]
    return request if isinstance(request, model) else model.model_validate(request.model_dump())


def _accepts(model):
    """Mark a route's body as `model`, this contract version's request model (FastAPI reads the body's
    model from the annotation); the route itself reads every version as the newest."""
    def mark(route):
        route.__annotations__ = {**route.__annotations__, "request": model}
        return route
    return mark


def make_app(recommender: Recommender, *, dataset: Dataset, token: str | None = None,
             limits: ServeLimits | None = None, allowed_hosts: Sequence[str] | None = None,
             contract: str = CONTRACT_VERSION):
    """A FastAPI app serving `recommender` (over `dataset`'s catalogue) by the HTTP contract.

    token: when set, every contract endpoint except `/health` needs `Authorization: Bearer <token>`.
    limits: the bounds on bodies, lists and accounts (`ServeLimits()`'s defaults when None).
    allowed_hosts: the `Host` header values answered (`guard.allowed_hosts_for`); None answers any,
    which suits an in-process client only: `ctrlsim serve` always passes them.
    contract: the newest contract version served ("1" serves exactly version 1: no negative feedback,
    settings or `/controls`).
    Raises `MissingDependencyError` without FastAPI.
    """
    fastapi = _fastapi()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

    if token is not None and not (isinstance(token, str) and token):
        raise ConfigError("token must be None (no authentication) or a non-empty string")
    if contract not in CONTRACT_VERSIONS:
        raise ConfigError(f"contract must be one of {list(CONTRACT_VERSIONS)}, got {contract!r}")
    requests = REQUESTS[contract]
    declared = controls_answer(recommender) if int(contract) >= int(SINCE["controls"]) else None
    own = getattr(recommender, "dataset", dataset)
    if own is not dataset and list(own.item_ids) != list(dataset.item_ids):
        raise ConfigError(f"the box ranks dataset {own.name!r}'s catalogue, not {dataset.name!r}'s")
    index = dataset.item_index
    n_items = len(dataset.items)
    box_lock = threading.Lock()
    limits = ServeLimits() if limits is None else limits
    accounts = AccountTable(limits.max_accounts, limits.max_account_items)
    canonical = {item: item for item in index}  # accounts keep the catalogue's strings, not the requests'
    identity = _identity(recommender)

    app = fastapi.FastAPI(
        title=f"ctrlsim recommender: {identity.get('recommender', type(recommender).__name__)}",
        version=contract,
        description="A ctrlsim black box served over the ctrlsim HTTP contract "
                    "(docs/http-recommenders.md): stateless and stateful modes.")
    # Host, token and body size are checked from the headers, before FastAPI reads the body.
    public = [ENDPOINTS["health"], app.openapi_url, app.docs_url, app.swagger_ui_oauth2_redirect_url,
              app.redoc_url]
    app.add_middleware(Guard, token=token, max_body=limits.max_body, public=[p for p in public if p],
                       allowed_hosts=allowed_hosts)

    # ------------------------------------------------------------------ errors
    def problem(status: int, detail: str):
        return JSONResponse(Problem(detail=detail).model_dump(), status_code=status)

    @app.exception_handler(Refused)
    def _refused(request, exc: Refused):
        return problem(exc.status, exc.detail)

    @app.exception_handler(RequestValidationError)
    def _invalid(request, exc: RequestValidationError):
        errors = exc.errors()
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
                 for e in errors[:5]]
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        return problem(422, "invalid request: " + "; ".join(parts) + more)

    @app.exception_handler(CtrlsimError)
    def _ctrlsim_error(request, exc: CtrlsimError):
        from ctrlsim.redact import redact_secrets

        status = 404 if isinstance(exc, UnknownItemError) else 500 if isinstance(exc, ModelError) else 400
        return problem(status, redact_secrets(f"{type(exc).__name__}: {exc}"))

    @app.exception_handler(Exception)
    def _unexpected(request, exc: Exception):  # a bug: reported, and re-raised by the server to its log
        return problem(500, f"internal error in the served box ({type(exc).__name__})")

    errors = {400: {"model": Problem, "description": "the box refused the request, or the body is not UTF-8"},
              404: {"model": Problem, "description": "an unknown item id or account (the detail names it)"},
              413: {"model": Problem, "description": "a body, a batch or a list above the service's limits"},
              422: {"model": Problem, "description": "invalid request (schema, k larger than the catalogue)"},
              500: {"model": Problem, "description": "the box failed"}}
    if token is not None:
        errors[401] = {"model": Problem, "description": "missing or wrong bearer token"}

    # ------------------------------------------------------------------ auth
    dependencies = []
    if token is not None:
        bearer = HTTPBearer(auto_error=False, description="the token `ctrlsim serve` reads from --token-env")
        expected = token.encode("utf-8")

        def check_token(credentials: Annotated[HTTPAuthorizationCredentials | None,
                                               fastapi.Depends(bearer)]) -> None:
            # Header values arrive decoded as latin-1: encoding back gives the bytes the client sent.
            given = credentials.credentials.encode("latin-1", "replace") if credentials else b""
            if not (credentials and hmac.compare_digest(given, expected)):
                raise fastapi.HTTPException(401, detail="missing or invalid bearer token",
                                            headers={"WWW-Authenticate": "Bearer"})

        dependencies.append(fastapi.Depends(check_token))

    # ------------------------------------------------------------------ the box
    @contextmanager
    def box_flags(exclude_history: bool, mask_shown: bool) -> Iterator[Recommender]:
        with box_lock:
            before = (recommender.exclude_history, recommender.mask_shown)
            recommender.exclude_history, recommender.mask_shown = exclude_history, mask_shown
            try:
                yield recommender
            finally:
                recommender.exclude_history, recommender.mask_shown = before

    def check_k(k: int) -> None:
        if k > n_items:
            raise Refused(422, f"k={k} is larger than the catalogue ({n_items} items)")

    def rank(states: list[UserState], pools: list[list[str] | None], k: int,
             exclude_history: bool, mask_shown: bool) -> list[Slate]:
        """One slate per state; states with a candidate pool and those without go in two box calls."""
        slates: dict[int, Slate] = {}
        whole = [n for n, p in enumerate(pools) if p is None]
        pooled = [(n, p) for n, p in enumerate(pools) if p is not None]
        with box_flags(exclude_history, mask_shown) as box:
            if whole:
                slates.update(zip(whole, box.recommend([states[n] for n in whole], k)))
            if pooled:
                got = box.recommend([states[n] for n, _ in pooled], k, candidates=[p for _, p in pooled])
                slates.update(zip([n for n, _ in pooled], got))
        return [slates[n] for n in range(len(states))]

    def ranked(slate: Slate) -> RankedList:
        return RankedList(items=[str(i) for i in slate.item_ids], scores=encode_scores(slate.scores))

    # ------------------------------------------------------------------ routes
    @app.get(ENDPOINTS["health"], operation_id="health", response_model=Health, tags=["service"],
             summary="liveness, the box's identity, the modes and the catalogue size")
    def health() -> Health:
        return Health(status="ok", contract=contract, modes=["stateless", "stateful"], box=identity,
                      items=n_items)

    if declared is not None:
        @app.get(ENDPOINTS["controls"], operation_id="controls", response_model=ControlsResponse,
                 responses={k: v for k, v in errors.items() if k in (401, 500)},
                 dependencies=dependencies, tags=["service"],
                 summary="the box's declared controls and what it does with negative feedback (version 2)")
        def controls() -> ControlsResponse:
            return declared


    @app.post(ENDPOINTS["recommend"], operation_id="recommend",
              response_model=RecommendResponse, responses=errors,
              dependencies=dependencies, tags=["stateless"],
              summary="top-k for each user state of the batch (stateless)")
    @_accepts(requests["recommend"])
    def recommend(request: RecommendRequest) -> RecommendResponse:
        request = _as_newest(request, "recommend")
        check_lengths(request, limits)
        check_k(request.k)
        states, pools = [], []
        for n, s in enumerate(request.states):
            for field in ("history", "shown", "not_interested", "disliked"):
                _check_known(index, getattr(s, field), f"states[{n}].{field}")
            if s.candidates is not None:
                if not s.candidates:
                    raise Refused(422, f"states[{n}].candidates is empty "
                                        "(omit it to rank the whole catalogue)")
                _check_known(index, s.candidates, f"states[{n}].candidates")
            states.append(_user_state(s))
            pools.append(None if s.candidates is None else list(s.candidates))
        slates = rank(states, pools, request.k, request.exclude_history, request.mask_shown)
        return RecommendResponse(lists=[ranked(s) for s in slates])

    @app.post(ENDPOINTS["accounts"], operation_id="create_accounts",
              response_model=AccountsResponse, responses=errors,
              dependencies=dependencies, tags=["stateful"],
              summary="create accounts, or reset existing ones to a fresh state")
    @_accepts(requests["accounts"])
    def create_accounts(request: AccountsRequest) -> AccountsResponse:
        request = _as_newest(request, "accounts")
        check_lengths(request, limits)
        entries = sum(len(a.history) + len(a.not_interested) + len(a.disliked) + len(a.blocked_tags)
                      for a in request.accounts)
        accounts.check_room(len(request.accounts), entries)
        seen: set[str] = set()
        for n, a in enumerate(request.accounts):
            if a.account in seen:
                raise Refused(422, f"account {a.account!r} appears twice (accounts[{n}])")
            seen.add(a.account)
            for field in ("history", "not_interested", "disliked"):
                _check_known(index, getattr(a, field), f"accounts[{n}].{field}")
        with accounts.lock:  # all checked first: a refused request changes nothing
            for a in request.accounts:
                accounts.reset(a.account, AccountState(
                    history=[canonical[i] for i in a.history], profile=a.profile,
                    attributes=dict(a.attributes), exclude_history=a.exclude_history,
                    mask_shown=a.mask_shown, not_interested=[canonical[i] for i in a.not_interested],
                    disliked=[canonical[i] for i in a.disliked], blocked_tags=list(a.blocked_tags),
                    settings=dict(a.settings)))
        return AccountsResponse(accounts=[a.account for a in request.accounts])

    @app.post(ENDPOINTS["feedback"], operation_id="feedback",
              response_model=FeedbackResponse, responses=errors,
              dependencies=dependencies, tags=["stateful"],
              summary="like, shown and negative events (a like of an item already liked changes nothing)")
    @_accepts(requests["feedback"])
    def feedback(request: FeedbackRequest) -> FeedbackResponse:
        request = _as_newest(request, "feedback")
        check_lengths(request, limits)
        for n, e in enumerate(request.events):
            if e.item is not None:
                _check_known(index, [e.item], f"events[{n}].item")
        with accounts.lock:
            targets = [accounts.get(e.account, f"events[{n}].account") for n, e in enumerate(request.events)]
            with accounts.changing(targets):
                for state, e in zip(targets, request.events):
                    state.record(e.type, canonical[e.item] if e.item is not None else str(e.tag))
        return FeedbackResponse(accepted=len(request.events))

    @app.post(ENDPOINTS["account_recommend"], operation_id="account_recommend",
              response_model=RecommendResponse, responses=errors,
              dependencies=dependencies, tags=["stateful"],
              summary="top-k for accounts; the items returned become shown to them")
    def account_recommend(request: AccountRecommendRequest) -> RecommendResponse:
        check_lengths(request, limits)
        check_k(request.k)
        with accounts.lock:
            targets = [accounts.get(a, f"accounts[{n}]") for n, a in enumerate(request.accounts)]
            states = [t.user_state() for t in targets]
            slates: dict[int, Slate] = {}
            groups: dict[tuple[bool, bool], list[int]] = {}
            for n, t in enumerate(targets):
                groups.setdefault((t.exclude_history, t.mask_shown), []).append(n)
            for (exclude_history, mask_shown), members in groups.items():
                slates.update(zip(members, rank([states[n] for n in members], [None] * len(members),
                                                request.k, exclude_history, mask_shown)))
            lists = [slates[n] for n in range(len(targets))]
            with accounts.changing(targets):  # recorded after every list is ranked
                for t, slate in zip(targets, lists):
                    t.show([canonical.get(i, i) for i in slate.item_ids])
        return RecommendResponse(lists=[ranked(s) for s in lists])

    @app.post(ENDPOINTS["delete_accounts"], operation_id="delete_accounts",
              response_model=DeleteAccountsResponse, responses=errors,
              dependencies=dependencies, tags=["stateful"],
              summary="forget accounts (an unknown one is not an error: it is gone either way)")
    def delete_accounts(request: DeleteAccountsRequest) -> DeleteAccountsResponse:
        check_lengths(request, limits)
        with accounts.lock:
            return DeleteAccountsResponse(deleted=accounts.delete(request.accounts))

    app.state.accounts = accounts
    app.state.limits = limits
    app.state.recommender = recommender
    return app


# ---------------------------------------------------------------------- running a server
def listen(host: str, port: int):
    """A listening TCP socket on (host, port); port 0 picks a free one. `ConfigError` if it cannot bind."""
    import socket

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port must be an integer in 0..65535, got {port!r}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def url_of(sock, host: str) -> str:
    """The base URL a client uses for a socket from `listen` (its real port, even for port 0)."""
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(app, sock) -> None:
    """Serve `app` with uvicorn on the listening `sock` until SIGINT/SIGTERM (then KeyboardInterrupt
    or the signal's default action, as uvicorn re-raises the signal after a graceful shutdown)."""
    try:
        import uvicorn
    except ImportError as exc:
        raise MissingDependencyError("uvicorn", "serve", _PURPOSE) from exc
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
