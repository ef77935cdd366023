"""Gymnasium registration of the ctrlsim environments (idempotent).

`gymnasium.make` builds envs from model SPECS: the black box, dataset and LLM are given
by name (`recommender="narm"`, `llm="qwen2.5-0.5b"`), never as live objects, so an env's
`spec` stays plain data that `env.spec.to_json()` writes and `gymnasium.make(env.spec)`
re-makes (Gymnasium deep-copies spec kwargs when it re-makes an env). Live objects
(a loaded `LLM`, a shared `Recommender`, a `TokenMeter`) go to the env classes'
constructors directly.
"""
from __future__ import annotations

import dataclasses
import importlib
import numbers
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from ctrlsim.errors import ConfigError

_PROBE = "ctrlsim.envs.probe_env:ProbeEnv"

# id -> (env class, default kwargs). The probe envs' defaults are the protocols' evaluation setting:
# search off unless asked (`allow_search=True`), so an RL library's random rollouts and checkers see the
# recommender's slates, not search results for sampled query strings.
ENV_SPECS = {
    "ctrlsim/TargetDiscovery-v0": (_PROBE, {"task": "target-discovery", "allow_search": False}),
    "ctrlsim/ProfileShaping-v0": (_PROBE, {"task": "profile-shaping", "allow_search": False}),
    "ctrlsim/PopularityBias-v0": (_PROBE, {"task": "popularity-bias", "allow_search": False}),
    "ctrlsim/SteerEval-v0": ("ctrlsim.envs.steereval_env:SteerEvalEnv", {}),
    "ctrlsim/PromptShift-v0": ("ctrlsim.envs.promptshift_env:PromptShiftEnv", {}),
}
ENV_IDS = tuple(ENV_SPECS)
PROBE_ENV_IDS = tuple(i for i, (entry, _) in ENV_SPECS.items() if entry == _PROBE)  # multi-round envs


def check_plain_data(value: Any, where: str, hint: str = "") -> None:
    """`value` is JSON-like data: None, bool, number, str, or lists/tuples/dicts of them.
    Otherwise a `ConfigError` naming `where` and the object's type (plus `hint`)."""
    if value is None or isinstance(value, (bool, numbers.Number, str)):
        return
    if isinstance(value, (list, tuple)):
        for n, item in enumerate(value):
            check_plain_data(item, f"{where}[{n}]", hint)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where} has a non-string key {key!r}{hint}")
            check_plain_data(item, f"{where}[{key!r}]", hint)
        return
    raise ConfigError(f"expected plain data (names, paths, numbers), not a live object: "
                      f"{where} is a {type(value).__name__}{hint}")


def plain_value(value: Any) -> Any:
    """`value` with numpy scalars (np.int64, np.float32, np.bool_, np.str_) and arrays replaced by
    Python values, inside lists, tuples and dicts too (their types kept): `gymnasium.make`
    accepts `slate_size=np.int64(3)` and the env's spec still writes to JSON."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(plain_value(v) for v in value)
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {plain_value(k): plain_value(v) for k, v in value.items()}
    return value


class PlainSpec:
    """Mixin for `gymnasium.Env` subclasses: `env.spec` keeps its kwargs as plain Python values.

    `gymnasium.make` stores the kwargs it was given as the env's spec (`env.unwrapped.spec =
    EnvSpec(...)`), numpy scalars included, and `env.spec.to_json()` cannot write an np.int64;
    this setter stores a copy whose kwargs went through `plain_value`, so `to_json()` and
    `gymnasium.make(env.spec)` work."""

    @property
    def spec(self) -> EnvSpec | None:
        return self.__dict__.get("_plain_spec")

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        if isinstance(value, EnvSpec) and value.kwargs:
            value = dataclasses.replace(value, kwargs=plain_value(dict(value.kwargs)))
        self.__dict__["_plain_spec"] = value


MAKE_HINT = (". gymnasium.make takes model specs: give it by name (e.g. recommender='narm', "
             "llm='qwen2.5-0.5b'), or pass the object to the env class's constructor directly")


class SpecEntryPoint:
    """What `gymnasium.make` calls for a ctrlsim id: checks every kwarg is plain data, then
    builds the env class (imported on first use, so registering stays cheap)."""

    def __init__(self, target: str):
        self.target = target

    def env_class(self) -> Any:
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def metadata(self) -> dict:  # gymnasium.make reads it to check render modes
        return self.env_class().metadata

    def __call__(self, **kwargs: Any) -> gym.Env:
        kwargs = plain_value(kwargs)  # numpy scalars as Python values (np.bool_ is not a Number)
        for key, value in kwargs.items():
            check_plain_data(value, key, MAKE_HINT)
        return self.env_class()(**kwargs)

    def __repr__(self) -> str:
        return f"SpecEntryPoint({self.target!r})"


# Module attributes named in the registered entry points ("module:attribute" strings keep
# the spec serialisable).
probe_env = SpecEntryPoint(_PROBE)
steereval_env = SpecEntryPoint("ctrlsim.envs.steereval_env:SteerEvalEnv")
promptshift_env = SpecEntryPoint("ctrlsim.envs.promptshift_env:PromptShiftEnv")
_ENTRY_NAMES = {_PROBE: "probe_env", "ctrlsim.envs.steereval_env:SteerEvalEnv": "steereval_env",
                "ctrlsim.envs.promptshift_env:PromptShiftEnv": "promptshift_env"}


def register_envs() -> None:
    for env_id, (target, kwargs) in ENV_SPECS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=f"{__name__}:{_ENTRY_NAMES[target]}", kwargs=kwargs)
