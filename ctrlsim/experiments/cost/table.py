"""The cost table at the end of every run's `tables.md`: decisions per CPU-hour and tokens per decision.

A controllability measurement costs what its decisions cost, so the table states the price in units
other simulators can be compared in: how many decisions one CPU-hour buys, and how many LLM tokens
one decision spends. A runner declares what one decision is (`Runner.decisions`: a probe's choice
on one slate, a SteerEval profile edit, a PromptShift list, a PPO timestep) and how many each record
holds. The seconds come from the folder's unit log (`log.FOLDER_LOG`, written by the driver as units
finish) or, for work the driver does itself before the units (evolve's phases), from the record's own
`seconds` / `cpu_seconds`. A unit with no measurement (run by an older ctrlsim, or merged in from
another folder) is left out of every column, and the table says how many were measured. Nothing here
changes a record: costs are measurements of the machine, and a rerun of the same records on another
machine shows other costs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ctrlsim.experiments.cost.log import folder_units

TITLE = "Cost of the units (measured on this machine)"


def _own_timing(record: Mapping[str, Any]) -> dict | None:
    seconds, cpu = record.get("seconds"), record.get("cpu_seconds")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        timing = {"seconds": float(seconds)}
        if isinstance(cpu, (int, float)) and not isinstance(cpu, bool):
            timing["cpu_seconds"] = float(cpu)
        return timing
    return None


def measured_units(folder: Path, records: Mapping[str, dict]) -> dict[str, dict]:
    """Unit key -> {"seconds"[, "cpu_seconds"]} for every finished unit whose cost was measured."""
    logged = folder_units(folder, records)
    own = {k: t for k, r in records.items() if k not in logged and (t := _own_timing(r)) is not None}
    return {**logged, **own}


def cost_summary(runner: Any, config: Any, records: Mapping[str, dict], measured: Mapping[str, dict]) -> dict:
    """Totals over the measured units: units, decisions, tokens, wall and CPU seconds (CPU only over
    the units whose CPU time was measured, with their decisions and tokens alongside)."""
    from ctrlsim.experiments.usage import record_tokens

    total = {"units": 0, "decisions": 0, "tokens": 0, "unknown_calls": 0, "seconds": 0.0,
             "cpu_units": 0, "cpu_seconds": 0.0, "cpu_decisions": 0}
    for key, timing in measured.items():
        record = records[key]
        decisions = int(runner.decisions(config, key, record) or 0) if runner.decisions else 0
        usage = record_tokens(record)
        total["units"] += 1
        total["decisions"] += decisions
        total["tokens"] += usage.total
        total["unknown_calls"] += usage.unknown_calls
        total["seconds"] += float(timing["seconds"])
        if "cpu_seconds" in timing:
            total["cpu_units"] += 1
            total["cpu_seconds"] += float(timing["cpu_seconds"])
            total["cpu_decisions"] += decisions
    return total


def _per_cpu_hour(total: Mapping[str, Any]) -> str:
    if not total["cpu_units"] or not total["cpu_decisions"] or total["cpu_seconds"] <= 0:
        return "-"
    return f"{total['cpu_decisions'] * 3600 / total['cpu_seconds']:,.0f}"


def cost_blocks(folder: Path, runner: Any, config: Any, records: Mapping[str, dict]) -> list:
    """The cost table, or nothing when no finished unit of this folder was measured."""
    from ctrlsim.experiments.tables import Table

    measured = measured_units(folder, records)
    if not measured:
        return []
    total = cost_summary(runner, config, records, measured)
    decisions = total["decisions"]
    bound = "≥ " if total["unknown_calls"] else ""  # servers that sent no counts: a lower bound
    per_decision = f"{bound}{total['tokens'] / decisions:,.0f}" if decisions else "-"
    cpu = f"{total['cpu_seconds']:,.1f}" if total["cpu_units"] else "-"
    rows = [[f"{total['units']} of {len(records)}", f"{decisions:,}", cpu, _per_cpu_hour(total),
             f"{bound}{total['tokens']:,}", per_decision, f"{total['seconds'] / total['units']:.1f}"]]
    header = ["units measured", "decisions", "CPU s", "decisions per CPU-hour", "tokens",
              "tokens per decision", "wall s per unit"]
    what = runner.decision_name or "one unit"
    cpu_note = ("CPU time is the run's process's, every thread counted (llama.cpp's included), so it "
                "does not depend on how many cores ran it" if total["cpu_units"] else
                "no unit's CPU time was measured here (units run on other workers report wall time only)")
    after = (f"A decision: {what}. {cpu_note}; a unit's time includes loading models the first time it "
             "needs them, and units answered from a response cache cost almost nothing. A rerun on "
             "another machine shows other costs, never other records (docs/performance.md, \"What a "
             "measurement costs\").")
    return [Table.of(TITLE, rows, header, after=after)]


__all__ = ["TITLE", "cost_blocks", "cost_summary", "measured_units"]
