"""Gymnasium registration of the ctrlsim environments (idempotent)."""
from __future__ import annotations

import gymnasium as gym

ENV_IDS = {
    "ctrlsim/TargetDiscovery-v0": {"task": "target-discovery"},
    "ctrlsim/ProfileShaping-v0": {"task": "profile-shaping"},
    "ctrlsim/PopularityBias-v0": {"task": "popularity-bias"},
}


def register_envs() -> None:
    for env_id, kwargs in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="ctrlsim.envs.probe_env:ProbeEnv", kwargs=kwargs)
