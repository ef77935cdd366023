"""Probe policies, interventions and evolution (installed as ctrlsim.agents)."""
