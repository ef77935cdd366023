"""What both of `ctrlsim calibrate`'s reports share (`report` for the lambda grid, `persistence` for
the memory windows), so neither imports the other: the validity marks of the methods' rows and the
cost table."""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from ctrlsim.experiments.tables import Table

ALPHA = 0.05  # a step (of lambda, or of the memory window) is told apart at p < ALPHA


def _name(names: Mapping[str, str] | None, method: str) -> str:
    """The method as a table row names it: marked where it failed its validity card."""
    return (names or {}).get(method, method)


def validity(records: Mapping[str, dict]) -> tuple[dict, dict[str, str]]:
    """(each method's validity card, method -> its row name marked where the card fails) from the
    episodes' validity decisions the units stored (docs/probe-validity.md)."""
    from ctrlsim.experiments import validity_card as VC

    episodes = [e for r in records.values() for e in r.get("episodes_validity", [])]
    found = VC.cards(episodes) if episodes else {}
    return found, {m: f"{m} {VC.FAIL_MARK}" for m, c in found.items() if c.has_check and not c.passes}


def cost_table(config, records: Mapping[str, dict], names: Mapping[str, str] | None = None) -> Table:
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for record in records.values():
        family = "dial" if record["lambda"] is not None else record["box"]
        cell = sums[(record["method"], family)]
        cell["units"] += 1
        cell["seconds"] += float(record["timing"]["seconds"])
        for key, value in record["details"].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                cell[key] += value
            elif isinstance(value, dict):
                for sub, v in value.items():
                    cell[f"{key}_{sub}"] += v
    keys = sorted({k for cell in sums.values() for k in cell} - {"units", "seconds"})
    rows = [[_name(names, method), family, f"{int(cell['units'])}", f"{cell['seconds']:.1f}",
             *(_cost_cell(cell, k) for k in keys)] for (method, family), cell in sorted(sums.items())]
    return Table.of("Cost and fallbacks", rows, ["Method", "Boxes", "Units", "Seconds", *keys])


def _cost_cell(cell: Mapping[str, float], key: str) -> str:
    """A cost figure; token sums with calls whose server sent no counts are lower bounds, shown so."""
    from ctrlsim.backends.meter import unknown_tokens

    unknown = int(cell.get("tokens_unknown_calls", 0) + cell.get("unknown_calls", 0))
    if unknown and "tokens" in key and not key.endswith("unknown_calls"):
        return unknown_tokens(unknown, known=cell.get(key, 0))
    return f"{cell.get(key, 0):g}"
