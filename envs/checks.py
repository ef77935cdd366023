"""Argument checks every ctrlsim env applies before it does any work.

Each check raises `ConfigError` naming the argument and the offending value (an unsupported
render mode is only warned about, as Gymnasium does), so a bad
`reset(seed=-1)` or `l_init=(5, 2)` is a clear typed error rather than a numpy or
Gymnasium traceback from deep inside a draw; `check_reset` raises `ResetNeededError`
for a step (or render) with no episode to act on.
"""
from __future__ import annotations

import numbers
from typing import Any, Mapping, TypeVar

from ctrlsim.errors import ConfigError, ResetNeededError

T = TypeVar("T")


def check_render_mode(render_mode: str | None, metadata: Mapping[str, Any],
                      env_name: str = "the env") -> None:
    """`render_mode` is None or a string. A mode the env's metadata does not declare is warned
    about, as `gymnasium.make` does for one (and the env's `render()` then returns None), so
    clients that ask for a mode and fall back (SB3's `make_vec_env` asks for "rgb_array") keep
    working. A non-string mode is a `ConfigError`."""
    modes = list(metadata.get("render_modes", []))
    if render_mode is None:
        return
    if not isinstance(render_mode, str):
        raise ConfigError(f"render_mode must be None or one of {modes}, got {render_mode!r}")
    if render_mode not in modes:
        import gymnasium

        gymnasium.logger.warn(f"{env_name} is being initialised with render_mode={render_mode!r}, which it "
                              f"does not support (supported: {modes}); its render() will return None")


def check_seed(seed: object) -> int | None:
    """A reset seed is None or a non-negative integer (numpy integers too; not bool, not float).
    Returns it as a Python int, which is what Gymnasium's seeding accepts."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigError(f"seed must be a non-negative integer or None, "
                          f"got {seed!r} ({type(seed).__name__})")
    if seed < 0:
        raise ConfigError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


def check_l_init(l_init: object) -> tuple[int, int]:
    """The seed-history length range (low, high) with 1 <= low <= high, as plain ints."""
    low: object
    high: object
    try:
        low, high = l_init  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ConfigError(f"l_init must be a pair (low, high), got {l_init!r}") from None
    if not (isinstance(low, numbers.Integral) and isinstance(high, numbers.Integral)) \
            or isinstance(low, bool) or isinstance(high, bool):
        raise ConfigError(f"l_init must hold two integers, got {l_init!r}")
    if not 1 <= int(low) <= int(high):
        raise ConfigError(f"l_init must satisfy 1 <= low <= high, got {tuple(l_init)!r}")  # type: ignore[arg-type]
    return int(low), int(high)


def check_options(options: Mapping[str, Any] | None, known: tuple[str, ...]) -> dict[str, Any]:
    """`reset` options as a dict. An unknown key (a typo such as "rooster") gets a warning:
    PettingZoo's API test passes arbitrary options, so refusing them would break the contract,
    but a silently ignored typo would run the default roster unnoticed."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"reset options must be a dict, got {options!r}")
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        import gymnasium

        gymnasium.logger.warn(f"ignoring unknown reset option(s) {', '.join(map(repr, unknown))}; "
                              f"known: {list(known)}")
    return dict(options)


def check_positive_int(name: str, value: object) -> int:
    """A count such as `slate_size`, `budget` or `n_agents`: an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_reset(episode: T | None, call: str = "step", *, ended: bool = False) -> T:
    """The episode `call` ("step", "render") acts on. `ResetNeededError` when there is none
    (`episode` is None: never reset) or it is over (`ended`: a one-step env after its step)."""
    if episode is None or ended:
        why = "the env has not been reset" if episode is None else "the episode has ended"
        raise ResetNeededError(f"{why}: call reset() before {call}()")
    return episode
