"""`ctrlsim <protocol> ...` and `ctrlsim report ...`: the command line over the driver, one for all runners.

Every runner gets the same flags: one per config field (generated from its dataclass), the run
options (`--out`, `--overwrite`, `--executor`, ...), `--config FILE` (start from the config of an
earlier run's `config.json`; flags given as well override it) and, where the runner has presets,
`--preset NAME`. Exit status: 0 when every unit finished, 1 when some failed (they are listed,
nothing of theirs is stored, a rerun retries them), 2 for a bad value (nothing ran), 130 when
Ctrl-C stopped the run (one line says how many finished units are stored where; the same command
resumes).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.config import (
    RunOptions,
    _parse_bool,
    config_from_args,
    config_to_dict,
    runner_parser,
)
from ctrlsim.experiments.runner import Runner, get_runner


def build_parser(runner: Runner) -> argparse.ArgumentParser:
    parser = runner_parser(f"ctrlsim {runner.name}", runner.description, runner.config_cls)
    parser.add_argument("--config", dest="config_file", metavar="FILE", default=argparse.SUPPRESS,
                        help="start from the config of an earlier run (its config.json, or a JSON object of "
                             "config fields); flags given as well override it")
    if runner.presets:
        parser.add_argument("--preset", choices=sorted(runner.presets), default=argparse.SUPPRESS,
                            help="start from a preset; flags given as well override it")
    if "llms" not in {f.name for f in dataclasses.fields(runner.config_cls)}:  # promptshift's is its own
        parser.add_argument("--llms", dest="across_llms", metavar="A,B,...", default=argparse.SUPPRESS,
                            help="run the same units once per probe model, each into OUT/llm=<model>/, "
                                 "then write how much the box comparison moves with the model "
                                 "(OUT/sensitivity.md; docs/statistics.md)")
    default_out = str(runner.out_for(RunOptions()))
    parser.set_defaults(out=default_out)
    for action in parser._actions:  # the shared help text cannot know each runner's folder
        if action.dest == "out":
            action.help = ("run folder (config.json, records.jsonl, tables.md, figures/); rerun to resume, "
                           f"add seeds/methods/... to extend [default: {default_out}]")
    return parser


def read_config_file(runner: Runner, path: str | Path) -> dict[str, Any]:
    """The config fields stored in a run's config.json (or a bare JSON object of fields)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config {str(path)!r}: cannot read it ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFileError(path, f"is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DataFileError(path, "expected a JSON object (a run's config.json)")
    if data.get("runner", runner.name) != runner.name:
        raise ConfigError(f"--config {str(path)!r} is the config of a {data['runner']!r} run, "
                          f"not of {runner.name!r}")
    stored = data.get("config", data)
    return config_to_dict(runner.config_from_identity(stored))


def config_from_cli(runner: Runner, args: argparse.Namespace) -> Any:
    """Config file, then preset, then the flags given on the command line (each overrides the one before)."""
    base: dict[str, Any] = {}
    if getattr(args, "config_file", None):
        base.update(read_config_file(runner, args.config_file))
    preset = getattr(args, "preset", None)
    if preset:
        base.update(runner.presets[preset])
    given = set(vars(args))
    return config_from_args(runner.config_cls, args, **{k: v for k, v in base.items() if k not in given})


# Flags that are gone, and what to give instead (a clearer error than argparse's "unrecognized").
RETIRED_FLAGS = {
    "--llm-cache": "LLM replies are kept in the run folder (llm-cache.sqlite); to share them between "
                   "runs give the run option --shared-cache DIR",
}


def parse_command(name: str, argv: Sequence[str] | None = None) -> tuple[Any, RunOptions]:
    """(config, run options) of `ctrlsim <name> <argv>`; every value is checked, nothing is loaded."""
    runner = get_runner(name)
    for arg in sys.argv[1:] if argv is None else argv:
        flag = arg.split("=", 1)[0]
        if flag in RETIRED_FLAGS:
            raise ConfigError(f"{flag} is no longer a flag of ctrlsim {name}: {RETIRED_FLAGS[flag]}")
    args = build_parser(runner).parse_args(argv)
    return config_from_cli(runner, args), config_from_args(RunOptions, args)


def across_llms(runner: Runner, argv: Sequence[str] | None) -> tuple[str, ...] | None:
    """The probe models of `--llms A,B,...` (None without the flag); `--llms` with the probe-LLM flag
    itself, or with a sized run, is a `ConfigError`."""
    args = vars(build_parser(runner).parse_args(argv))
    if "across_llms" not in args:
        return None
    from ctrlsim.experiments.sensitivity.run import check_llm_list, probe_field

    name = probe_field(runner)
    if name in args:
        raise ConfigError(f"--llms runs each of its models as --{name.replace('_', '-')}: give one of the "
                          "two")
    if args.get("precision") is not None or args.get("budget_minutes") is not None:
        raise ConfigError("--llms runs at the sizes given; size a run (--precision, --budget-minutes) on "
                          "its own")
    return check_llm_list(args["across_llms"])


def runner_main(name: str, argv: Sequence[str] | None = None) -> int:
    """`ctrlsim <name> ...`: parse, check, drive, print the tables and the failures."""
    from ctrlsim.experiments.driver import drive, failure_summary

    runner = get_runner(name)
    config, options = parse_command(name, argv)  # every value is checked here, before any model loads
    llms = across_llms(runner, argv)
    if llms is not None:
        from ctrlsim.experiments.sensitivity.run import sensitivity_main

        return sensitivity_main(runner, config, options, llms)
    started = time.perf_counter()
    if options.precision is not None or options.budget_minutes is not None:
        from ctrlsim.experiments.driver import drive_sized

        result = drive_sized(runner, config, options)
    else:
        result = drive(runner, config, options)
    print(result.markdown)
    if result.failed:
        print(failure_summary(result), file=sys.stderr)
    print(f"\nrun folder: {result.out} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 1 if result.failed else 0


def report_main(argv: Sequence[str] | None = None) -> int:
    """`ctrlsim report RUN [RUN ...]`: rebuild tables and figures from run folders (merged)."""
    from ctrlsim.experiments.report import rebuild_report

    parser = argparse.ArgumentParser(prog="ctrlsim report", description=report_main.__doc__)
    parser.add_argument("runs", nargs="+", help="run folders of one runner")
    parser.add_argument("--out", default=None, help="where the merged tables and figures go (needed with "
                                                    "several runs; default: rewrite the one run's own)")
    parser.add_argument("--figures", type=_parse_bool, default=True,
                        help="write figures/*.png [default: true]")
    parser.add_argument("--allow-code-change", type=_parse_bool, nargs="?", const=True, default=False,
                        help="merge run folders written by other ctrlsim code or library versions "
                             "(recorded in the merged folder's provenance.jsonl); other inputs or "
                             "defaults are still refused")
    args = parser.parse_args(argv)
    markdown, out = rebuild_report(args.runs, out=args.out, figures=args.figures,
                                   allow_code_change=args.allow_code_change)
    print(markdown)
    print(f"\nreport: {out}", file=sys.stderr)
    return 0
