"""The `promptshift` runner: PromptShift Tables 4, 5 and 6 (see `config` for how a run works)."""
from __future__ import annotations

from ctrlsim.experiments.promptshift import config, observe, report, units
from ctrlsim.experiments.runner import Runner

RUNNER = Runner(name="promptshift", config_cls=config.PromptShiftConfig,
                description=(config.__doc__ or "").split("\n\n")[0], unit_fn=units.generate_user_lists,
                decisions=units.decisions, decision_name=units.DECISION,
                plan=units.plan, report=report.report, figures=report.save_figures, check=units.check,
                prepare=units.prepare, identity=units.identity, from_identity=units.from_identity,
                extensible=("config.llms",), llm_fields=("llms",), dial_fields=("llms",),
                record_fields=("user", "lists"), default_out="results/promptshift", unit_name="users",
                summary=report.run_summary, observation=observe.OBSERVATION,
                presets=config.PRESETS, scores=report.SCORES)

