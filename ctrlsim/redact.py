"""Secrets never land on disk or on screen: credentials are cut out of every stored or printed text.

An LLM or recommender spec may carry credentials: `http://user:secret@host/v1`, a query token
(`...?api_key=XYZ`), or an `Authorization: Bearer ...` header quoted in a server's error. Every
writer of a run folder (config.json, records.jsonl, tables.md, artefacts) and every printed error
passes its text through `redact_secrets`, which replaces each such value by `***`. Redaction is
idempotent and leaves text without credentials unchanged, so a run's identity (its stored config)
compares equal on resume, and two specs that differ only in their secret name the same run.
"""
from __future__ import annotations

import re
from typing import Any

MASK = "***"
# scheme://userinfo@  (userinfo: anything up to "@" without a slash, blank or quote)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)([^/\s@\"'<>]+)@")
# ?name=value or &name=value where the name says it is a secret
_SECRET_WORDS = r"(?:token|key|secret|passw(?:or)?d|pwd|auth|signature|sig|credential)"
_SECRET_NAME = rf"[A-Za-z0-9_.\-]*{_SECRET_WORDS}[A-Za-z0-9_.\-]*"
_QUERY = re.compile(rf"([?&;]{_SECRET_NAME}=)([^&#\s\"'<>]+)", re.IGNORECASE)
# Authorization / X-Api-Key style headers, and bare bearer tokens
_HEADER = re.compile(r"((?:authorization|proxy-authorization|x-api-key|api-key)\s*[:=]\s*)"
                     r"(?:(bearer|basic|token)\s+)?([^\s\"',}]+)", re.IGNORECASE)
_BEARER = re.compile(r"\b(bearer\s+)([A-Za-z0-9._~+/=\-]{8,})", re.IGNORECASE)


def redact_secrets(text: str) -> str:
    """`text` with URL userinfo, secret query values, auth headers and bearer tokens replaced by ***."""
    if not isinstance(text, str) or not text:
        return text
    out = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    out = _QUERY.sub(lambda m: f"{m.group(1)}{MASK}", out)
    out = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{MASK}", out)
    return _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", out)


def redact_obj(obj: Any) -> Any:
    """A copy of a JSON-like object with every string (keys included) passed through `redact_secrets`."""
    if isinstance(obj, str):
        return redact_secrets(obj)
    if isinstance(obj, dict):
        return {redact_secrets(k) if isinstance(k, str) else k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj
