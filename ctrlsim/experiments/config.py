"""One config system for every runner: typed dataclasses, CLI flags generated from them.

A runner's config is a dataclass whose fields declare their own help text, bounds and choices,
once (`option`); `check_fields` enforces them and the CLI help names them, so a bound is never
written twice. `__post_init__` keeps only the rules that tie fields together::

    @dataclass(frozen=True)
    class MyConfig:
        users: int = option(8, "users per slice", low=1, high=MAX_USERS)
        rating: str = option("digits", "LLM score", choices=("digits", "generate"))

        def __post_init__(self):
            check_fields(self)

`add_config_arguments(parser, MyConfig)` turns every field into a `--users`-style flag whose
default is the dataclass default (so CLI and config defaults cannot disagree), and
`config_from_args(MyConfig, args)` builds the instance, which validates itself in
`__post_init__` before any model loads. Tuples are comma-separated on the command line.

`RunOptions` holds what does not change results (where to write, how to execute); it is
kept out of the config that identifies a run, so resuming on another executor or into a
copied folder works.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import numbers
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, TypeVar

from ctrlsim.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class RunOptions:
    """Options every runner takes that do not change its results."""

    out: str | None = field(default=None, metadata={"help": "run folder (config.json, records.jsonl, "
                                                            "tables.md, figures/); rerun to resume"})
    overwrite: bool = field(default=False, metadata={"help": "discard an existing run folder's records"})
    replay: str | None = field(default=None, metadata={
        "help": "answer HTTP black boxes from the exchanges recorded in this earlier run folder (or its "
                "exchanges.jsonl); no request leaves the machine. The log is checked first: an answer "
                "edited since it was recorded, or lines without digests, refuse the replay"})
    replay_unverified: bool = field(default=False, metadata={
        "help": "--replay a log that fails its check (edited, or recorded before ctrlsim wrote digests); "
                "the run's provenance.jsonl records that it was not verified, and why"})
    allow_code_change: bool = field(default=False, metadata={
        "help": "resume a run folder written by other ctrlsim code or library versions (recorded in its "
                "provenance.jsonl); changed inputs or resolved defaults are still refused"})
    executor: str = field(default="local", metadata={"help": "where units of work run",
                                                     "choices": list(EXECUTORS)})
    ray_address: str | None = field(default=None, metadata={
        "help": "Ray cluster: 'auto' or host:port (default: a local Ray started in-process)"})
    shared_cache: str | None = field(default=None, metadata={
        "help": "a folder whose response cache every run given it shares (LLM replies are kept in the "
                "run folder and there; a rerun in a new folder replays them for free)"})
    precision: float | None = field(default=None, metadata={
        "help": "a sized run: add seeds in rounds until every headline interval (a 95%% confidence sequence "
                "of the headline share per method and box) has at most this half-width, e.g. 0.05; needs "
                "--budget-minutes (docs/statistics.md)"})
    budget_minutes: float | None = field(default=None, metadata={
        "help": "the minutes a sized run (--precision) may spend; it stops before a round that would not "
                "fit, and sizing.json says which stopped it"})
    # Drawing the figures is most of what a fully cached rerun costs (matplotlib's import alone
    # is about 0.35 s); sweeps that only need records and tables can skip them.
    figures: bool = field(default=True, metadata={"help": "write figures/*.png; '--figures false' skips "
                                                          "them (and matplotlib)"})
    # A unit is a pure function of (config, key), so the order its wave runs in changes no record;
    # another order is another batch layout (what shares a model, a KV cache, a reply batch), which
    # `ctrlsim noise` varies to measure the noise floor.
    unit_order_seed: int | None = field(default=None, metadata={
        "help": "run each wave's units in an order shuffled with this seed (changes no record; "
                "`ctrlsim noise` reruns a run so); none: the plan's order"})

    def __post_init__(self):
        check_choice("executor", self.executor, EXECUTORS)
        if self.unit_order_seed is not None:
            check_integer("unit_order_seed", self.unit_order_seed)
            check_range("unit_order_seed", self.unit_order_seed, low=0, high=MAX_SEED)
        if self.replay is not None:
            recorded = Path(self.replay)
            log = recorded / "exchanges.jsonl" if recorded.is_dir() else recorded
            if not log.is_file():
                raise ConfigError(f"--replay {self.replay!r}: no recorded exchanges at {log}")
        elif self.replay_unverified:
            raise ConfigError("--replay-unverified goes with --replay RUN: it lets that replay answer from a "
                              "log that fails its check")
        if self.ray_address is not None and self.executor != "ray":
            raise ConfigError(f"--ray-address {self.ray_address!r} needs --executor ray")
        if self.out is not None:
            check_output_dir(self.out)
        if (self.precision is None) != (self.budget_minutes is None):
            raise ConfigError("--precision and --budget-minutes go together: the wanted half-width of the "
                              "headline intervals and the minutes a sized run may spend reaching it")
        if self.precision is not None:
            check_range("precision", self.precision, low=1e-6, high=0.5)
            check_range("budget_minutes", self.budget_minutes, low=0.01, high=10_000_000)
        if self.shared_cache is not None and Path(self.shared_cache).expanduser().is_file():
            raise ConfigError(f"--shared-cache {self.shared_cache!r} is a file; give a folder (its "
                              "llm-cache.sqlite is the shared response cache)")


# ----------------------------------------------------------------------------- validation helpers

def check_range(name: str, value, *, low=None, high=None) -> None:
    """`low <= value <= high` (either bound optional); bools are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if value != value:
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ConfigError(f"{name} must be in {bounds}, got {value!r}")


