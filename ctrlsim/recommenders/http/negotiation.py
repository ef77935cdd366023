"""Which contract version an HTTP black box speaks with its service, and what the service declares.

Contract versions are additive (`ctrlsim.recommenders.http.contract`): a service of version n answers
the requests of every version up to n, so the client speaks the lower of the service's version (the
`contract` of its `/health`; a service that names none speaks version 1) and its own newest. It asks
only when it needs to know: when a state first carries negative feedback or settings, or when
`controls` or `negative_feedback` is read. A state without them is sent exactly as version 1 sends
it, so such runs ask nothing more and their exchange keys stay those of version 1.

- Version 2: the states carry not-interested items, dislikes, blocked tags and settings (the stateful
  mode sends them as events and with the accounts), and `GET /controls` gives the box's declared
  controls and its own statement of what it does with negative feedback.
- Version 1: nothing can carry them. They are left out of every request, the box declares no
  controls, and its `negative_feedback` says they are ignored: the buttons are no-ops, said so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import IGNORES_NEGATIVE_FEEDBACK, UserState
from ctrlsim.recommenders.controls import NO_CONTROLS, Controls
from ctrlsim.recommenders.http.contract import CONTRACT_VERSION
from ctrlsim.recommenders.http.transport import RecommenderResponseError

__all__ = ["IGNORED_BY_V1", "UNRECORDED_HEALTH", "ServiceTerms", "as_sent", "needs_negotiation",
           "spoken_version", "terms_from_controls", "v1_terms"]

IGNORED_BY_V1 = (f"{IGNORES_NEGATIVE_FEEDBACK} (the service speaks HTTP contract version 1, which cannot "
                 "carry them: they are never sent)")
# What a replay assumes when its log holds no /health: a log recorded before clients asked for the
# version, by a client that spoke version 1 only (its requests are version 1's).
UNRECORDED_HEALTH: Mapping[str, Any] = MappingProxyType({"status": "ok", "contract": "1"})


@dataclass(frozen=True)
class ServiceTerms:
    """What a client and its service agreed: the contract version both speak, the controls the box
    declares, and what it does with negative feedback (in words, and whether it reads it at all)."""

    contract: str
    controls: Controls
    negative_feedback: str
    reads_negative_feedback: bool


def v1_terms() -> ServiceTerms:
    return ServiceTerms("1", NO_CONTROLS, IGNORED_BY_V1, False)


def spoken_version(health: Any, where: str) -> str:
    """The version to speak with a service whose `/health` answered `health`; a version that is not a
    positive whole number is a `RecommenderResponseError`."""
    if not isinstance(health, Mapping):
        raise RecommenderResponseError(f"{where}: /health answered {type(health).__name__}, not an object")
    version = health.get("contract", "1")
    if not (isinstance(version, str) and version.isdigit() and int(version) >= 1):
        raise RecommenderResponseError(f"{where}: /health names contract {version!r}, not a version "
                                       "number (\"1\", \"2\", ...)")
    return str(min(int(version), int(CONTRACT_VERSION)))


def terms_from_controls(answer: Any, where: str) -> ServiceTerms:
    """Version-2 terms from a `GET /controls` answer; one that breaks the contract (its schema, or
    controls that `Controls.from_dict` refuses) is a `RecommenderResponseError` naming the field."""
    from pydantic import ValidationError

    from ctrlsim.recommenders.http.contract import ControlsResponse

    try:
        parsed = ControlsResponse.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(body)"
        raise RecommenderResponseError(f"{where}: the /controls answer breaks the contract at '{field}': "
                                       f"{first['msg']}") from None
    try:
        # From the answer as sent (a range's 0 stays 0, not the schema's 0.0).
        controls = Controls.from_dict({"controls": answer.get("controls", []),
                                       "non_profiled": answer.get("non_profiled", {})})
    except (ConfigError, TypeError) as exc:
        raise RecommenderResponseError(f"{where}: the /controls answer declares controls that are not "
                                       f"valid: {exc}") from None
    return ServiceTerms("2", controls, parsed.negative_feedback, parsed.reads_negative_feedback)


def needs_negotiation(states: Sequence[UserState]) -> bool:
    """Whether any state carries something only version 2 can send."""
    return any(s.has_negative_feedback or s.settings for s in states)


def as_sent(state: UserState, contract: str) -> UserState:
    """The state as a service of `contract` can receive it: version 1 drops negative feedback and
    settings."""
    if contract != "1" or not (state.has_negative_feedback or state.settings):
        return state
    return replace(state, not_interested=(), disliked=(), blocked_tags=(), settings={})
