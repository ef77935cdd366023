"""`ctrlsim train-probe`: train a learned probe (Stable-Baselines3) against one black box and target.

The run folder holds, besides the driver's files:

    policy.zip, policy.json   the trained policy and what it was trained on (`ctrlsim.agents.rl`)
    learning_curve.csv        one row per training episode: timesteps, return, Coverage
    figures/learning_curve.png

The folder is then a ctrlbench method: `ctrlsim ctrlbench --methods random,oracle,rl:<out>`.
Training is one unit ("policy"), run by the driver: a rerun of a finished folder trains nothing,
an interrupted one trains again from the start (training takes minutes). Needs the `rl` extra.
"""
from __future__ import annotations

from ctrlsim.agents.rl import TrainProbeConfig  # noqa: F401 - the config lives with the trainer

DEFAULT_OUT = "results/train-probe"
POLICY_KEY = "policy"
ROLLING = 50  # episodes in the learning curve's moving average


# `--preset smoke`: the smallest real run of this runner (the smallest bundled LLM, a handful of
# units): what the runner contract test and a first try use.
SMOKE_PRESET: dict = {"recommender": "popularity", "timesteps": 64, "n_steps": 32, "budget": 4}
PRESETS = {"smoke": SMOKE_PRESET}
