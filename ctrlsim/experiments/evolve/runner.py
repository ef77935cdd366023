"""The `evolve` runner: the evolutionary loop, then the evaluation (see `config` for the run folder)."""
from __future__ import annotations

from ctrlsim.experiments.evolve import config, loop, report, units
from ctrlsim.experiments.runner import Runner

RUNNER = Runner(name="evolve", config_cls=config.EvolveConfig, description=config.__doc__,
                unit_fn=units.evaluation_unit, decisions=units.decisions, decision_name=units.DECISION,
                plan=units.plan, report=report.report, figures=report.figures,
                check=loop.check, prepare=loop.prepare, payload=units.payload,
                resolved=lambda ctx: {"slate_size": ctx.config.slate}, extensible=config.EXTENSIBLE,
                llm_fields=("llm",), encoder_fields=("encoder",), default_out=config.DEFAULT_OUT,
                unit_name="evaluations", summary=report.summary,
                presets=config.PRESETS)

