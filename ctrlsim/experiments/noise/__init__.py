"""`ctrlsim noise RUN --out DIR`: the noise floor of a finished run and the smallest effect it can detect.

The run's units are run again into DIR, an ordinary run folder of the same runner, without any
response cache of the original and in another batch layout (`rerun`); the two runs' score rows
(`ctrlsim.experiments.scores`) are compared per observation and per paired test (`report`); the
command line is `command.noise_main`.
"""
from __future__ import annotations

from ctrlsim.experiments.noise.command import NoiseResult, run_noise

__all__ = ["NoiseResult", "run_noise"]