# A ctrlbench episode succeeds (pass^k) when it found at least 5% of its target's items by the last
# round: a bar the oracle probe clears on a box that follows its likes at the default sizes (4 rounds
# of 3 items, War+Film-Noir), and the random probe rarely does (docs/statistics.md, "pass^k"). Shared
# by ctrlbench and its calibration.
DEFAULT_SUCCESS = 0.05


# Upper bounds of the counts every runner takes: far above any real experiment (the papers use at
# most 100 probes, 20 rounds, 600 users, 100-item pools), low enough that a typo such as 1e12 fails
# at once with exit code 2 naming the field and the bound, instead of hanging or exhausting memory.
# Each field's help names its bound.
MAX_AGENTS = 100_000        # probes in a population
MAX_ROUNDS = 10_000         # interaction rounds, memory rounds, checkpoints
MAX_MERGES = 64             # fusions (each halves the population: 2**64 probes are never there)
MAX_SLATE = 10_000          # items per slate, per list, per cut-off
MAX_USERS = 1_000_000       # users sampled or per tag
MAX_ITEMS = 10_000_000      # pool sizes, history lengths, ratings a user needs, target sizes
MAX_SAMPLES = 1_000_000     # scenarios sampled per table cell
MAX_TOKENS = 1_048_576      # a reply budget: above every model's context window
MAX_STATES = 1_000_000      # states a search may explore per probe (the probe ceiling keeps them)
MAX_SEED = 2**63 - 1        # seeds stay int64, as the tables and JSON readers store them


def bound(high: int) -> str:
    """A field's help suffix naming its upper bound, e.g. "at most 100,000"."""
    return f"at most {high:,}"


# Constraint keys a field's metadata may carry (`option`), read by `check_fields` and the CLI help.
CONSTRAINTS = ("low", "high", "choices", "nonempty")


