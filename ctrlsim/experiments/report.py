"""`ctrlsim report`: tables and figures rebuilt from the records of one or more run folders.

One folder: its `tables.md` and `figures/` are rewritten from its records (e.g. after a change
of the report code, or while a run on another machine is still writing; the records file is
read without its lock only when a new `--out` is given). Several folders of one runner (e.g. the
same config run with other seeds on several machines): their configs are merged as an extension
would merge them (see `identity`; any other difference is an error naming the fields), their
records are copied into the `--out` folder, which becomes a run folder of its own (a later run
with the merged config resumes it), and the tables cover all of them. What made the records must
agree as well (`provenance.merged_entry`: inputs, resolved defaults, and code unless
`--allow-code-change`), a unit two folders hold must have the same record in both, and the merged
folder's provenance is its sources'.
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
    confidence sequences, `ctrlsim.experiments.sizing`; the measured cost of the units,
    `ctrlsim.experiments.cost`)."""
    from ctrlsim.experiments.cost import cost_blocks
    from ctrlsim.experiments.sizing import sizing_blocks
    from ctrlsim.experiments.tables import report_blocks

    blocks = report_blocks(ctx.runner.report(ctx, records))
    if ctx.folder is not None:
        blocks += sizing_blocks(ctx.folder.path, ctx.runner, ctx.config, records)
        blocks += cost_blocks(ctx.folder.path, ctx.runner, ctx.config, records)
    return blocks


def read_run(folder: str | Path) -> tuple[Runner, object, dict[str, dict]]:
    """(runner, typed config, finished records) of a run folder, read without its lock."""
    folder = Path(folder)
    runner = runner_of(folder)
    stored, records = read_run_records(folder / "records.jsonl", runner.record_fields)
    return runner, runner.config_from_identity(stored), records


def rebuild_report(runs: Sequence[str | Path], *, out: str | Path | None = None,
                   figures: bool = True, allow_code_change: bool = False) -> tuple[str, Path]:
    """Rewrite the tables (and figures) of `runs`, merged into `out` when given; returns (tables.md's
    text, folder).

    A merge gathers records only from folders made alike: their inputs and resolved defaults must
    agree, and their code unless `allow_code_change` (`provenance.merged_entry`); a unit two folders
    hold with different records is refused (`merged_records`); a folder already at `out` counts as
    one more source. The folder written records its sources' provenance, not this process's, and the
    inputs the report reads again must still be those its records were made from."""
    from ctrlsim.experiments import provenance as prov
    from ctrlsim.experiments.runfolder import RunFolder
    from ctrlsim.experiments.store import normalised_config
    from ctrlsim.experiments.tables import write_report

    folders = [Path(r) for r in runs]
    if not folders:
        raise ConfigError("report needs at least one run folder")
    if len(folders) > 1 and out is None:
        raise ConfigError("several run folders are merged into a new one: give --out")
    target = Path(out) if out is not None else folders[0]
    if (target / "records.jsonl").exists() and not any(_same_folder(target, f) for f in folders):
        folders.append(target)  # its records stay; the merge must agree with them
    runners = {runner_of(f).name for f in folders}
    if len(runners) > 1:
        raise ConfigError(f"run folders of different runners cannot be merged: {', '.join(sorted(runners))}")
    runner = get_runner(runners.pop())
    config, records = merged_records(runner, folders)
    entries = [(str(f), prov.read_entries(f / prov.PROVENANCE)) for f in folders]
    unknown = [name for name, found in entries if not found]
    if unknown and len(folders) > 1:
        raise ConfigError(
            f"run folder {unknown[0]} has no {prov.PROVENANCE} (written by a ctrlsim that did not record "
            "what produced a run): whether it was made from the same inputs and code as the other folders "
            "cannot be checked, so it is not merged. If its inputs are today's, "
            f"`ctrlsim report {unknown[0]}` records today's inputs and code as its own; then merge")
    sources = None if unknown else prov.merged_entry([(name, found[-1]) for name, found in entries],
                                                     allow_code_change=allow_code_change)
    options = RunOptions(out=str(target), figures=figures)
    ctx = RunContext(runner, runner.config_from_identity(config), options, show_progress=False)
    runner.check(ctx)  # fills what the tables need from the data (target sizes, the user sample)
    if sources is not None:
        resolved = runner.resolved(ctx) if runner.resolved is not None else {}
        prov.check_inputs_unchanged(", ".join(str(f) for f in folders), sources,
                                    prov.provenance(normalised_config(config), resolved))
    with RunFolder(target, config, extensible=runner.extensible, about={"runner": runner.name},
                   allow_code_change=allow_code_change, provenance=sources) as run:
        ctx.folder = run
        for key, record in records.items():
            if key not in run.store:
                run.store.add(key, record)
        finished = {k: r for k, r in run.store.records()}
        markdown = write_report(run, report_of(ctx, finished))
        if figures and finished:
            runner.figures(ctx, finished)
    return markdown, target


def merged_records(runner: Runner, folders: Sequence[Path]) -> tuple[dict, dict[str, dict]]:
    """(merged config, records by unit key) of run folders of `runner`. Configs merge as an extension
    would (`identity.extend_config`). A unit several folders hold must have the same record in each:
    a merge keeps one record per unit, so two different ones are a `ConfigError` naming the unit, the
    two folders and the fields that differ (the one dropped could be the right one)."""
    config: dict | None = None
    records: dict[str, dict] = {}
    holder: dict[str, Path] = {}
    for folder in folders:
        stored, found = read_run_records(folder / "records.jsonl", runner.record_fields)
        where = f"{folder} (merged with the runs before it)"
        config = stored if config is None else extend_config(config, stored, runner.extensible, where=where)
        for key, record in found.items():
            if key not in records:
                records[key], holder[key] = record, folder
            elif record != records[key]:
                kept = records[key]
                fields = sorted(f for f in set(record) | set(kept) if record.get(f) != kept.get(f))
                raise ConfigError(f"unit {key!r} is in {holder[key]} and in {folder} with different "
                                  f"records (fields {', '.join(fields)}); a merge keeps one record per unit "
                                  "and would drop the other: merge folders whose units do not overlap, or "
                                  "remove one copy")
    assert config is not None
    return config, records


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
