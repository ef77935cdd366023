"""The `steereval` runner: SteerEval's tables 1-8 (see `config` for the conditions and the run folder)."""
from __future__ import annotations

from ctrlsim.experiments.runner import Runner
from ctrlsim.experiments.steereval import config, observe, report, units

RUNNER = Runner(name="steereval", config_cls=config.SteerEvalConfig, description=config.__doc__,
                unit_fn=units.run_steereval_unit, decisions=units.decisions,
                decision_name=units.DECISION, plan=units.plan, report=report.report,
                figures=report.figures, check=units.check, prepare=units.prepare,
                extensible=("conditions",), llm_fields=("llm",), encoder_fields=("encoder",),
                default_out=config.DEFAULT_OUT, unit_name="episodes", record_fields=config.RECORD_FIELDS,
                summary=report.run_result, observation=observe.OBSERVATION,
                presets=config.PRESETS, scores=report.SCORES)

