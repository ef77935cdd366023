"""Gymnasium / PettingZoo environments (installed as `ctrlsim.envs`).

Importing this module registers the envs with Gymnasium:
`gymnasium.make("ctrlsim/TargetDiscovery-v0", recommender="narm", target="Film-Noir")`
(or without importing first: `gymnasium.make("ctrlsim.envs:ctrlsim/TargetDiscovery-v0")`).
"""
from .engine import ProbeSpec
from .phases import PhasePlan
from .population_env import PopulationEnv
from .probe_env import ProbeEnv
from .registration import ENV_IDS, PROBE_ENV_IDS, register_envs
from .tasks import TASKS, PopularityBias, ProbeRecord, ProfileShaping, TargetDiscovery, Task, make_task

register_envs()

__all__ = ["ENV_IDS", "PROBE_ENV_IDS", "TASKS", "PhasePlan", "PopularityBias", "PopulationEnv", "ProbeEnv",
           "ProbeRecord", "ProbeSpec", "ProfileShaping", "TargetDiscovery", "Task", "make_task",
           "register_envs"]
