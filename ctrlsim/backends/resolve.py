"""`resolve_llm` / `resolve_encoder`: one rule for arguments that take a spec string or a live model.

Recommenders, envs and agents accept `llm="qwen2.5-0.5b"` as readily as an `LLM` someone
already built (and shares, with its meter and response cache). A string is loaded with
`load_llm` / `load_encoder` and the load options; a live object is returned as it is and
the load options are ignored (it was configured when it was built). "Live" is duck-typed,
as the callers always were: an `LLM` or anything with a `chat` method, an `Encoder` or
anything with an `encode` method, so test doubles and wrappers pass. Anything else is a
`ConfigError` naming the argument, raised before any loading. Callers that load on first
use run `check_llm_argument` / `check_encoder_argument` at construction, so a wrong type
fails there. (Whether a spec string can load at all is `spec_check.check_llm_spec`'s job.)
"""
from __future__ import annotations

from typing import Any

from ctrlsim.backends.encoders import Encoder, load_encoder
from ctrlsim.backends.llm import LLM
from ctrlsim.backends.specs import load_llm
from ctrlsim.errors import ConfigError


def _live(value: object, cls: type, method: str) -> bool:
    return isinstance(value, cls) or callable(getattr(value, method, None))


def _check(value: Any, argument: str, cls: type, method: str, what: str) -> Any:
    if isinstance(value, str) or _live(value, cls, method):
        return value
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ConfigError(f"{argument} must be {what} (or an object with a `{method}` method), "
                      f"got {type(value).__name__} {shown}")


def check_llm_argument(llm: Any, *, argument: str = "llm") -> Any:
    """`llm` unchanged if `resolve_llm` would take it, else the `ConfigError`; loads nothing
    (for callers that check at construction and load on first use)."""
    return _check(llm, argument, LLM, "chat", "an LLM spec string or an LLM")


def check_encoder_argument(encoder: Any, *, argument: str = "encoder") -> Any:
    """`encoder` unchanged if `resolve_encoder` would take it, else the `ConfigError`; loads nothing."""
    return _check(encoder, argument, Encoder, "encode", "an encoder spec string or an Encoder")


def resolve_llm(llm: Any, *, argument: str = "llm", **load_options: Any) -> LLM:
    """`load_llm(llm, **load_options)` for a spec string, `llm` itself for a live LLM.

    `argument` names the parameter in the `ConfigError` for any other type.
    """
    check_llm_argument(llm, argument=argument)
    return load_llm(llm, **load_options) if isinstance(llm, str) else llm


def resolve_encoder(encoder: Any, *, argument: str = "encoder", **load_options: Any) -> Encoder:
    """`load_encoder(encoder, **load_options)` for a spec string, `encoder` itself for a live encoder.

    `argument` names the parameter in the `ConfigError` for any other type.
    """
    check_encoder_argument(encoder, argument=argument)
    return load_encoder(encoder, **load_options) if isinstance(encoder, str) else encoder


__all__ = ["check_encoder_argument", "check_llm_argument", "resolve_encoder", "resolve_llm"]
