"""The runner contract: what a protocol declares; `ctrlsim.experiments.driver` does the rest.

A runner names

* its **config** dataclass (flags are generated from it; it validates itself in `__post_init__`),
* `check(config)`: the up-front checks that need data (tags exist, users suffice, a roster file
  parses); every model spec field named in `llm_fields` is checked by the driver as well,
  before the first model loads,
* `plan(config, finished)`: the units to run now, as typed specs (small frozen dataclasses, each
  with its `key`, the string its record is stored under) or plain key strings. The driver calls
  it again after each wave until it names no unit that is not finished, so a runner whose later
  units depend on earlier records (evolve) plans them in waves; most plan every unit at once,
* `payload(ctx)`: the picklable object the unit function receives (default: the config),
* `unit_fn(payload, unit) -> record`: a top-level, pure function of the payload and the unit (see
  `executor`). `unit` is the unit's `context.UnitContext`: its `key` and typed `spec` (no unit
  parses its key back), and the one way to get a `dataset`, `box`, `llm` or `encoder` (built once
  per worker process, one response-cache policy) and a `progress` bar. Driver-side hooks get the
  same from `ctx.unit`,
* `report(ctx, records)`: the report as data, a list of `tables.Table` (title, a DataFrame of
  cells, the prose around it) and `tables.Text` (free prose) blocks. The driver renders tables.md
  from it (`tables.render_markdown`, one renderer for every runner), writes the same data to
  tables.json, and `RunResult.tables` returns its DataFrames; `figures(ctx, records)`: the PNGs,
* `summary(ctx, records)` (optional): what else the run returns to Python (`RunResult.summary`),

plus how the config is stored (`identity`), which tuple fields may grow in an existing run
folder (`extensible`, e.g. seeds), and driver-side hooks. `RUNNERS` is the one table of
runners; the CLI builds its subcommands from it.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ctrlsim.errors import ConfigError

if TYPE_CHECKING:
    from ctrlsim.experiments.config import RunOptions
    from ctrlsim.experiments.context import UnitContext
    from ctrlsim.experiments.runfolder import RunFolder
    from ctrlsim.experiments.scores import Scores


@dataclass
class RunContext:
    """What the driver hands a runner's hooks: the config, the options and (once open) the folder."""

    runner: Runner
    config: Any
    options: RunOptions
    folder: RunFolder | None = None
    show_progress: bool = True
    # Runner-private values computed once per run (dataset sizes, the user sample, ...).
    state: dict[str, Any] = field(default_factory=dict)
    # Live objects passed through the Python API (tests and benchmarks share a loaded LLM).
    resources: dict[str, Any] = field(default_factory=dict)

    def given_llm(self, spec: str) -> Any | None:
        """The loaded LLM `ctrlsim.run(..., llms={spec: llm})` supplied for `spec`, if any."""
        return self.resources.get("llms", {}).get(spec)

    @property
    def unit(self) -> UnitContext:
        """The unit context of the driver's own process (checks, `prepare`, the evolution loop):
        the same acquisition paths and caches the units use (the run folder's once it is open)."""
        from ctrlsim.experiments.context import UnitContext, run_settings

        return UnitContext(run_settings(self, in_units=False))


def _config_identity(ctx: RunContext) -> dict:
    from ctrlsim.experiments.config import config_to_dict

    return config_to_dict(ctx.config)


def _plan_nothing(ctx: RunContext, finished: Mapping[str, dict]) -> list[str]:
    return []


def _payload_is_config(ctx: RunContext) -> Any:
    return ctx.config


def _no_check(ctx: RunContext) -> None:
    return None


def _no_figures(ctx: RunContext, records: Mapping[str, dict]) -> None:
    return None


@dataclass(frozen=True)
class Observation:
    """A protocol's one observation function and what a caller needs around it: `ctrlsim calibrate`
    and the audit observe any protocol through this declaration (`Runner.observation`) instead of
    re-writing its loop or importing its package.

    Each function takes the calibration's config (`cal`: the fields a protocol reads, such as
    `targets`, `tags`, `users`, `seeds`, `llm`) and one (method, box, seed):

    * `config_for(cal, method, box, seed)`: the protocol's own config for that unit (validated);
    * `observe(cal, method, box, seed, unit)`: `{"values": metric -> observation id -> value,
      "known": ..., "details": ..., "box_identity", "llm", ...}`, acquiring everything through the
      caller's `UnitContext` `unit` (so its replies go to the caller's response caches);
    * `check(cal, method, box, unit)`: the data checks, before any model loads;
    * `cache_uses(cal, methods, boxes)`: what the protocol keeps under $CTRLSIM_CACHE itself, and
      `llms(cal, methods, boxes)`: the LLMs the observations load;
    * `check_methods(methods)`, `check_compare(box)`: the methods and compared boxes it takes.
    """

    config_for: Callable[..., Any]
    observe: Callable[..., dict]
    check: Callable[[Any, str, str, Any], None]
    cache_uses: Callable[[Any, tuple, list], dict]
    llms: Callable[[Any, tuple, list], list]
    check_methods: Callable[[tuple], None]
    check_compare: Callable[[str], None]
    metrics: tuple[str, ...]  # the first is the one a calibration's resolution and placement use
    default_methods: tuple[str, ...]
    dial_kind: str  # the spec prefix of the protocol's reference boxes of known controllability
    # Metrics whose values are shares in [0, 1]: their intervals are bounded bootstraps
    # (docs/statistics.md); the others get Student t intervals.
    share_metrics: tuple[str, ...] = ()


