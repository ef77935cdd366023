"""The `train-probe` runner: train a learned probe against one box and target (see `config`)."""
from __future__ import annotations

from ctrlsim.experiments.runner import Runner
from ctrlsim.experiments.train_probe import config, report, units

RUNNER = Runner(name="train-probe", config_cls=config.TrainProbeConfig, description=config.__doc__,
                unit_fn=units.unit, decisions=units.decisions, decision_name=units.DECISION,
                plan=units.plan, check=units.check, prepare=units.prepare,
                report=report.report, figures=report.figures, encoder_fields=("embedding",),
                record_fields=("config", "features", "timesteps"), default_out=config.DEFAULT_OUT,
                unit_name="policies",
                presets=config.PRESETS)

