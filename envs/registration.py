"""Gymnasium registration of the ctrlsim environments (idempotent)."""
from __future__ import annotations

import gymnasium as gym

_PROBE = "ctrlsim.envs.probe_env:ProbeEnv"

# id -> (entry point, default kwargs)
ENV_SPECS = {
    "ctrlsim/TargetDiscovery-v0": (_PROBE, {"task": "target-discovery"}),
    "ctrlsim/ProfileShaping-v0": (_PROBE, {"task": "profile-shaping"}),
    "ctrlsim/PopularityBias-v0": (_PROBE, {"task": "popularity-bias"}),
    "ctrlsim/SteerEval-v0": ("ctrlsim.envs.steereval_env:SteerEvalEnv", {}),
    "ctrlsim/PromptShift-v0": ("ctrlsim.envs.promptshift_env:PromptShiftEnv", {}),
}
ENV_IDS = tuple(ENV_SPECS)
PROBE_ENV_IDS = tuple(i for i, (entry, _) in ENV_SPECS.items() if entry == _PROBE)  # multi-round envs


def register_envs() -> None:
    for env_id, (entry_point, kwargs) in ENV_SPECS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=kwargs)
