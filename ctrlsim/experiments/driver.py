"""The one driver every runner goes through: checks, run folder, resume, executor, failure policy.

`drive(runner, config, options)` runs (or resumes, or extends) a run and returns a `RunResult`.
The order is fixed, so every protocol behaves the same:

1. every value was validated when the config and options were built; here every LLM spec
   field is checked (an unknown model or a missing file is an error now, not in every unit), the
   output location is checked, and the runner's own checks run (tags, users, roster files):
   all before the first model loads;
2. the run folder opens; its stored config must equal the asked-for config, or differ only by
   new values in extensible fields (then the run is extended; see `identity`);
3. waves of units: the runner plans the units not yet finished, the executor runs them (in the
   plan's order, or shuffled with `RunOptions.unit_order_seed`, which changes no record; each
   with its `UnitContext`: its typed spec, its dataset, box, LLM and encoder, one cache policy), and
   each finished record is stored as it arrives. A unit that raised is a *failure*: it is never
   stored (a rerun retries exactly those units), its reason is kept, and the rest go on;
4. tables and figures are rebuilt from every finished record;
5. failures are reported: `RunResult.failed` names each failed unit and its reason, and
   `ctrlsim.run` / the CLI turn a non-empty one into an error and a non-zero exit.

Ctrl-C during the waves raises `RunInterrupted` (a `KeyboardInterrupt`) naming the folder and how
many finished units it holds, once the executor and the folder are closed; tables are not rebuilt
(the rerun that resumes rebuilds them). The CLI prints its message and exits 130.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ctrlsim.errors import CtrlsimError, RunInterrupted
from ctrlsim.experiments import cost
from ctrlsim.experiments.config import RunOptions, check_output_dir
from ctrlsim.experiments.context import UnitPayload, call_unit, planned_units, run_settings
from ctrlsim.experiments.runner import RunContext, Runner
from ctrlsim.run_settings import ExchangeSettings, unit_with_exchange_settings, using_exchange_settings

if TYPE_CHECKING:
    import pandas as pd

TABLES_EVERY_S = 15.0  # how often tables.md is rewritten while units arrive (and once at the end)
FAILURES_SHOWN = 20


class RunFailedError(CtrlsimError, RuntimeError):
    """Some units of a run failed; what finished is stored and `result` holds it.

    A rerun of the same command retries exactly the failed units."""

    def __init__(self, result: RunResult):
        self.result = result
        super().__init__(failure_summary(result))


@dataclass
class RunResult:
    """What a run left in its folder: finished records, the tables, and the units that failed."""

    protocol: str
    out: Path
    config: dict
    records_by_key: dict[str, dict]
    markdown: str
    failed: dict[str, str] = field(default_factory=dict)
    planned: int = 0
    ran: int = 0
    seconds: float = 0.0
    context: RunContext | None = field(default=None, repr=False)
    # Builds the protocol's own result (`Runner.summary`) when `summary` is first read, so a run
    # whose caller never asks (every CLI run) does not compute it.
    summarise: Callable[[], dict] | None = field(default=None, repr=False)
    # The report as data (`Runner.report`'s Table and Text blocks); `markdown` is its rendering.
    report: list = field(default_factory=list, repr=False)

    @cached_property
    def summary(self) -> dict:
        """The protocol's own result (`Runner.summary`), e.g. evolve's final roster; empty where none."""
        return self.summarise() if self.summarise is not None else {}

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def records(self) -> list[dict]:
        """Every finished record, each with its unit key under `"key"`."""
        return [{"key": key, **record} for key, record in self.records_by_key.items()]

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """The run's tables as DataFrames (the report's own data), named by their titles."""
        from ctrlsim.experiments.tables import report_tables

        return report_tables(self.report)


def failure_summary(result: RunResult) -> str:
    """A few lines: how many units failed, which, and why (the first `FAILURES_SHOWN`)."""
    from ctrlsim.redact import redact_secrets

    lines = [f"{len(result.failed)} of {result.planned} {result.protocol} unit(s) failed and were not "
             f"stored; {len(result.records_by_key)} finished unit(s) are in {result.out}. "
             "Rerun the same command to retry the failed ones:"]
    for key, error in list(result.failed.items())[:FAILURES_SHOWN]:
        lines.append(f"  {key}: {error}")
    if len(result.failed) > FAILURES_SHOWN:
        lines.append(f"  ... and {len(result.failed) - FAILURES_SHOWN} more")
    return redact_secrets("\n".join(lines))


class UnitsFailed(CtrlsimError, RuntimeError):
    """Raised by a runner's driver-side hook (`prepare`) when units it ran failed."""

    def __init__(self, failed: Mapping[str, str]):
        self.failed = dict(failed)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.failed.items()))