@dataclass(frozen=True)
class Runner:
    """One protocol's declaration (see the module docstring)."""

    name: str
    config_cls: type
    description: str
    unit_fn: Callable[[Any, UnitContext], dict]
    plan: Callable[[RunContext, Mapping[str, dict]], list] = _plan_nothing  # specs or key strings
    report: Callable[[RunContext, Mapping[str, dict]], list] = lambda ctx, records: []
    figures: Callable[[RunContext, Mapping[str, dict]], None] = _no_figures
    check: Callable[[RunContext], None] = _no_check
    payload: Callable[[RunContext], Any] = _payload_is_config
    identity: Callable[[RunContext], dict] = _config_identity
    # Tuple fields whose new values extend a run folder (new units run, finished ones stay).
    extensible: tuple[str, ...] = ()
    # Config fields holding LLM specs (a string or a tuple of strings), checked before any loading.
    llm_fields: tuple[str, ...] = ()
    # Fields every finished record has: a stored record without one is damaged and its unit reruns.
    record_fields: tuple[str, ...] = ()
    # LLM fields that also take a dial spec (`dial:<lambda>`, a reference generator with no model).
    dial_fields: tuple[str, ...] = ()
    # Config fields holding text-encoder specs, resolved (not loaded) before any loading.
    encoder_fields: tuple[str, ...] = ()
    # Driver-side hooks: before the first wave (folder open) and after each stored record.
    prepare: Callable[[RunContext], None] | None = None
    on_stored: Callable[[RunContext, str, dict], None] | None = None
    # CLI extras: a preset table (`--preset NAME`) and the default of `--out`.
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    default_out: str = ""
    unit_name: str = "units"
    # The values the run gives to config fields left open (a slate size per box, a threshold), which
    # unit results depend on: stored in the run's provenance, so a changed default refuses a resume.
    resolved: Callable[[RunContext], dict] | None = None
    # The config a stored identity describes, where `identity` is not the plain config dict.
    from_identity: Callable[[Mapping[str, Any]], Any] | None = None
    # The protocol's own result beside records and tables (`RunResult.summary`): evolve's final
    # roster, SteerEval's token totals, PromptShift's selected settings.
    summary: Callable[[RunContext, Mapping[str, dict]], dict] | None = None
    # The protocol's observation function, for calibration and the audit (see `Observation`).
    observation: Observation | None = None
    # Per-observation scores for the reliability tools: noise runs, probe-model sensitivity, sized
    # runs (`ctrlsim.experiments.scores`).
    scores: Scores | None = None
    # The cost table's unit (`ctrlsim.experiments.cost.table`): what one decision is ("one probe's
    # choice on one slate") and how many a stored record holds, `decisions(config, key, record)`.
    decision_name: str = ""
    decisions: Callable[[Any, str, dict], int | None] | None = None

    def out_for(self, options: RunOptions) -> Path:
        return Path(options.out or self.default_out or f"results/{self.name}")

    def config_from_identity(self, identity: Mapping[str, Any]) -> Any:
        """The config a stored identity describes (fields the config does not have are ignored)."""
        from ctrlsim.experiments.config import config_from_dict

        if self.from_identity is not None:
            return self.from_identity(identity)
        names = {f.name for f in dataclasses.fields(self.config_cls) if f.init}
        return config_from_dict(self.config_cls, {k: v for k, v in identity.items() if k in names})


# The one table of runners: name -> module defining `RUNNER`. Modules load on first use, so
# `ctrlsim --help` and `ctrlsim info` import none of them.
RUNNER_MODULES: dict[str, str] = {
    "probe": "ctrlsim.experiments.probe.runner",
    "ctrlbench": "ctrlsim.experiments.ctrlbench.runner",
    "evolve": "ctrlsim.experiments.evolve.runner",
    "steereval": "ctrlsim.experiments.steereval.runner",
    "promptshift": "ctrlsim.experiments.promptshift.runner",
    "calibrate": "ctrlsim.experiments.calibrate.runner",
    "train-probe": "ctrlsim.experiments.train_probe.runner",
    "controls": "ctrlsim.experiments.controls.runner",
}


# Runners registered at run time (a user's own protocol): name -> Runner.
_REGISTERED: dict[str, Runner] = {}


def register_runner(runner: Runner) -> Runner:
    """Make `runner` available to `ctrlsim.run(runner.name, ...)` and `get_runner` (returns it)."""
    if not isinstance(runner, Runner):
        raise ConfigError(f"register_runner needs a Runner, got {type(runner).__name__}")
    if runner.name in RUNNER_MODULES:
        raise ConfigError(f"runner name {runner.name!r} is taken by a built-in runner")
    _REGISTERED[runner.name] = runner
    return runner


def runner_names() -> list[str]:
    """Every runner `get_runner` knows: the built-in ones, then those registered."""
    return [*RUNNER_MODULES, *_REGISTERED]


def get_runner(name: str) -> Runner:
    """The registered runner `name` (a `ConfigError` names the known ones)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in RUNNER_MODULES:
        raise ConfigError(f"unknown protocol {name!r}; runners: {', '.join(runner_names())}")
    runner = importlib.import_module(RUNNER_MODULES[name]).RUNNER
    if not isinstance(runner, Runner) or runner.name != name:
        raise ConfigError(f"{RUNNER_MODULES[name]}.RUNNER is not the Runner {name!r}")
    return runner
