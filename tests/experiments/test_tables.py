"""Reports as data: one renderer for tables.md; `RunResult.tables` and tables.json are the report's data."""
import json
from dataclasses import dataclass

import pandas as pd
import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.runner import _REGISTERED, Runner, register_runner
from ctrlsim.experiments.tables import (
    Table,
    Text,
    blocks_from_json,
    markdown_tables,
    render_markdown,
    report_blocks,
    report_tables,
    tables_json,
)

BLOCKS = [
    Text("# Title\n\nprose"),
    Table.of("One", [["x", 1.5], ["y", "-"]], ["a", "b"], after="note"),
    Table.of("Plain", [[2]], ["c"], level=0, before="intro"),
    Table.of("One", [[2, "0.50"]], ["c", "d"], level=3, parse_numbers=True),
]

# Written by hand: a blank line between blocks, "##"/"###" headings from the level, a plain title
# line for level 0, prose before/after the table, cells as given (only parse_numbers lets tabulate
# read "0.50" as 0.5).
MARKDOWN = """# Title

prose

## One

| a   | b   |
|-----|-----|
| x   | 1.5 |
| y   | -   |

note

Plain

intro

| c   |
|-----|
| 2   |

### One

|   c |   d |
|-----|-----|
|   2 | 0.5 |
"""


def test_a_hand_built_report_renders_to_known_markdown():
    assert render_markdown(BLOCKS) == MARKDOWN


def test_tables_are_named_by_title_and_hold_the_cells_as_given():
    tables = report_tables(BLOCKS)
    assert list(tables) == ["One", "Plain", "One (2)"]
    assert tables["One"].to_dict("list") == {"a": ["x", "y"], "b": [1.5, "-"]}
    assert tables["One (2)"].to_dict("list") == {"c": [2], "d": ["0.50"]}
    # The markdown reader names by headings, so the plain-titled table sits under "One" there.
    assert list(markdown_tables(MARKDOWN)) == ["One", "One (2)", "One (3)"]


def test_json_round_trip_keeps_every_block():
    data = json.loads(json.dumps(tables_json(BLOCKS)))
    assert data[0] == {"text": "# Title\n\nprose"}
    assert data[1]["header"] == ["a", "b"] and data[1]["rows"] == [["x", 1.5], ["y", "-"]]
    back = blocks_from_json(data)
    assert render_markdown(back) == MARKDOWN
    for name, frame in report_tables(back).items():
        pd.testing.assert_frame_equal(frame, report_tables(BLOCKS)[name])


def test_duplicate_and_empty_column_names_are_kept():
    table = Table.of("Learned probe", [["target", "War"]], ["", ""], level=1)
    assert table.header == ["", ""] and table.rows == [["target", "War"]]
    assert table.markdown().splitlines()[0] == "# Learned probe"


def test_a_ragged_row_and_a_foreign_block_are_errors():
    with pytest.raises(ConfigError, match="row 1 has 1 cells for 2 columns"):
        Table.of("t", [["a", "b"], ["c"]], ["x", "y"])
    with pytest.raises(ConfigError, match="not dict"):
        report_blocks([{"title": "t"}])
    assert report_blocks("plain text") == [Text("plain text")]  # a user's runner that returns text
    assert report_blocks("") == []


@dataclass(frozen=True)
class _Config:
    rows: int = 2


def _hand_report(ctx, records):
    n = ctx.config.rows
    return [Text("# Hand"), Table.of("Squares", [[i, f"{i * i:.1f}"] for i in range(n)], ["i", "i²"])]


def test_run_result_tables_and_tables_json_are_the_reports_data(tmp_path):
    runner = register_runner(Runner("hand-tables", _Config, "a report without units", unit_fn=len,
                                    report=_hand_report))
    try:
        result = ctrlsim.run("hand-tables", out=tmp_path / "run", rows=3, show_progress=False)
    finally:
        _REGISTERED.pop(runner.name)
    assert list(result.tables) == ["Squares"]
    assert result.tables["Squares"].to_dict("list") == {"i": [0, 1, 2], "i²": ["0.0", "1.0", "4.0"]}
    expected = ("# Hand\n\n## Squares\n\n| i   | i²   |\n|-----|------|\n"
                "| 0   | 0.0  |\n| 1   | 1.0  |\n| 2   | 4.0  |\n")
    assert result.markdown == expected == (tmp_path / "run" / "tables.md").read_text(encoding="utf-8")
    stored = json.loads((tmp_path / "run" / "tables.json").read_text(encoding="utf-8"))
    assert stored[1]["rows"] == [[0, "0.0"], [1, "1.0"], [2, "4.0"]]
    assert render_markdown(blocks_from_json(stored)) == expected