def check_model_fields(runner: Runner, config: Any, resources: Mapping[str, Any]) -> None:
    """Every LLM and encoder spec the config names can be loaded in principle (nothing loads here)."""
    from ctrlsim.backends.spec_check import check_llm_spec
    from ctrlsim.recommenders.dial import is_dial

    for name in runner.llm_fields:
        value = getattr(config, name)
        specs = value if isinstance(value, (tuple, list)) else (value,)
        for spec in specs:
            if spec is None or spec in resources or (name in runner.dial_fields and is_dial(spec)):
                continue
            check_llm_spec(spec, name=name)
    if runner.encoder_fields:
        from ctrlsim.backends.encoders import resolve_encoder_spec

        for name in runner.encoder_fields:
            spec = getattr(config, name)
            if spec is not None and spec not in resources:
                try:
                    resolve_encoder_spec(spec)
                except CtrlsimError as exc:
                    # the field's name first; errors whose constructor takes more than a message
                    # (MissingDependencyError) keep their own text
                    try:
                        renamed = type(exc)(f"{name}: {exc}")
                    except TypeError:
                        raise exc from None
                    raise renamed from None


def drive(runner: Runner, config: Any, options: RunOptions | None = None, *, show_progress: bool = True,
          resources: Mapping[str, Any] | None = None, max_units: int | None = None,
          llms: Mapping[str, Any] | None = None) -> RunResult:
    """Run, resume or extend `config` with `runner` (see the module docstring); never raises for
    failed units (see `RunResult.failed`); `max_units` stops after that many new units (tests);
    `llms` maps LLM specs to loaded LLMs that serve them in this process (nothing is loaded for
    those specs, and they are not checked as paths)."""
    from ctrlsim.experiments.executor import executor_from_options, is_failure
    from ctrlsim.experiments.report import report_of
    from ctrlsim.experiments.runfolder import RunFolder
    from ctrlsim.experiments.tables import render_markdown, write_report

    options = options or RunOptions()
    started = time.perf_counter()
    out = runner.out_for(options)
    check_output_dir(out)
    resources = {**dict(resources or {}), **dict(llms or {})}
    if llms:
        resources["llms"] = {**resources.get("llms", {}), **dict(llms)}
    ctx = RunContext(runner, config, options, show_progress=show_progress, resources=resources)
    check_model_fields(runner, config, resources)
    runner.check(ctx)
    identity = runner.identity(ctx)
    failed: dict[str, str] = {}
    ran = 0
    resolved = runner.resolved(ctx) if runner.resolved is not None else {}
    exchanges = exchange_settings(out, options)
    from ctrlsim.recommenders.http.exchanges import replay_notes  # checks the replayed log, before any unit
    with using_exchange_settings(exchanges), RunFolder(
            out, identity, overwrite=options.overwrite, extensible=runner.extensible,
            about={"runner": runner.name}, record_fields=runner.record_fields, resolved=resolved,
            allow_code_change=options.allow_code_change, notes=replay_notes(exchanges)) as folder:
        ctx.folder = folder
        store = folder.store
        if folder.previous is not None and show_progress:
            print(f"--overwrite: the previous contents of {out} are now in {folder.previous}",
                  file=sys.stderr)
        if runner.on_stored is not None:  # artefacts written after their records: rebuilt on resume
            for key, record in store.records():
                runner.on_stored(ctx, key, record)
        # The tables cover everything in the folder: after an extension, the union config.
        report_ctx = ctx if folder.config == identity else replace(
            ctx, config=runner.config_from_identity(folder.config))
        # (when tables.md was last written, how long building it took)
        last_tables = [time.perf_counter(), 0.0]

        def write_tables(force: bool = False) -> list:
            # A report that is slow to build (PromptShift selects thresholds on validation) is
            # rebuilt less often, so it never costs more than about a tenth of the run.
            wait = max(TABLES_EVERY_S, 10 * last_tables[1])
            if not force and time.perf_counter() - last_tables[0] < wait:
                return []
            began = time.perf_counter()
            blocks = report_of(report_ctx, dict(store.records()))
            write_report(folder, blocks)  # tables.md and tables.json, from the one renderer
            last_tables[:] = [time.perf_counter(), time.perf_counter() - began]
            return blocks

        clock = cost.UnitClock()  # a unit's cost: since the previous record arrived (or its wave started)
        unit_seconds: list[float] = []

        def on_record(key: str, record: dict) -> None:
            nonlocal ran
            seconds, cpu_seconds = clock.lap()
            # Only finished units are ever stored (the store also skips older folders' failure
            # records when it loads them), so the store's records are the finished ones.
            if is_failure(record):  # never stored: a rerun retries the unit
                failed[key] = record["error"]
                return
            store.add(key, record)
            cost.record_unit(folder.path, key, seconds, cpu_seconds)
            unit_seconds.append(seconds)
            ran += 1
            if runner.on_stored is not None:
                runner.on_stored(ctx, key, record)
            write_tables()

        planned: set[str] = set()
        executor = None
        waves = True
        if show_progress:  # before any model loads: what will run and what it will cost
            print(planned_line(ctx, folder, dict(store.records())), file=sys.stderr, flush=True)
        try:
            if runner.prepare is not None:
                try:
                    runner.prepare(ctx)
                except UnitsFailed as exc:  # later units depend on these: no wave can run
                    failed.update(exc.failed)
                    waves = False
            while waves:
                finished = dict(store.records())
                # Typed unit specs travel with their keys to the units (no unit parses its key).
                wave, specs = planned_units(runner.plan(ctx, finished))
                planned.update(wave)
                todo = [k for k in wave if k not in finished and k not in failed]
                if options.unit_order_seed is not None:  # another batch layout, the same records
                    from ctrlsim.seeding import derive_rng

                    order = derive_rng(options.unit_order_seed, "unit-order").permutation(len(todo))
                    todo = [todo[i] for i in order]
                if max_units is not None:
                    todo = todo[:max(0, max_units - ran - len(failed))]
                if not todo:
                    break
                if executor is None:
                    executor = executor_from_options(options).__enter__()
                # The exchange settings travel with each unit (to a Ray worker too), not in the
                # environment; so do the unit context's settings and each unit's spec.
                unit_fn = partial(unit_with_exchange_settings, exchanges, partial(call_unit, runner.unit_fn))
                payload = UnitPayload(runner.payload(ctx), run_settings(ctx, in_units=True),
                                      {k: specs[k] for k in todo})
                clock.restart(in_process=executor.kind == "local")
                executor.run(unit_fn, payload, todo, on_record,
                             progress=show_progress, desc=f"{runner.name} {runner.unit_name}")
        except KeyboardInterrupt:  # Ctrl-C: stop now (no tables rebuilt); what finished is stored
            raise RunInterrupted(runner.name, out, len(store)) from None
        finally:
            if executor is not None:
                executor.close()
            cost.record_run(runner.name, cost.signature(identity, runner.extensible), unit_seconds)
        blocks = write_tables(force=True)
        records = dict(store.records())
        if options.figures and records:
            runner.figures(report_ctx, records)
        stored_config = dict(folder.config)
        summarise = partial(runner.summary, report_ctx, records) if runner.summary is not None else None
    return RunResult(runner.name, out, stored_config, records, render_markdown(blocks), failed,
                     planned=len(planned | set(failed)), ran=ran, seconds=time.perf_counter() - started,
                     context=ctx, summarise=summarise, report=blocks)


