"""Runs sized to answer: add seeds until the headline intervals are narrow enough, or the budget ends.

`--precision H --budget-minutes M` on a runner whose seeds may grow (ctrlbench, calibrate) runs its
config (the loop is `ctrlsim.experiments.driver.drive_sized`; this module holds its rules and its
table), then in rounds adds seeds until every headline interval has a half-width of at most H, or
the next round would not fit in what is left of M minutes. Each round doubles the seeds (never past
what the budget allows, measured from the seconds per seed so far). The run folder is an ordinary
one (it resumes and extends), and `sizing.json` in it records the rounds and what stopped them.

The headline intervals are confidence sequences (`ctrlsim.metrics.sequential`, Waudby-Smith &
Ramdas's betting-based sequence for a bounded mean) over the per-seed means of the headline metric,
one per (method, box), in seed order: they hold at every number of seeds at once, so stopping when
they look narrow enough keeps their 95% coverage, which a fixed-n interval would not. They are wider
than the fixed-n intervals of the runner's own tables; the "Sized run" table prints them, and the
record of the stop, beneath those tables. docs/statistics.md ("Runs sized to answer") says why a
confidence sequence and not a group-sequential design.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ctrlsim.errors import ConfigError

if TYPE_CHECKING:
    from ctrlsim.experiments.runner import Runner

SIZING_FILE = "sizing.json"
CONFIDENCE = 0.95
STOP_PRECISION, STOP_BUDGET, STOP_SEEDS = "precision", "budget", "seeds"
MAX_SEEDS = 1000  # a sized run never grows past this many seeds, whatever the budget


@dataclass(frozen=True)
class HeadlineInterval:
    """The confidence sequence's interval of one (method, box)'s headline metric after `n` seeds."""

    method: str
    box: str
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_dict(self) -> dict:
        return {"method": self.method, "box": self.box, "mean": self.mean, "low": self.low, "high": self.high,
                "n": self.n, "half_width": self.half_width}


def check_sizable(runner: Runner, config: Any) -> None:
    """A sized run needs a runner whose seeds grow and that declares its scores (the option values
    themselves were checked by `RunOptions`)."""
    if runner.scores is None or "seeds" not in runner.extensible or not hasattr(config, "seeds"):
        raise ConfigError(f"--precision adds seeds to a run: {runner.name} has no seeds that grow or "
                          "declares no scores (sized runs: ctrlbench, calibrate)")


def headline_intervals(runner: Runner, config: Any, records: Mapping[str, dict]) -> list[HeadlineInterval]:
    """Per (method, box): the confidence sequence over per-seed means of the headline share, in seed
    order (the seeds a run holds are the first ones of its plan, so the order was fixed in advance)."""
    from ctrlsim.experiments.scores import headline_metric, score_frame
    from ctrlsim.metrics.sequential import bounded_mean_sequence

    frame = score_frame(runner, config, records)
    metric = headline_metric(runner, config)
    frame = frame[frame["metric"] == metric]
    if len(frame) and not frame["share"].all():
        raise ConfigError(f"{runner.name}'s headline metric {metric!r} is not a share in [0, 1]: a sized run "
                          "needs a bounded metric")
    out = []
    for (method, box), group in frame.groupby(["method", "box"], sort=False):
        per_seed = group.groupby("seed")["value"].mean().sort_index()
        bounds = bounded_mean_sequence(per_seed.to_numpy(), confidence=CONFIDENCE)
        low, high = bounds.final
        out.append(HeadlineInterval(str(method), str(box), float(per_seed.mean()), low, high,
                                    int(per_seed.size)))
    return out


def next_seeds(seeds: tuple[int, ...], count: int) -> tuple[int, ...]:
    """`count` new seeds after the largest one held."""
    start = max(seeds) + 1 if seeds else 0
    return tuple(range(start, start + count))


def seeds_to_add(held: int, seconds_per_seed: float, seconds_left: float) -> int:
    """How many seeds the next round adds: double what is held, but no more than the budget pays for."""
    affordable = int(seconds_left // seconds_per_seed) if seconds_per_seed > 0 else held
    return max(0, min(held, affordable, MAX_SEEDS - held))


def stop_sentence(record: Mapping[str, Any]) -> str:
    rounds = record["rounds"]
    last = rounds[-1]
    widest = last["max_half_width"]
    width = "no headline interval" if widest is None else f"the widest headline half-width {widest:.3f}"
    why = {STOP_PRECISION: f"reached the precision asked for ({width} <= {record['precision']:g})",
           STOP_BUDGET: f"stopped by the budget of {record['budget_minutes']:g} min before the precision "
                        f"{record['precision']:g} was reached ({width}, {last['widest']})",
           STOP_SEEDS: f"stopped at {MAX_SEEDS} seeds ({width})"}[record["stopped_by"]]
    return (f"sized run: {len(last['seeds'])} seeds in {len(rounds)} round(s), {record['seconds']:.0f} s; "
            f"{why}")


def write_sizing(folder: Path, record: Mapping[str, Any]) -> None:
    """sizing.json, written atomically and never through a link in the run folder."""
    from ctrlsim.atomic import atomic_write_text
    from ctrlsim.experiments.runfolder import artefact_path

    atomic_write_text(artefact_path(folder, SIZING_FILE), json.dumps(record, indent=2) + "\n")


def sizing_blocks(folder: Path, runner: Runner, config: Any, records: Mapping[str, dict]) -> list:
    """The sized-run table (tables.md's last), where the folder holds a sizing record."""
    from ctrlsim.experiments.tables import Table

    try:
        record = json.loads((folder / SIZING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    intervals = headline_intervals(runner, config, records)
    rows = [[i.method, i.box, i.n, f"{100 * i.mean:.2f}", f"[{100 * i.low:.2f}, {100 * i.high:.2f}]",
             f"{100 * i.half_width:.2f}"] for i in intervals]
    header = ["Method", "Box", "seeds", "mean (%)", "95% confidence sequence (%)", "half-width (pp)"]
    return [Table.of(f"Sized run: headline intervals valid under optional stopping ({record['stopped_by']})",
                     rows, header,
                     after=stop_sentence(record) + ". Each interval is a 95% confidence sequence over the "
                           "per-seed means (it holds at every number of seeds, so stopping on it keeps its "
                           "coverage); it is wider than the fixed-n intervals above, which assume the seeds "
                           "were fixed in advance (docs/statistics.md, \"Runs sized to answer\").")]
