"""Probe policies, interventions and evolution (installed as `ctrlsim.agents`)."""
from .random_probe import RandomProbe, TargetSeekingProbe

__all__ = ["RandomProbe", "TargetSeekingProbe"]
