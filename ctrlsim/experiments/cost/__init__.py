"""What a run's units cost: the measurement log and estimates (`log`), and the cost table every
run's `tables.md` ends with (`table`)."""
from ctrlsim.experiments.cost.log import (
    CACHE_LOG,
    FOLDER_LOG,
    CostEstimate,
    UnitClock,
    estimate,
    folder_seconds,
    folder_units,
    format_duration,
    plan_line,
    record_run,
    record_unit,
    signature,
)
from ctrlsim.experiments.cost.table import TITLE, cost_blocks

__all__ = ["TITLE", "CACHE_LOG", "FOLDER_LOG", "CostEstimate", "UnitClock", "cost_blocks", "estimate",
           "folder_seconds", "folder_units", "format_duration", "plan_line", "record_run", "record_unit",
           "signature"]