def option(default: Any = dataclasses.MISSING, help: str = "", *, low: float | None = None,
           high: float | None = None, choices: Iterable | None = None, nonempty: bool = False,
           default_factory: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A config field with its help text and its constraints, declared once.

    `low`/`high` bound a number (every element of a tuple); `choices` names the allowed values (of
    every element of a tuple, which may then repeat none); `nonempty` requires a tuple to hold at
    least one value. A field typed `X | None` may also be None. Other metadata (`omit_default`,
    ...) passes through."""
    meta = {"help": help, **metadata}
    for key, value in (("low", low), ("high", high)):
        if value is not None:
            meta[key] = value
    if choices is not None:
        meta["choices"] = list(choices)
    if nonempty:
        meta["nonempty"] = True
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _integer_typed(tp) -> bool:
    """Whether a field's type holds integers: `int`, `int | None` or `tuple[int, ...]`."""
    tp, _ = _unwrap_optional(tp)
    if typing.get_origin(tp) in (tuple, list):
        return all(a is int for a in typing.get_args(tp) if a is not Ellipsis)
    return tp is int


def check_integer(name: str, value) -> None:
    """An integer (numpy's too), never a bool or a float that happens to be whole."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {value!r}")


def check_fields(config) -> None:
    """Every declared constraint of `config`'s fields (see `option`), in field order; a bounded
    field typed `int` (or a tuple of them) also holds integers only."""
    hints = _hints(config.__class__)
    for f in dataclasses.fields(config):
        meta = f.metadata
        if not any(key in meta for key in CONSTRAINTS):
            continue
        value = getattr(config, f.name)
        if value is None:
            continue  # an open field (typed `X | None`): the run resolves it
        if ("low" in meta or "high" in meta) and _integer_typed(hints[f.name]):
            for item in value if isinstance(value, (tuple, list)) else (value,):
                check_integer(f.name, item)
        if isinstance(value, (tuple, list)):
            if "choices" in meta:
                check_choices(f.name, value, meta["choices"], allow_empty=not meta.get("nonempty"))
            elif meta.get("nonempty") and not value:
                raise ConfigError(f"{f.name} needs at least one value")
            if "low" in meta or "high" in meta:
                for item in value:
                    check_range(f.name, item, low=meta.get("low"), high=meta.get("high"))
        else:
            if "choices" in meta:
                check_choice(f.name, value, meta["choices"])
            if "low" in meta or "high" in meta:
                check_range(f.name, value, low=meta.get("low"), high=meta.get("high"))


def constraint_help(meta: Mapping[str, Any]) -> str:
    """The help text a field's constraints add: its range or upper bound, and its choices."""
    parts = []
    low, high = meta.get("low"), meta.get("high")
    if high is not None and isinstance(high, int) and (low is None or low in (0, 1)):
        parts.append(bound(high))
    elif low is not None or high is not None:
        parts.append(f"in [{'-inf' if low is None else low}, {'inf' if high is None else high}]")
    if meta.get("choices"):
        parts.append(f"one of: {', '.join(map(str, meta['choices']))}")
    return "; ".join(parts)


def check_choice(name: str, value, choices: Iterable) -> None:
    choices = list(choices)
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_choices(name: str, values: Iterable, choices: Iterable, *, allow_empty: bool = False) -> None:
    """Every value known, none repeated, and (unless allowed) at least one."""
    values, choices = list(values), list(choices)
    if not values and not allow_empty:
        raise ConfigError(f"{name} needs at least one value (choose from {', '.join(map(str, choices))})")
    unknown = [v for v in values if v not in choices]
    if unknown:
        raise ConfigError(f"{name}: unknown value(s) {', '.join(map(repr, unknown))}; "
                          f"choose from {', '.join(map(str, choices))}")
    repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
    if repeated:
        raise ConfigError(f"{name}: value(s) given more than once: {', '.join(map(repr, repeated))}")


def check_known_methods(protocol: str, methods: Iterable[str], known: Iterable[str]) -> None:
    """Every method is one `protocol` takes (a calibration's or an audit's methods)."""
    known = list(known)
    wrong = [m for m in methods if m not in known]
    if wrong:
        raise ConfigError(f"methods: protocol {protocol} does not take {', '.join(map(repr, wrong))}; "
                          f"its methods are {', '.join(known)}")


def check_output_dir(path: str | Path) -> None:
    """The run folder can be created and written: checked before any work is done."""
    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"output {str(path)!r}: {str(parent)!r} is a file, not a folder")
            import tempfile

            try:  # a real write: access() says yes to root on read-only mounts and sysfs
                tempfile.TemporaryFile(dir=parent).close()
            except OSError as exc:
                raise ConfigError(f"output {str(path)!r}: {str(parent)!r} is not writable "
                                  f"({exc.strerror})") from None
            return


