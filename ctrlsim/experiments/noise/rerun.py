"""The rerun of a noise run: a finished run's config, run again into a new folder in another batch layout.

What changes, and why none of it may change a record (a unit is a pure function of its config and
key): the units of each wave run in an order shuffled with `order_seed` (`RunOptions.unit_order_seed`),
and every LLM spec of the runner's `llm_fields` that runs on llama.cpp decodes `parallel` sequences
side by side instead of its own width (`n_parallel`, a runtime setting carried by the spec). The
default, 1, computes every reply alone on llama.cpp's sequential path, unlike the parallel batches
of the default profile whatever the size of a call; a width between would only re-split calls
holding more conversations than it. Specs on other runtimes (a server, transformers, vLLM) and
`dial:` reference generators stay as they are; the executor has no worker count to change (`local`
runs units one at a time, Ray places its tasks itself).

No reply is replayed from the original run: the new folder starts with an empty response cache of
its own, no `--shared-cache` and no `--replay` is given, and personas are the new folder's own. Only
what every run on the machine shares stays: the parsed dataset, trained box weights, the bundled
models, evolved method artefacts and the text encoder's embedding cache (`$CTRLSIM_CACHE`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import MAX_SEED, RunOptions, check_integer, check_range

if TYPE_CHECKING:
    from ctrlsim.experiments.driver import RunResult
    from ctrlsim.experiments.runner import Runner

# llama.cpp's width in the rerun. The default profile decodes many sequences side by side; 1 is
# the sequential path (each reply alone, in the model's own context), a layout unlike any parallel
# batch whatever a call's size. A width in between only re-splits calls of more conversations than it.
DEFAULT_PARALLEL = 1
DEFAULT_ORDER_SEED = 1   # the seed of the rerun's unit order


@dataclass(frozen=True)
class SpecChange:
    """One LLM spec of the run's config and what the rerun gives it."""

    field: str
    before: str | None
    after: str | None
    why: str

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def to_dict(self) -> dict:
        return {"field": self.field, "before": self.before, "after": self.after, "changed": self.changed,
                "why": self.why}


def llamacpp_width(spec: str) -> int:
    """The `n_parallel` a llama.cpp spec decodes with (its setting, else the default profile's)."""
    from ctrlsim.backends.llamacpp.profile import DEFAULT_PROFILE, PROFILES, split_profile
    from ctrlsim.backends.specs import parse_spec

    _, target = parse_spec(spec.strip())
    _, profile = split_profile(target)
    return (profile or PROFILES[DEFAULT_PROFILE]).n_parallel


def spec_change(name: str, spec: str | None, parallel: int) -> SpecChange:
    """What the rerun does with the spec `spec` of config field `name`."""
    from ctrlsim.backends.specs import runtime_of, with_llamacpp_settings
    from ctrlsim.recommenders.dial import is_dial

    if spec is None:
        return SpecChange(name, None, None, "not set: the component's own default runs unchanged")
    if is_dial(spec):
        return SpecChange(name, spec, spec, "a dial reference generator: no model, nothing batched")
    runtime = runtime_of(spec)
    if runtime != "llamacpp":
        return SpecChange(name, spec, spec, f"runs on {runtime}: its batching is not a setting of the spec")
    width = llamacpp_width(spec)
    if width == parallel:
        raise ConfigError(f"--parallel {parallel}: {name} ({spec!r}) already decodes {width} sequences "
                          "side by side; give another width so the rerun batches its replies differently")
    return SpecChange(name, spec, with_llamacpp_settings(spec, n_parallel=parallel),
                      f"llama.cpp: n_parallel {width} -> {parallel}")


def spec_changes(runner: Runner, config: Any, parallel: int) -> list[SpecChange]:
    """One `SpecChange` per LLM spec in the runner's `llm_fields` (each element of a tuple field)."""
    changes: list[SpecChange] = []
    for name in runner.llm_fields:
        value = getattr(config, name)
        specs = value if isinstance(value, (tuple, list)) else (value,)
        changes.extend(spec_change(name, spec, parallel) for spec in specs)
    return changes


def rerun_config(runner: Runner, config: Any, changes: list[SpecChange]) -> Any:
    """`config` with every changed spec replaced (validated again, as any config is)."""
    values: dict[str, Any] = {}
    for name in runner.llm_fields:
        value = getattr(config, name)
        after = {c.before: c.after for c in changes if c.field == name}
        if isinstance(value, (tuple, list)):
            values[name] = type(value)(after.get(spec, spec) for spec in value)
        else:
            values[name] = after.get(value, value)
    return replace(config, **values)


def renamed_specs(changes: list[SpecChange]) -> dict[str, str]:
    """Rerun spec -> original spec, for every changed spec (keys and boxes of the rerun's score rows
    that name an LLM, e.g. PromptShift's `<llm>/<user>`, are mapped back to pair with the run's)."""
    return {c.after: c.before for c in changes if c.changed and c.after and c.before}


