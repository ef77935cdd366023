"""The Prosocial Ranking Challenge (PRC) ranker schema, as published in the `ranking-challenge` package,
version 3.4.0 (PyPI; `ranking_challenge/request.py` and `response.py`, MIT licence).

The package itself is not a dependency: it requires FastAPI unpinned and prometheus-client at install
time, and keeps pydantic behind an extra. These models reproduce its fields, types and defaults (its
models ignore unknown fields, as pydantic does by default, and so do these). The survey a PRC router
adds is kept as a plain object: ctrlsim neither sends nor reads one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Optional, Union

from pydantic import BaseModel, Field, HttpUrl, NonNegativeInt

PRC_SCHEMA_VERSION = "3.4.0"  # the ranking-challenge release these models follow
PRC_LATENCY_OBJECTIVE_MS = 500.0  # the challenge's p95 latency objective for one /rank request
RANK_PATH = "/rank"


class TwitterEngagements(BaseModel):
    retweet: NonNegativeInt
    like: NonNegativeInt
    comment: NonNegativeInt
    share: NonNegativeInt


class RedditEngagements(BaseModel):
    upvote: Optional[NonNegativeInt] = None
    downvote: Optional[NonNegativeInt] = None
    score: Optional[int] = None
    comment: NonNegativeInt
    award: NonNegativeInt


class FacebookEngagements(BaseModel):
    like: NonNegativeInt
    love: NonNegativeInt
    care: NonNegativeInt
    haha: NonNegativeInt
    wow: NonNegativeInt
    sad: NonNegativeInt
    angry: NonNegativeInt
    comment: NonNegativeInt
    share: NonNegativeInt


class ContentItem(BaseModel):
    """A content item to be ranked."""

    id: str
    original_rank: Optional[NonNegativeInt] = None
    post_id: Optional[str] = None
    parent_id: Optional[str] = None
    title: Optional[str] = None
    text: str
    author_name_hash: str
    type: Literal["post", "comment"]
    embedded_urls: Optional[list[HttpUrl]] = Field(description="required, may be null")
    created_at: datetime
    engagements: Union[TwitterEngagements, RedditEngagements, FacebookEngagements]
    language: Optional[str] = None


class Session(BaseModel):
    """Data scoped to the user's browsing session."""

    session_id: str
    user_id: str
    user_name_hash: str
    cohort: Optional[str] = None
    cohort_index: Optional[NonNegativeInt] = None
    platform: Literal["twitter", "reddit", "facebook"]
    url: HttpUrl
    current_time: datetime
    prefetch: Optional[bool] = False


class RankingRequest(BaseModel):
    session: Session
    survey: Optional[dict] = None
    items: list[ContentItem]


class NewItem(BaseModel):
    id: Optional[str] = None
    url: HttpUrl


class RankingResponseMetadata(BaseModel):
    intervention_on: Optional[bool] = None


class RankingResponse(BaseModel):
    ranked_ids: list[str] = Field(description="the ids of the content items, in the order to display them")
    new_items: Optional[list[NewItem]] = None
    metadata: Optional[RankingResponseMetadata] = None
