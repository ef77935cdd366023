"""The HTTP contract between ctrlsim and a recommender behind an API (docs/http-recommenders.md).

One schema, used three ways: `ctrlsim serve` builds its FastAPI routes (and so its OpenAPI document)
from these models, the client (`ctrlsim.recommenders.http.client`) validates every response against them,
and tests check a served box against the published document.

Endpoints, relative to the box's base URL (`http://host:port/path`):

    GET  /health               {"status": "ok", "box": {...}, "modes": [...], "items": n}
    POST /recommend            stateless: a batch of user states -> one ranked list per state
    POST /accounts             stateful: create (or reset) accounts with their starting state
    POST /feedback             stateful: like / shown events for accounts
    POST /accounts/recommend   stateful: top-k for accounts the service keeps the state of
    POST /accounts/delete      stateful: forget accounts (deleting an unknown one is not an error)

Stateless requests carry everything a `UserState` holds (history, profile, attributes, items already
shown, optional candidate pool), plus whether to exclude the history and mask shown items. In the
stateful mode the service keeps each account's state: the likes sent as feedback, and what it has
shown (its own recommendations; items shown elsewhere, such as search results, arrive as "shown"
events). Creating an account that exists starts it fresh. Item ids are strings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CONTRACT_VERSION = "1"
MAX_BATCH = 10_000  # states, accounts or events in one request
MAX_K = 100_000
ItemId = str

ENDPOINTS = {
    "health": "/health",
    "recommend": "/recommend",
    "accounts": "/accounts",
    "feedback": "/feedback",
    "account_recommend": "/accounts/recommend",
    "delete_accounts": "/accounts/delete",
}
MODES = ("stateless", "stateful")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class State(_Strict):
    """One user as a stateless request describes them (a `UserState`)."""

    history: list[ItemId] = Field(default_factory=list, description="liked items, oldest first")
    profile: str | None = Field(default=None, description="natural-language profile, if any")
    attributes: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    shown: list[ItemId] = Field(default_factory=list, description="items already shown to the user")
    candidates: list[ItemId] | None = Field(default=None, description="rank only these items")


class RecommendRequest(_Strict):
    states: list[State] = Field(min_length=1, max_length=MAX_BATCH)
    k: int = Field(ge=1, le=MAX_K)
    exclude_history: bool = True
    mask_shown: bool = False


class RankedList(_Strict):
    items: list[ItemId] = Field(description="best first; no duplicates; at most k")
    scores: list[float] | None = Field(default=None, description="one per item, higher is better")


class RecommendResponse(_Strict):
    lists: list[RankedList]


class Account(_Strict):
    account: str = Field(min_length=1, max_length=256)
    history: list[ItemId] = Field(default_factory=list)
    profile: str | None = None
    attributes: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    exclude_history: bool = True
    mask_shown: bool = False


class AccountsRequest(_Strict):
    accounts: list[Account] = Field(min_length=1, max_length=MAX_BATCH)


class AccountsResponse(_Strict):
    accounts: list[str]


class Event(_Strict):
    account: str = Field(min_length=1, max_length=256)
    item: ItemId
    type: Literal["like", "shown"]


class FeedbackRequest(_Strict):
    events: list[Event] = Field(min_length=1, max_length=MAX_BATCH)


class FeedbackResponse(_Strict):
    accepted: int


class AccountRecommendRequest(_Strict):
    accounts: list[str] = Field(min_length=1, max_length=MAX_BATCH)
    k: int = Field(ge=1, le=MAX_K)


class DeleteAccountsRequest(_Strict):
    accounts: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class DeleteAccountsResponse(_Strict):
    deleted: list[str] = Field(description="the accounts that existed and are gone now")


class Health(_Strict):
    status: Literal["ok"]
    contract: str = CONTRACT_VERSION
    modes: list[Literal["stateless", "stateful"]]
    box: dict[str, str | int | float | bool | None | list | dict] = Field(default_factory=dict)
    items: int | None = None


class Problem(_Strict):
    """An error response body (HTTP 4xx/5xx)."""

    detail: str
