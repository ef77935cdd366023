"""Probe policies, interventions and evolution (installed as `ctrlsim.agents`).

The public names load on first access (PEP 562): importing one light submodule, such
as `ctrlsim.agents.steering`, must not pull in the LLM probe and through it the envs
and Gymnasium (most of a second of import time on a fully cached run).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the eager form, for type checkers and IDEs only
    from .llm_probe import DecisionSettings, LLMPopulationPolicy
    from .methods import METHODS, MethodContext, MethodSpec, Population, register_method
    from .persona import Persona
    from .population import EpisodeTrace, ProbeTrace, play_population
    from .profiles import ProfileGenerator, ProfileSettings
    from .random_probe import RandomProbe, TargetSeekingProbe

# public name -> submodule that defines it
_SOURCES = {
    "DecisionSettings": "llm_probe", "LLMPopulationPolicy": "llm_probe",
    "METHODS": "methods", "MethodContext": "methods", "MethodSpec": "methods", "Population": "methods",
    "register_method": "methods",
    "Persona": "persona",
    "EpisodeTrace": "population", "ProbeTrace": "population", "play_population": "population",
    "ProfileGenerator": "profiles", "ProfileSettings": "profiles",
    "RandomProbe": "random_probe", "TargetSeekingProbe": "random_probe",
}

__all__ = ["METHODS", "DecisionSettings", "EpisodeTrace", "LLMPopulationPolicy", "MethodContext",
           "MethodSpec",
           "Persona", "Population", "ProbeTrace", "ProfileGenerator", "ProfileSettings", "RandomProbe",
           "TargetSeekingProbe", "play_population", "register_method"]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{source}", __name__), name)
    globals()[name] = value  # later look-ups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