def planned_line(ctx: RunContext, folder: Any, finished: Mapping[str, dict]) -> str:
    """The runner's planned units and their estimated cost (`ctrlsim.experiments.cost`), from its
    plan on the finished records: called before any model loads."""
    runner = ctx.runner
    keys, _ = planned_units(runner.plan(ctx, finished))
    if not keys and runner.prepare is not None:
        return (f"{runner.name}: its {runner.unit_name} are planned once its driver-side phase has run "
                f"({len(finished)} finished)")
    sig = cost.signature(runner.identity(ctx), runner.extensible)
    estimate = cost.estimate(runner.name, sig, folder.path, finished)
    planned = set(keys)
    return cost.plan_line(runner.name, runner.unit_name, len(planned), len(planned & set(finished)), estimate)


def drive_sized(runner: Runner, config: Any, options: RunOptions, *, show_progress: bool = True,
                **drive_kwargs: Any) -> RunResult:
    """Run `config`, then add seeds in rounds until the headline intervals are `options.precision`
    narrow or `options.budget_minutes` is spent; writes sizing.json and returns the last round's result."""
    from ctrlsim.experiments import sizing as S
    from ctrlsim.experiments.report import rebuild_report

    precision, budget = options.precision, options.budget_minutes
    S.check_sizable(runner, config)
    assert precision is not None and budget is not None
    out = runner.out_for(options)
    started = time.perf_counter()
    stored = stored_seeds(out) if not options.overwrite else ()
    seeds = tuple(dict.fromkeys((*config.seeds, *stored)))
    rounds: list[dict] = []
    while True:
        round_started = time.perf_counter()
        config = replace(config, seeds=seeds)
        result = drive(runner, config, options, show_progress=show_progress, **drive_kwargs)
        options = replace(options, overwrite=False)  # the folder was set aside once, not every round
        if result.failed:
            return result
        intervals = S.headline_intervals(runner, config, result.records_by_key)
        widest = max(intervals, key=lambda i: i.half_width, default=None)
        elapsed = time.perf_counter() - started
        ran_seeds = len([s for s in seeds if s not in {x for r in rounds for x in r["seeds"]}])
        round_seconds = time.perf_counter() - round_started
        rounds.append({"seeds": list(seeds), "seconds": round(round_seconds, 1),
                       "max_half_width": widest.half_width if widest else None,
                       "widest": f"{widest.method} on {widest.box}" if widest else None})
        if widest is None:
            raise CtrlsimError(f"{runner.name}: the run holds no headline scores to size it by")
        if widest.half_width <= precision:
            stopped = S.STOP_PRECISION
            break
        if len(seeds) >= S.MAX_SEEDS:
            stopped = S.STOP_SEEDS
            break
        per_seed = seconds_per_seed(out, result, len(seeds), round_seconds, ran_seeds)
        add = S.seeds_to_add(len(seeds), per_seed, budget * 60 - elapsed)
        if add < 1:
            stopped = S.STOP_BUDGET
            break
        if show_progress:
            print(f"sized run: widest headline half-width {widest.half_width:.3f} > {precision:g} "
                  f"({widest.method} on {widest.box}, {len(seeds)} seeds); adding {add} seeds "
                  f"(~{per_seed:.0f} s each, {budget * 60 - elapsed:.0f} s of the budget left)",
                  file=sys.stderr, flush=True)
        seeds = (*seeds, *S.next_seeds(seeds, add))
    record = {"precision": precision, "budget_minutes": budget, "confidence": S.CONFIDENCE,
              "interval": "confidence sequence for a bounded mean (Waudby-Smith & Ramdas, hedged capital) "
                          "over per-seed means, per (method, box)",
              "stopped_by": stopped, "seconds": round(time.perf_counter() - started, 1), "rounds": rounds,
              "intervals": [i.to_dict() for i in intervals]}
    S.write_sizing(out, record)
    markdown, _ = rebuild_report([out], figures=False)  # tables.md now ends with the sized-run table
    result.markdown = markdown
    if show_progress:
        print(S.stop_sentence(record), file=sys.stderr, flush=True)
    return result


