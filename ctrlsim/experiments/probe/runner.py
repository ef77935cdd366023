"""The `probe` runner: random probes against one black box, and the ceiling (see `config`)."""
from __future__ import annotations

from ctrlsim.experiments.probe import config, report, units
from ctrlsim.experiments.runner import Runner

RUNNER = Runner(name="probe", config_cls=config.ProbeRunConfig, description=config.__doc__,
                unit_fn=units.run_unit, decisions=units.decisions, decision_name=units.DECISION,
                plan=units.plan, report=report.report, figures=report.figures,
                check=units.check, identity=config.identity,
                from_identity=config.from_identity, default_out="results/probe",
                presets=config.PRESETS)