@dataclass
class NoiseRerun:
    """A run and its rerun: the original's runner, config and records, and what the rerun changed."""

    run: Path
    out: Path
    runner: Runner
    config: Any
    records: dict[str, dict]
    rerun_config: Any
    changes: list[SpecChange]
    parallel: int
    order_seed: int
    executor: str
    result: RunResult = field(repr=False)

    def about(self) -> dict:
        """What was rerun and what changed (the head of noise.json)."""
        executor = ("local: units one at a time in this process, no worker count to change"
                    if self.executor == "local" else "ray: Ray places the tasks, no worker count to change")
        return {
            "runner": self.runner.name, "run": str(self.run.resolve()), "rerun": str(self.out.resolve()),
            "run_records": len(self.records), "rerun_records": len(self.result.records_by_key),
            "changed": {"unit_order_seed": self.order_seed, "parallel": self.parallel,
                        "specs": [c.to_dict() for c in self.changes], "executor": executor},
            "provenance_differences": provenance_differences(self.run, self.out),
            "caches": {
                "shared_response_cache": False,
                "llm_replies": "the rerun's own (its folder's llm-cache.sqlite, empty when the rerun began; "
                               "no --shared-cache, no --replay): every reply was generated again",
                "personas": "the rerun's own (profiles.sqlite in its folder)",
                "shared_by_every_run": "the parsed dataset, trained box weights, bundled models, evolved "
                                       "method artefacts and text-encoder embeddings ($CTRLSIM_CACHE) are "
                                       "reused: the noise of those computations is not measured",
            },
        }


def provenance_differences(run: Path, out: Path) -> list[str]:
    """How the rerun's recorded inputs and code differ from the run's (`provenance.resume_changes`), one
    line each: a rerun with other code, libraries or input files measures those changes too."""
    from ctrlsim.experiments.provenance import PROVENANCE, read_entries, resume_changes

    then, now = read_entries(run / PROVENANCE), read_entries(out / PROVENANCE)
    if not then or not now:
        missing = run if not then else out
        return [f"{missing} records no provenance: whether code or inputs changed is unknown"]
    refused, code = resume_changes(then[-1], now[-1])
    return refused + code


def check_folders(run: Path, out: Path) -> None:
    """`run` is a run folder and `out` is not it (before anything is read or run)."""
    if not run.is_dir() or not (run / "config.json").is_file() or not (run / "records.jsonl").is_file():
        raise ConfigError(f"{str(run)!r} is not a run folder (it needs config.json and records.jsonl)")
    if out.resolve() == run.resolve():
        raise ConfigError(f"--out {str(out)!r} is the run itself: a noise run writes a new run folder "
                          "(its own response cache), never into the one it measures")


def check_settings(parallel: int, order_seed: int) -> None:
    from ctrlsim.backends.llamacpp.llm import MAX_SEQUENCES

    check_integer("--parallel", parallel)
    # one llama.cpp context holds MAX_SEQUENCES sequences; a stream per parallel one needs one more
    check_range("--parallel", parallel, low=1, high=MAX_SEQUENCES - 1)
    check_integer("--order-seed", order_seed)
    check_range("--order-seed", order_seed, low=0, high=MAX_SEED)


def rerun(run: str | Path, out: str | Path, *, parallel: int = DEFAULT_PARALLEL,
          order_seed: int = DEFAULT_ORDER_SEED, executor: str = "local", ray_address: str | None = None,
          figures: bool = False, allow_code_change: bool = False, show_progress: bool = True) -> NoiseRerun:
    """Run (or resume) the rerun of `run` into `out` (see the module docstring). Failed units raise
    `RunFailedError` (what finished is stored; the same call retries them)."""
    from ctrlsim.experiments.driver import RunFailedError, drive
    from ctrlsim.experiments.report import read_run

    run, out = Path(run), Path(out)
    check_settings(parallel, order_seed)
    check_folders(run, out)
    runner, config, records = read_run(run)
    if runner.scores is None:
        raise ConfigError(f"{run}: a {runner.name} run declares no per-observation scores (Runner.scores), "
                          "so there is nothing to compare; ctrlsim noise reads ctrlbench, calibrate, "
                          "steereval and promptshift runs")
    if not records:
        raise ConfigError(f"{run} holds no finished {runner.unit_name}: finish the run first (rerun its "
                          "command), then measure its noise")
    changes = spec_changes(runner, config, parallel)
    options = RunOptions(out=str(out), unit_order_seed=order_seed, executor=executor, ray_address=ray_address,
                         figures=figures, allow_code_change=allow_code_change)
    new_config = rerun_config(runner, config, changes)
    result = drive(runner, new_config, options, show_progress=show_progress)
    if result.failed:
        raise RunFailedError(result)
    return NoiseRerun(run, out, runner, config, records, new_config, changes, parallel, order_seed, executor,
                      result)
