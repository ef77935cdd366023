"""Options of an HTTP black box: the URL's fragment (`#mode=stateful&batch_size=32`) and keyword
options, typed and checked (`ctrlsim.recommenders.http.client` documents each)."""
from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ctrlsim.errors import ConfigError

DEFAULTS: dict[str, Any] = {
    "mode": "stateless",
    "batch_size": 64,
    "concurrency": 4,
    "rate": None,
    "timeout": 30.0,
    "retries": 5,
    "backoff": 0.5,
    "max_backoff": 30.0,
    "throttle_wait": 600.0,
    "token_env": "CTRLSIM_RECOMMENDER_TOKEN",
    "on_invalid": "error",
    "verify": True,
    "exchanges": None,
    "replay": None,
    "replay_unverified": False,
    "account_prefix": "ctrlsim",
}


# Set by the run (or as keyword options), never in the URL: the URL is part of the recorded config,
# and no string in it may switch a box into replay or out of the replay's check.
RUN_ONLY = ("exchanges", "replay", "replay_unverified")


def is_http(name: object) -> bool:
    return isinstance(name, str) and name.startswith(("http://", "https://"))


def parse_http_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """(base URL without the fragment, options from the fragment `#key=value&...`), checked."""
    parts = urlsplit(spec)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"an HTTP black box needs an http(s) URL with a host, got {_shown(spec)!r}")
    options: dict[str, Any] = {}
    for key, value in parse_qsl(parts.fragment, keep_blank_values=True):
        if key not in DEFAULTS or key in RUN_ONLY:
            raise ConfigError(
                f"unknown HTTP box option {key!r} in {_shown(spec)!r}; options: "
                f"{', '.join(k for k in DEFAULTS if k not in RUN_ONLY)}"
            )
        options[key] = value
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), parts.query, ""))
    return base, options


def _shown(url: str) -> str:
    from ctrlsim.redact import redact_secrets

    return redact_secrets(url)


def checked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Fragment strings and keyword options as typed values; bad ones are a `ConfigError`."""
    out = dict(DEFAULTS)
    for key, value in options.items():
        if key not in DEFAULTS:
            raise ConfigError(f"unknown HTTP box option {key!r}; options: {', '.join(DEFAULTS)}")
        out[key] = value

    def number(key: str, kind: type, low: float, high: float, optional: bool = False) -> None:
        value = out[key]
        if optional and value in (None, "", "none"):
            out[key] = None
            return
        try:
            parsed = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"HTTP box option {key} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not low <= parsed <= high or (kind is int and float(value) != parsed):
            raise ConfigError(f"HTTP box option {key} must be in [{low}, {high}], got {value!r}")
        out[key] = parsed

    number("batch_size", int, 1, 10_000)
    number("concurrency", int, 1, 256)
    number("rate", float, 0.001, 100_000, optional=True)
    number("timeout", float, 0.01, 3600)
    number("retries", int, 0, 100)
    number("backoff", float, 0, 60)
    number("max_backoff", float, 0, 3600)
    number("throttle_wait", float, 0, 86_400)
    if out["mode"] not in ("stateless", "stateful"):
        raise ConfigError(f"HTTP box option mode must be stateless or stateful, got {out['mode']!r}")
    if out["on_invalid"] not in ("error", "skip"):
        raise ConfigError(f"HTTP box option on_invalid must be error or skip, got {out['on_invalid']!r}")
    if isinstance(out["verify"], str):
        if out["verify"].lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"HTTP box option verify must be true or false, got {out['verify']!r}")
        out["verify"] = out["verify"].lower() in ("true", "1")
    if not isinstance(out["replay_unverified"], bool):
        raise ConfigError("HTTP box option replay_unverified must be true or false, got "
                          f"{out['replay_unverified']!r}")
    if not isinstance(out["token_env"], str) or not out["token_env"]:
        raise ConfigError(
            f"HTTP box option token_env must name an environment variable, got {out['token_env']!r}"
        )
    return out
