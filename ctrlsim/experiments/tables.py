"""Tables as data: the GitHub-style tables of a `tables.md`, read back as pandas DataFrames.

Every runner renders its tables as markdown (what `tables.md` shows and the CLI prints); the
Python API (`RunResult.tables`) returns the same tables, parsed from that text, so the two can
never disagree. A table is named by the nearest heading above it (a second table under one
heading gets " (2)"); cells that read as numbers become floats, the rest stay text (e.g.
"12.5 ± 3.1", "-").
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def github_table(rows, header) -> str:
    """Rows (lists of cell strings) under `header` as a GitHub pipe table (cells kept as written)."""
    from tabulate import tabulate

    return tabulate(rows, headers=header, tablefmt="github", disable_numparse=True)


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") else inner
    return [c.strip() for c in inner.split("|")]


def _is_rule(line: str) -> bool:
    cells = _cells(line)
    return bool(cells) and all(c and set(c) <= set(":-") for c in cells)


def _value(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def markdown_tables(markdown: str) -> dict[str, pd.DataFrame]:
    """Heading -> DataFrame for every pipe table in `markdown` (see the module docstring)."""
    import pandas as pd

    lines = markdown.splitlines()
    tables: dict[str, pd.DataFrame] = {}
    heading, n = "table", 0
    while n < len(lines):
        line = lines[n]
        if line.lstrip().startswith("#"):
            heading = line.lstrip("#").strip() or heading
        elif line.strip().startswith("|") and n + 1 < len(lines) and _is_rule(lines[n + 1]):
            header = _cells(line)
            rows, n = [], n + 2
            while n < len(lines) and lines[n].strip().startswith("|"):
                cells = _cells(lines[n])
                rows.append([_value(c) for c in cells[:len(header)]] + [""] * (len(header) - len(cells)))
                n += 1
            name, copy = heading, 2
            while name in tables:
                name, copy = f"{heading} ({copy})", copy + 1
            tables[name] = pd.DataFrame(rows, columns=header)
            continue
        n += 1
    return tables
