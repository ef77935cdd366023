"""The `ctrlbench` runner: CtrlBench-Rec's method comparison (see `config` for what a run writes)."""
from __future__ import annotations

from ctrlsim.experiments.ctrlbench import config, inputs, observe, reliability, report, units
from ctrlsim.experiments.runner import Runner

RUNNER = Runner(name="ctrlbench", config_cls=config.CtrlBenchConfig, description=config.__doc__,
                unit_fn=units.episode_unit, decisions=units.decisions, decision_name=units.DECISION,
                plan=units.plan,
                report=report.report, figures=report.figures, check=inputs.check, identity=inputs.identity,
                resolved=inputs.resolved, from_identity=inputs.from_identity, on_stored=report.write_roster,
                extensible=("methods", "recommenders", "targets", "seeds"),
                llm_fields=("llm", "recommender_llm"), presets=config.PRESETS, default_out=config.DEFAULT_OUT,
                record_fields=("method", "recommender", "target", "seed", "curves", "probes", "personas"),
                unit_name="episodes", observation=observe.OBSERVATION,
                scores=reliability.SCORES,
                # --task persistence, responsiveness: the numbers as data (the audit reads them); else {}
                summary=report.run_summary)
