"""Gymnasium / PettingZoo environments (installed as ctrlsim.envs)."""
