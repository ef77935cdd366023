"""The HTTP contract between ctrlsim and a recommender behind an API (docs/http-recommenders.md).

One schema, used three ways: `ctrlsim serve` builds its FastAPI routes (and so its OpenAPI document)
from these models, the client (`ctrlsim.recommenders.http.client`) validates every response against them,
and tests check a served box against the published document.

Endpoints, relative to the box's base URL (`http://host:port/path`):

    GET  /health               {"status": "ok", "contract": "2", "box": {...}, "modes": [...], "items": n}
    GET  /controls             (version 2) the box's declared controls and what it does with negative feedback
    POST /recommend            stateless: a batch of user states -> one ranked list per state
    POST /accounts             stateful: create (or reset) accounts with their starting state
    POST /feedback             stateful: like / shown (version 2: also not_interested / dislike / block)
    POST /accounts/recommend   stateful: top-k for accounts the service keeps the state of
    POST /accounts/delete      stateful: forget accounts (deleting an unknown one is not an error)

Stateless requests carry everything a `UserState` holds (history, profile, attributes, items already
shown, optional candidate pool; in version 2 also the items marked not interested or disliked, the
blocked tags and the settings of the box's controls), plus whether to exclude the history and mask
shown items. In the stateful mode the service keeps each account's state: the likes (and negative
events) sent as feedback, and what it has shown (its own recommendations; items shown elsewhere, such
as search results, arrive as "shown" events). Creating an account that exists starts it fresh. Item
ids are strings.

Versions are additive: version 2 adds optional fields, event types and `GET /controls` to version 1,
and a service of version n answers the requests of every version up to n. A client reads the
service's version from `/health` (`contract`) and speaks the highest both know
(`ctrlsim.recommenders.http.negotiation`). The version-1 request models stay here (`StateV1`, ...),
so `make_app(..., contract="1")` serves exactly version 1.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CONTRACT_VERSION = "2"
CONTRACT_VERSIONS = ("1", "2")  # what this code speaks, oldest first; each adds to the one before
MAX_BATCH = 10_000  # states, accounts or events in one request
MAX_K = 100_000
ItemId = str
Value = str | int | float | bool | None  # an attribute's or a setting's value

ENDPOINTS = {
    "health": "/health",
    "recommend": "/recommend",
    "accounts": "/accounts",
    "feedback": "/feedback",
    "account_recommend": "/accounts/recommend",
    "delete_accounts": "/accounts/delete",
    "controls": "/controls",
}
GET_ENDPOINTS = ("health", "controls")  # the others are POSTs
SINCE = {"controls": "2"}  # endpoints added after version 1: the version that added them
MODES = ("stateless", "stateful")
NEGATIVE_EVENTS = ("not_interested", "dislike", "block")  # version 2's event types


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ----------------------------------------------------------------------------- version 1's requests
class StateV1(_Strict):
    """One user as a version-1 stateless request describes them."""

    history: list[ItemId] = Field(default_factory=list, description="liked items, oldest first")
    profile: str | None = Field(default=None, description="natural-language profile, if any")
    attributes: dict[str, Value] = Field(default_factory=dict)
    shown: list[ItemId] = Field(default_factory=list, description="items already shown to the user")
    candidates: list[ItemId] | None = Field(default=None, description="rank only these items")


class RecommendRequestV1(_Strict):
    states: list[StateV1] = Field(min_length=1, max_length=MAX_BATCH)
    k: int = Field(ge=1, le=MAX_K)
    exclude_history: bool = True
    mask_shown: bool = False


class AccountV1(_Strict):
    account: str = Field(min_length=1, max_length=256)
    history: list[ItemId] = Field(default_factory=list)
    profile: str | None = None
    attributes: dict[str, Value] = Field(default_factory=dict)
    exclude_history: bool = True
    mask_shown: bool = False


class AccountsRequestV1(_Strict):
    accounts: list[AccountV1] = Field(min_length=1, max_length=MAX_BATCH)


class EventV1(_Strict):
    account: str = Field(min_length=1, max_length=256)
    item: ItemId
    type: Literal["like", "shown"]


class FeedbackRequestV1(_Strict):
    events: list[EventV1] = Field(min_length=1, max_length=MAX_BATCH)


# ----------------------------------------------------------------------------- version 2's requests
class _Negative(_Strict):
    """What version 2 adds to a user's state: explicit negative feedback and control settings."""

    not_interested: list[ItemId] = Field(default_factory=list, description="items marked 'not interested', "
                                                                            "oldest first")
    disliked: list[ItemId] = Field(default_factory=list, description="items disliked, oldest first")
    blocked_tags: list[str] = Field(default_factory=list, description="tags the user asked never to see")
    settings: dict[str, Value] = Field(default_factory=dict,
                                       description="values of the box's declared controls (GET /controls)")


class State(_Negative, StateV1):
    """One user as a stateless request describes them (a `UserState`)."""


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


class Account(_Negative, AccountV1):
    """An account's starting state (settings stay with the account until it is created again)."""


class AccountsRequest(_Strict):
    accounts: list[Account] = Field(min_length=1, max_length=MAX_BATCH)


class AccountsResponse(_Strict):
    accounts: list[str]


class Event(_Strict):
    """A like, a shown item, or (version 2) an item marked not interested or disliked (`item`), or a
    blocked tag (`block`, with `tag` and no `item`)."""

    account: str = Field(min_length=1, max_length=256)
    item: ItemId | None = Field(default=None, description="the item (every type but block)")
    type: Literal["like", "shown", "not_interested", "dislike", "block"]
    tag: str | None = Field(default=None, description="the blocked tag (block only)")

    @model_validator(mode="after")
    def _one_target(self) -> "Event":
        if self.type == "block" and (self.tag is None or self.item is not None):
            raise ValueError("a block event names a tag and no item")
        if self.type != "block" and (self.item is None or self.tag is not None):
            raise ValueError(f"a {self.type} event names an item and no tag")
        return self


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
    contract: str = Field(default=CONTRACT_VERSION, description="the newest contract version the service "
                                                                "speaks (it answers every older one too)")
    modes: list[Literal["stateless", "stateful"]]
    box: dict[str, str | int | float | bool | None | list | dict] = Field(default_factory=dict)
    items: int | None = None


class DeclaredControl(_Strict):
    """One control a box declares (`ctrlsim.recommenders.controls.Control.to_dict`)."""

    name: str
    claim: str = Field(description="what the box says the control does, in its own words")
    property: str = Field(description="the slate property it claims to move: diversity, popularity, novelty")
    direction: Literal["increases", "decreases"] = "increases"
    low: float | None = None
    high: float | None = None
    choices: list[Value] = Field(default_factory=list)
    default: Value = None


class ControlsResponse(_Strict):
    """`GET /controls` (version 2): the user-settable controls the box declares (their values travel in
    each state's `settings`), the settings of its feed not based on profiling, and what the box does
    with negative feedback, in words and as a yes or no."""

    controls: list[DeclaredControl] = Field(default_factory=list)
    non_profiled: dict[str, Value] = Field(default_factory=dict)
    negative_feedback: str
    reads_negative_feedback: bool


class Problem(_Strict):
    """An error response body (HTTP 4xx/5xx)."""

    detail: str


# The request models of each version; the responses are the same in both.
REQUESTS: dict[str, dict[str, type[BaseModel]]] = {
    "1": {"recommend": RecommendRequestV1, "accounts": AccountsRequestV1, "feedback": FeedbackRequestV1},
    "2": {"recommend": RecommendRequest, "accounts": AccountsRequest, "feedback": FeedbackRequest},
}