def seconds_per_seed(out: Path, result: RunResult, seeds: int, round_seconds: float,
                      ran_seeds: int) -> float:
    """Measured wall seconds one seed's units cost: this round's, else the folder's unit log."""
    if ran_seeds and result.ran:
        return round_seconds / ran_seeds
    from ctrlsim.experiments.cost import folder_seconds

    measured = folder_seconds(out, result.records_by_key)
    return sum(measured.values()) / seeds if measured else round_seconds / max(seeds, 1)


def stored_seeds(out: Path) -> tuple[int, ...]:
    try:
        stored = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    seeds = stored.get("config", {}).get("seeds") if isinstance(stored, dict) else None
    return tuple(int(s) for s in seeds) if isinstance(seeds, list) else ()


def exchange_settings(out: Path, options: RunOptions) -> ExchangeSettings:
    """A run's HTTP black boxes record their exchanges in `<out>/exchanges.jsonl` and, with
    `--replay RUN`, answer from RUN's recorded exchanges (`ctrlsim.recommenders.http.client`)."""
    replay = None
    if options.replay is not None:
        recorded = Path(options.replay)
        replay = str((recorded / "exchanges.jsonl" if recorded.is_dir() else recorded).resolve())
    # Absolute, never resolved: opened by this path with O_NOFOLLOW, a link planted there is refused.
    return ExchangeSettings(str(Path(out).absolute() / "exchanges.jsonl"), replay, options.replay_unverified)


