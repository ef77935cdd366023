"""Probe-model sensitivity (`--llms A,B,...`): the same run once per probe model (`run`), and how much
the box comparison moves with the model (`report`; docs/statistics.md)."""
from ctrlsim.experiments.sensitivity.run import (
    SensitivityFailedError,
    SensitivityResult,
    drive_across_llms,
    run_across_llms,
)

__all__ = ["SensitivityFailedError", "SensitivityResult", "drive_across_llms", "run_across_llms"]
