"""Comparing a run folder's stored config with the config asked for now.

A run folder holds the records of one config. Asking again with the same config resumes it;
asking with more values in an *extensible* field (seeds, methods, boxes, targets, LLMs) extends
it: the stored config becomes the union and only the new units run. Any other difference would
mix results of two configs, so it is an error that lists just the fields that differ.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ctrlsim.errors import ConfigError

MAX_SHOWN = 8  # differing fields listed in the error; the rest are counted
VALUE_LIMIT = 80  # characters of a value shown


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists and scalars are leaves."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def differing_fields(stored: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Dotted names of the fields whose values differ (or that only one side has), in a stable order."""
    a, b = flatten(stored), flatten(now)
    return [k for k in sorted(set(a) | set(b)) if a.get(k, _MISSING) != b.get(k, _MISSING)]


_MISSING = object()


def _shown(value: Any) -> str:
    text = "(absent)" if value is _MISSING else repr(value)
    return text if len(text) <= VALUE_LIMIT else text[:VALUE_LIMIT] + "..."


def extend_config(stored: Mapping[str, Any], now: Mapping[str, Any], extensible: Iterable[str], *,
                  where: str) -> dict[str, Any]:
    """The config a run folder holds after a run of `now`: `stored` itself, or `stored` with the
    new values of extensible list fields appended. Any other difference is a `ConfigError`."""
    extensible = set(extensible)
    diff = differing_fields(stored, now)
    fixed = [k for k in diff if k not in extensible]
    if fixed:
        a, b = flatten(stored), flatten(now)
        lines = [f"  {k}: stored {_shown(a.get(k, _MISSING))}, now {_shown(b.get(k, _MISSING))}"
                 for k in fixed[:MAX_SHOWN]]
        if len(fixed) > MAX_SHOWN:
            lines.append(f"  ... and {len(fixed) - MAX_SHOWN} more")
        grow = f" (fields that may grow: {', '.join(sorted(extensible))})" if extensible else ""
        raise ConfigError(f"{where} holds results of another config; these fields differ:\n"
                          + "\n".join(lines)
                          + f"\nuse another --out, or --overwrite to set the old records aside{grow}")
    merged = _deep_copy(stored)
    for path in diff:
        old, new = flatten(stored).get(path, []), flatten(now).get(path, [])
        if not isinstance(old, list) or not isinstance(new, list):
            raise ConfigError(f"{where}: field {path} can only grow as a list, got {_shown(new)}")
        _set(merged, path, old + [v for v in new if v not in old])
    return merged


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _set(config: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for name in parents:
        config = config.setdefault(name, {})
    config[last] = value
