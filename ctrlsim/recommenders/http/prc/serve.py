"""`make_prc_app(box, dataset=...)`: any ctrlsim black box served as a Prosocial Ranking Challenge ranker
(`ctrlsim serve --contract prc BOX`; docs/prc.md).

`POST /rank` takes a PRC `RankingRequest` and answers a `RankingResponse` ranking every item of the
request. The items must be ids of the catalogue (404 naming the first unknown one, `items[3].id`); an
id given twice is 422. The user the box ranks for is the request's optional `ctrlsim` field (the
contract's `State`: history, profile, shown items, ...), which ctrlsim's PRC box sends and a PRC
ranker ignores; without it, a user with no history, named by the session's `user_id`. The box ranks
the request's items as its candidate pool, with no exclusions: the client chose the pool. `GET
/health` answers without a token and names the schema. The token, `Host` and body-size checks are
`ctrlsim serve`'s (`guard.Guard`).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Sequence

from ctrlsim.data import Dataset
from ctrlsim.errors import CtrlsimError, ModelError, UnknownItemError
from ctrlsim.recommenders.base import Recommender, UserState
from ctrlsim.recommenders.http.contract import Problem, State
from ctrlsim.recommenders.http.guard import Guard, Refused, ServeLimits
from ctrlsim.recommenders.http.prc.schema import (
    PRC_SCHEMA_VERSION,
    RANK_PATH,
    RankingRequest,
    RankingResponse,
)
from ctrlsim.recommenders.http.serve import _fastapi, _identity, _user_state


class CtrlsimRankingRequest(RankingRequest):
    """A PRC `RankingRequest` with ctrlsim's optional extension: the user's state."""

    ctrlsim: State | None = None


def make_prc_app(
    recommender: Recommender,
    *,
    dataset: Dataset,
    token: str | None = None,
    limits: ServeLimits | None = None,
    allowed_hosts: Sequence[str] | None = None,
):
    """A FastAPI app serving `recommender` as a PRC ranker (see the module docstring)."""
    fastapi = _fastapi()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    limits = ServeLimits() if limits is None else limits
    index = dataset.item_index
    identity = _identity(recommender)
    lock = threading.Lock()
    app = fastapi.FastAPI(
        title=f"ctrlsim PRC ranker: {identity.get('recommender', type(recommender).__name__)}",
        version=PRC_SCHEMA_VERSION,
        description="A ctrlsim black box served under the Prosocial Ranking Challenge "
        f"ranker schema (ranking-challenge {PRC_SCHEMA_VERSION}; docs/prc.md).",
    )
    public = [
        p
        for p in ("/health", app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
        if p
    ]
    app.add_middleware(
        Guard, token=token, max_body=limits.max_body, public=public, allowed_hosts=allowed_hosts
    )

    def problem(status: int, detail: str):
        return JSONResponse(Problem(detail=detail).model_dump(), status_code=status)

    @app.exception_handler(Refused)
    def _refused(request, exc: Refused):
        return problem(exc.status, exc.detail)

    @app.exception_handler(RequestValidationError)
    def _invalid(request, exc: RequestValidationError):
        parts = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in exc.errors()[:5]
        ]
        return problem(422, "invalid request: " + "; ".join(parts))

    @app.exception_handler(CtrlsimError)
    def _ctrlsim_error(request, exc: CtrlsimError):
        status = 404 if isinstance(exc, UnknownItemError) else 500 if isinstance(exc, ModelError) else 400
        return problem(status, f"{type(exc).__name__}: {exc}")

    @app.exception_handler(Exception)
    def _unexpected(request, exc: Exception):
        return problem(500, f"internal error in the served box ({type(exc).__name__})")

    errors = {
        code: {"model": Problem, "description": text}
        for code, text in (
            (400, "the box refused the request"),
            (404, "an item id the catalogue lacks (the detail names it)"),
            (413, "a body above the service's limit"),
            (422, "invalid request (schema, an id given twice)"),
            (500, "the box failed"),
        )
    }

    @app.get("/health", operation_id="health", tags=["service"], summary="liveness, the box and the schema")
    def health() -> dict:
        return {
            "status": "ok",
            "contract": "prc",
            "schema": PRC_SCHEMA_VERSION,
            "box": identity,
            "items": len(dataset.items),
        }

    @app.post(
        RANK_PATH,
        operation_id="rank",
        response_model=RankingResponse,
        responses=errors,
        tags=["prc"],
        summary="rank the request's items for the session's user",
    )
    def rank(request: CtrlsimRankingRequest) -> RankingResponse:
        ids = [item.id for item in request.items]
        if len(ids) > limits.max_list:
            raise Refused(
                413,
                f"items holds {len(ids)} entries, above the limit of {limits.max_list} "
                "(ctrlsim serve --max-list)",
            )
        seen: set[str] = set()
        for n, item in enumerate(ids):
            if item not in index:
                raise Refused(404, f"unknown item id {item!r} in items[{n}].id")
            if item in seen:
                raise Refused(422, f"item {item!r} appears twice (items[{n}].id)")
            seen.add(item)
        if not ids:
            return RankingResponse(ranked_ids=[])
        if request.ctrlsim is not None:
            if request.ctrlsim.candidates is not None:
                raise Refused(422, "ctrlsim.candidates: the request's items are the pool")
            state = _user_state(request.ctrlsim)
            for field in ("history", "shown", "not_interested", "disliked"):
                for n, item in enumerate(getattr(state, field)):
                    if item not in index:
                        raise Refused(404, f"unknown item id {item!r} in ctrlsim.{field}[{n}]")
            state = replace(state, user_id=request.session.user_id)
        else:
            state = UserState(user_id=request.session.user_id)
        with lock:
            before = (recommender.exclude_history, recommender.mask_shown)
            recommender.exclude_history, recommender.mask_shown = False, False
            try:
                slate = recommender.recommend([state], len(ids), candidates=[ids])[0]
            finally:
                recommender.exclude_history, recommender.mask_shown = before
        return RankingResponse(ranked_ids=[str(i) for i in slate.item_ids])

    app.state.recommender = recommender
    return app