def run(protocol: str, /, out: str | Path | None = None, *, config: Any = None,
        options: RunOptions | None = None, show_progress: bool = True, raise_on_failure: bool = True,
        resources: Mapping[str, Any] | None = None, llms: Mapping[str, Any] | None = None,
        max_units: int | None = None, **config_fields: Any) -> RunResult:
    """Run any registered protocol from Python, with the CLI's resume and failure policy.

    `ctrlsim.run("probe", out="results/p", agents=4, rounds=5)` builds the protocol's config from
    the keyword arguments (unknown names are an error), runs or resumes it in `out`, and returns
    the `RunResult` (`records`, `tables` as DataFrames, the protocol's `summary`). A typed config
    goes in whole as `config=` (then no other config field). Failed units raise `RunFailedError`
    (its `result` keeps what finished) unless `raise_on_failure=False`. `llms` maps specs to
    loaded LLMs (tests and benchmarks share one model); `max_units` stops after that many new
    units, as an interruption would. `protocol` is positional only, so a config field of that
    name (`ctrlsim.run("calibrate", protocol="steereval")`) is a config field.
    """
    from ctrlsim.experiments.config import config_from_dict
    from ctrlsim.experiments.runner import get_runner

    runner = get_runner(protocol)
    if config is None:
        config = config_from_dict(runner.config_cls, with_presets(runner, config_fields))
    elif config_fields:
        from ctrlsim.errors import ConfigError

        raise ConfigError(f"ctrlsim.run: give config= or config fields, not both ({sorted(config_fields)})")
    elif not isinstance(config, runner.config_cls):
        from ctrlsim.errors import ConfigError

        raise ConfigError(f"ctrlsim.run({protocol!r}): config= must be a {runner.config_cls.__name__}, "
                          f"got {type(config).__name__}")
    options = options or RunOptions()
    if out is not None:
        options = replace(options, out=str(out))
    if options.precision is not None or options.budget_minutes is not None:
        result = drive_sized(runner, config, options, show_progress=show_progress, resources=resources,
                             llms=llms, max_units=max_units)
    else:
        result = drive(runner, config, options, show_progress=show_progress, resources=resources, llms=llms,
                       max_units=max_units)
    if result.failed and raise_on_failure:
        raise RunFailedError(result)
    return result


def with_presets(runner: Runner, fields: dict[str, Any]) -> dict[str, Any]:
    """Config fields with a `preset=` name replaced by the runner's preset (fields given win)."""
    fields = dict(fields)
    preset = fields.pop("preset", None)
    if preset is None:
        return fields
    if preset not in runner.presets:
        from ctrlsim.errors import ConfigError

        raise ConfigError(f"{runner.name}: unknown preset {preset!r}; presets: {', '.join(runner.presets)}")
    return {**runner.presets[preset], **fields}


def print_failures(result: RunResult) -> None:
    if result.failed:
        print(failure_summary(result), file=sys.stderr)