# ----------------------------------------------------------------------------- dataclass <-> CLI / JSON

@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # once per class: `check_fields` runs on every config made


def _unwrap_optional(tp) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _scalar_parser(tp, flag: str):
    if tp is bool:
        return _parse_bool
    if tp in (int, float, str):
        def parse(text: str, _tp=tp):
            try:
                return _tp(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{flag}: expected {_tp.__name__}, got {text!r}") from None
        return parse
    raise TypeError(f"{flag}: unsupported config field type {tp!r}")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _field_parser(tp, flag: str):
    tp, optional = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis] or [str]
        item = _scalar_parser(args[0], flag)

        def parse_seq(text: str):
            if optional and text.strip().lower() in ("", "none"):
                return None
            return tuple(item(part.strip()) for part in text.split(",") if part.strip())
        return parse_seq
    if origin is not None:  # dict and other containers stay config-only
        return None
    scalar = _scalar_parser(tp, flag)
    if not optional:
        return scalar

    def parse_optional(text: str):
        return None if text.strip().lower() in ("", "none") else scalar(text)
    return parse_optional


def add_config_arguments(parser: argparse.ArgumentParser, cls, *, skip: Iterable[str] = (),
                         group: str | None = None) -> None:
    """Add one `--field-name` flag per dataclass field (containers other than tuples are skipped)."""
    hints = _hints(cls)
    target: argparse._ActionsContainer = parser  # a parser or one of its argument groups
    if group:
        target = parser.add_argument_group(group)
    for f in dataclasses.fields(cls):
        if f.name in set(skip) or not f.init:
            continue
        flag = "--" + f.name.replace("_", "-")
        parse = _field_parser(hints[f.name], flag)
        if parse is None:
            continue
        default = _default_of(f)
        shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else default
        help_text = f.metadata.get("help", "")
        constraints = constraint_help(f.metadata)
        if constraints:
            help_text = f"{help_text} ({constraints})".strip()
        bare_bool = hints[f.name] is bool
        target.add_argument(flag, dest=f.name, type=parse, default=argparse.SUPPRESS,
                            nargs="?" if bare_bool else None, const=True if bare_bool else None,
                            metavar=None if bare_bool else f.name.upper(),
                            help=f"{help_text} [default: {shown}]".strip())


def _default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def config_from_args(cls: type[C], args: argparse.Namespace, **overrides) -> C:
    """Build (and so validate) `cls` from parsed flags; fields not given keep their defaults."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(overrides)
    return cls(**values)


def config_to_dict(config) -> dict:
    """A JSON-able dict of a config dataclass (tuples become lists; nested dataclasses too).

    A field added after runs were stored (metadata `omit_default=True`) is left out while it holds
    its default, so run folders written before it resume and their records stay identical."""
    data = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    for f in dataclasses.fields(config):
        if f.metadata.get("omit_default") and getattr(config, f.name) == _default_of(f):
            data.pop(f.name, None)
    return data


def config_from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
    """The inverse of `config_to_dict`: unknown keys are an error, lists become tuples where typed so."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    hints, values = _hints(cls), {}
    for key, value in data.items():
        tp, _ = _unwrap_optional(hints[key])
        if typing.get_origin(tp) is tuple and isinstance(value, list):
            value = tuple(value)
        values[key] = value
    return cls(**values)


def runner_parser(prog: str, description: str | None, config_cls) -> argparse.ArgumentParser:
    """A runner's parser: one flag per field of its config, then the `RunOptions` group."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, config_cls)
    add_config_arguments(parser, RunOptions, group="run options")
    return parser
