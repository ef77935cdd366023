"""Probe policies, interventions and evolution (installed as `ctrlsim.agents`)."""
from .llm_probe import DecisionSettings, LLMPopulationPolicy
from .methods import METHODS, MethodContext, MethodSpec, Population, register_method
from .persona import Persona
from .population import EpisodeTrace, ProbeTrace, play_population
from .profiles import ProfileGenerator, ProfileSettings
from .random_probe import RandomProbe, TargetSeekingProbe

__all__ = ["METHODS", "DecisionSettings", "EpisodeTrace", "LLMPopulationPolicy", "MethodContext",
           "MethodSpec",
           "Persona", "Population", "ProbeTrace", "ProfileGenerator", "ProfileSettings", "RandomProbe",
           "TargetSeekingProbe", "play_population", "register_method"]
