"""Reports as data: a runner's `report()` returns `Table`s and `Text` blocks; one renderer here
turns them into `tables.md`, and `RunResult.tables` and the audit read the tables themselves.

A report is a list of blocks, rendered in order with one blank line between them:

* `Table`: a title, a DataFrame of cells (each cell as the table shows it: text such as
  "12.50 ± 3.10" or "-", or a number), and the prose around it (`before`, `after`);
* `Text`: free prose (a report's heading and the paragraphs under it, notes, bullet lists).

`tables_json` / `blocks_from_json` are the machine-readable form the driver writes beside
`tables.md` (`tables.json`). `markdown_tables` still reads pipe tables out of markdown a person or
the CLI printed (tests read the CLI's output with it); the framework never parses its own markdown.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from ctrlsim.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, eq=False)
class Table:
    """One table of a report: its title, its cells and the prose around it."""

    title: str  # also the table's name in `RunResult.tables` (a repeated title gets " (2)")
    frame: pd.DataFrame  # columns = the header; cells as shown
    level: int = 2  # the title's markdown heading level ("## title"); 0: the title is a plain line
    before: str = ""  # prose between the title and the table
    after: str = ""  # prose after the table (notes, definitions)
    # tabulate reads number-like cells as numbers (right-aligned, shortest form): evolve's tables
    # have always been rendered so; every other table shows its cells exactly as given.
    parse_numbers: bool = False

    @classmethod
    def of(cls, title: str, rows: Sequence[Sequence[Any]], header: Sequence[str], **about: Any) -> Table:
        """A table from rows of cells under `header` (duplicate or empty column names are kept)."""
        import pandas as pd

        header = list(header)
        for n, row in enumerate(rows):
            if len(row) != len(header):
                raise ConfigError(f"table {title!r}: row {n} has {len(row)} cells for {len(header)} columns")
        frame = pd.DataFrame([list(r) for r in rows], columns=header, dtype=object)
        return cls(title, frame, **about)

    @property
    def header(self) -> list[str]:
        return [str(c) for c in self.frame.columns]

    @property
    def rows(self) -> list[list[Any]]:
        return [[_plain(v) for v in row] for row in self.frame.itertuples(index=False, name=None)]

    def markdown(self) -> str:
        from tabulate import tabulate

        title = ("#" * self.level + " " if self.level else "") + self.title
        pipe = tabulate(self.rows, headers=self.header, tablefmt="github",
                        disable_numparse=not self.parse_numbers)
        parts = (title, self.before.strip("\n"), pipe, self.after.strip("\n"))
        return "\n\n".join(part for part in parts if part)


@dataclass(frozen=True)
class Text:
    """Free prose in a report (markdown as written)."""

    text: str

    def markdown(self) -> str:
        return self.text


Block = Union[Table, Text]


def _plain(value: Any) -> Any:
    """A cell as a plain Python value (numpy scalars become int/float)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def report_blocks(report: Any) -> list[Block]:
    """A runner's report as blocks; plain text (a user's own runner) is one `Text` block."""
    if isinstance(report, str):
        return [Text(report)] if report else []
    blocks = list(report or [])
    for block in blocks:
        if not isinstance(block, (Table, Text)):
            raise ConfigError(f"a report holds Table and Text blocks, not {type(block).__name__}")
    return blocks


def render_markdown(blocks: Sequence[Block]) -> str:
    """The report as tables.md shows it: every block, one blank line between them."""
    parts = [b.markdown().strip("\n") for b in blocks]
    return "\n\n".join(p for p in parts if p) + "\n"


def _unique_name(title: str, taken: Mapping[str, Any]) -> str:
    """`title`, or `title (2)`, `(3)`, ... where an earlier table took it."""
    name, copy = title, 2
    while name in taken:
        name, copy = f"{title} ({copy})", copy + 1
    return name


def report_tables(blocks: Sequence[Block]) -> dict[str, pd.DataFrame]:
    """Title -> DataFrame for every table of the report, in order (a repeated title gets " (2)")."""
    tables: dict[str, pd.DataFrame] = {}
    for block in blocks:
        if isinstance(block, Table):
            tables[_unique_name(block.title, tables)] = block.frame
    return tables


def tables_json(blocks: Sequence[Block]) -> list[dict]:
    """The report as JSON-ready data (what tables.json holds), in order."""
    out: list[dict] = []
    for block in blocks:
        if isinstance(block, Text):
            out.append({"text": block.text})
        else:
            out.append({"title": block.title, "level": block.level, "before": block.before,
                        "after": block.after, "parse_numbers": block.parse_numbers,
                        "header": block.header, "rows": block.rows})
    return out


def blocks_from_json(data: Sequence[dict]) -> list[Block]:
    """`tables_json`'s output back as blocks."""
    blocks: list[Block] = []
    for item in data:
        if "text" in item:
            blocks.append(Text(item["text"]))
        else:
            blocks.append(Table.of(item["title"], item["rows"], item["header"], level=item["level"],
                                   before=item["before"], after=item["after"],
                                   parse_numbers=item["parse_numbers"]))
    return blocks


TABLES_JSON = "tables.json"


def write_report(folder, blocks: Sequence[Block]) -> str:
    """tables.md (rendered) and tables.json (the data) in a run folder; returns the markdown."""
    markdown = render_markdown(blocks)
    folder.write_tables(markdown)
    folder.write_json(TABLES_JSON, tables_json(blocks))
    return markdown


# ----------------------------------------------------------------------------- reading markdown

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
    """Heading -> DataFrame for every pipe table in markdown text (e.g. what the CLI printed): a
    table is named by the nearest heading above it (a second one under it gets " (2)"); cells
    that read as numbers become floats."""
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
            tables[_unique_name(heading, tables)] = pd.DataFrame(rows, columns=header)
            continue
        n += 1
    return tables
