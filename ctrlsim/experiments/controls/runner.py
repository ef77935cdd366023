"""The `controls` runner: do the controls a box declares do what they claim? (see `config`)."""
from __future__ import annotations

from ctrlsim.experiments.config import config_to_dict
from ctrlsim.experiments.controls import config, report, units
from ctrlsim.experiments.runner import Runner

RUNNER = Runner(name="controls", config_cls=config.ControlsConfig, description=config.__doc__,
                unit_fn=units.run_unit, decisions=units.decisions, decision_name=units.DECISION,
                plan=units.plan, report=report.report, check=units.check,
                identity=lambda ctx: config_to_dict(ctx.config), extensible=("seeds",),
                default_out=config.DEFAULT_OUT, unit_name="units", record_fields=("seed", "users", "kind"),
                summary=report.summary, presets=config.PRESETS)
