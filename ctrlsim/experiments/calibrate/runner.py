"""The `calibrate` runner: a protocol's probes on boxes of known controllability (see `config`)."""
from __future__ import annotations

from ctrlsim.experiments.calibrate import config, report, units
from ctrlsim.experiments.config import config_to_dict
from ctrlsim.experiments.runner import Runner

RUNNER = Runner(name="calibrate", config_cls=config.CalibrateConfig, description=config.__doc__,
                unit_fn=units.run_unit, decisions=units.decisions, decision_name=units.DECISION,
                plan=units.plan,
                report=report.report, figures=report.figures, check=units.check,
                identity=lambda ctx: config_to_dict(ctx.config),
                extensible=("methods", "dials", "seeds", "compare"), llm_fields=("llm",),
                default_out=config.DEFAULT_OUT, unit_name="units",
                record_fields=("method", "box", "seed", "values"), summary=report.summary,
                presets=config.PRESETS, scores=report.SCORES)

