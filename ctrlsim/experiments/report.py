"""`ctrlsim report`: tables and figures rebuilt from the records of one or more run folders.

One folder: its `tables.md` and `figures/` are rewritten from its records (e.g. after a change
of the report code, or while a run on another machine is still writing; the records file is
read without its lock only when a new `--out` is given). Several folders of one runner (e.g. the
same config run with other seeds on several machines): their configs are merged as an extension
would merge them (see `identity`; any other difference is an error naming the fields), their
records are copied into the `--out` folder, which becomes a run folder of its own (a later run
with the merged config resumes it), and the tables cover all of them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.identity import extend_config
from ctrlsim.experiments.runner import RUNNER_MODULES, RunContext, Runner, get_runner
from ctrlsim.experiments.store import read_run_records


def runner_of(folder: Path) -> Runner:
    """The runner that wrote `folder` (named in its config.json)."""
    path = folder / "config.json"
    try:
        about = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{str(folder)!r} is not a run folder (no config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFileError(path, f"is not valid JSON ({exc})") from None
    name = about.get("runner") if isinstance(about, dict) else None
    if name not in RUNNER_MODULES:
        raise ConfigError(f"{path} does not name its runner (written by an older ctrlsim?); "
                          f"runners: {', '.join(RUNNER_MODULES)}")
    return get_runner(name)


def report_of(ctx: RunContext, records: dict[str, dict]) -> list:
    """The report a run folder shows: the runner's blocks, then the framework's (a sized run's
    confidence sequences, `ctrlsim.experiments.sizing`)."""
    from ctrlsim.experiments.sizing import sizing_blocks
    from ctrlsim.experiments.tables import report_blocks

    blocks = report_blocks(ctx.runner.report(ctx, records))
    if ctx.folder is not None:
        blocks += sizing_blocks(ctx.folder.path, ctx.runner, ctx.config, records)
    return blocks


def read_run(folder: str | Path) -> tuple[Runner, object, dict[str, dict]]:
    """(runner, typed config, finished records) of a run folder, read without its lock."""
    folder = Path(folder)
    runner = runner_of(folder)
    stored, records = read_run_records(folder / "records.jsonl", runner.record_fields)
    return runner, runner.config_from_identity(stored), records


def rebuild_report(runs: Sequence[str | Path], *, out: str | Path | None = None,
                   figures: bool = True) -> tuple[str, Path]:
    """Rewrite the tables (and figures) of `runs`, merged into `out` when given; returns (tables.md's
    text, folder)."""
    from ctrlsim.experiments.runfolder import RunFolder
    from ctrlsim.experiments.tables import write_report

    folders = [Path(r) for r in runs]
    if not folders:
        raise ConfigError("report needs at least one run folder")
    if len(folders) > 1 and out is None:
        raise ConfigError("several run folders are merged into a new one: give --out")
    runners = {runner_of(f).name for f in folders}
    if len(runners) > 1:
        raise ConfigError(f"run folders of different runners cannot be merged: {', '.join(sorted(runners))}")
    runner = get_runner(runners.pop())
    config: dict | None = None
    records: dict[str, dict] = {}
    for folder in folders:
        stored, found = read_run_records(folder / "records.jsonl", runner.record_fields)
        where = f"{folder} (merged with the runs before it)"
        config = stored if config is None else extend_config(config, stored, runner.extensible, where=where)
        for key, record in found.items():
            records.setdefault(key, record)
    assert config is not None
    target = Path(out) if out is not None else folders[0]
    options = RunOptions(out=str(target), figures=figures)
    ctx = RunContext(runner, runner.config_from_identity(config), options, show_progress=False)
    runner.check(ctx)  # fills what the tables need from the data (target sizes, the user sample)
    with RunFolder(target, config, extensible=runner.extensible, about={"runner": runner.name}) as run:
        ctx.folder = run
        for key, record in records.items():
            if key not in run.store:
                run.store.add(key, record)
        finished = {k: r for k, r in run.store.records()}
        markdown = write_report(run, report_of(ctx, finished))
        if figures and finished:
            runner.figures(ctx, finished)
    return markdown, target
