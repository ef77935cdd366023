"""The unit context: the one way a unit, and a runner's driver-side hooks, get what they work with.

Every unit receives a `UnitContext` (`unit_fn(payload, unit) -> record`): its key, its typed spec
(what `plan` returned for that key: no unit parses its key string back), and one acquisition path
for each kind of object, built once per process in the worker cache (`units.worker_cache`) so a
worker keeps its models across units, under one key format per kind:

  dataset(spec)                  "dataset:<spec>"
  box(spec, dataset, **options)  "box:<dataset>:<spec>:<options as sorted JSON>"
  llm(spec)                      "llm:<spec>|cache:<the response caches, or None>"
  encoder(spec)                  "encoder:<spec>"
  once(name, factory)            "<name>": an object derived from the run's inputs (a protocol's
                                 scenario draw, its dataset preparation), built once per process

One response-cache policy for every LLM a run loads: its replies are kept in the run folder
(`llm-cache.sqlite`, so a resumed run replays what it used for free), and, with the run option
`--shared-cache DIR`, also in `DIR/llm-cache.sqlite`, which every run given that folder reads
before calling the model (a rerun in a new folder is free too). Generated personas are kept in
the run folder (`profiles.sqlite`). A unit running where the run folder is not (a Ray worker on
another node) runs uncached: seeded replies are the same, only paid again. A cache changes no
record. LLMs lent to a run (`ctrlsim.run(..., llms={spec: llm})`) serve their spec as they are.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ctrlsim.experiments.units import progress as progress_bar
from ctrlsim.experiments.units import put_in_worker_cache, run_dataset, worker_cache

RESPONSE_CACHE_FILE = "llm-cache.sqlite"  # the LLM replies a run used (run folder, --shared-cache DIR)
PROFILE_FILE = "profiles.sqlite"          # the personas a run generated (run folder)


@dataclass(frozen=True)
class UnitSettings:
    """What every unit of a run shares besides its payload (picklable: it travels to Ray workers)."""

    run_folder: str | None = None    # absolute; None before the folder opens (the up-front checks)
    shared_cache: str | None = None  # absolute; the run option `--shared-cache`
    show_progress: bool = False      # draw progress bars (only in the driver's own process)


class LayeredResponseCache:
    """The run folder's response cache in front of a shared one (the `ResponseCache` calls an LLM
    makes): a reply is looked up in the run's file, then in the shared file (and copied into the
    run's); a new reply is stored in the shared file first, so the first stored reply of any run
    wins, and the run's file keeps exactly the value the run used."""

    def __init__(self, run, shared):
        self.run, self.shared = run, shared

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        found = self.run.get_many(keys)
        missing = [k for k in keys if k not in found]
        if missing:
            found.update(self.run.put_many(self.shared.get_many(missing)))
        return found

    def put_many(self, items: dict[str, Any], *,
                 valid: Callable[[Any], bool] | None = None) -> dict[str, Any]:
        return self.run.put_many(self.shared.put_many(items, valid=valid), valid=valid)


class UnitContext:
    """What one unit (or a driver-side hook) works with: see the module docstring."""

    def __init__(self, settings: UnitSettings | None = None, key: str | None = None, spec: Any = None):
        self.settings = settings or UnitSettings()
        self.key = key
        self.spec: Any = key if spec is None else spec

    # ---------------------------------------------------------------------------- acquisition
    def dataset(self, spec: str):
        """The dataset `spec` (parsed once per machine, loaded once per process; shared, not copied)."""
        return worker_cache(f"dataset:{spec}", lambda: run_dataset(spec))

    def box(self, spec: str, dataset: str, **options):
        """The black box `spec` over the dataset `dataset` (a spec too), built with `options`."""
        from ctrlsim.recommenders import make_recommender

        name = f"box:{dataset}:{spec}:{json.dumps(options, sort_keys=True, default=str)}"
        return worker_cache(name, lambda: make_recommender(spec, self.dataset(dataset), **options))

    def llm(self, spec: str, *, cached: bool = True):
        """The LLM `spec` with the run's response caches (none with `cached=False`)."""
        from ctrlsim.backends import load_llm

        files = self.response_cache_files() if cached else ()
        return worker_cache(llm_cache_name(spec, files), lambda: load_llm(spec, cache=_open_cache(files)))

    def encoder(self, spec: str):
        """The text encoder `spec` (with its own embedding cache)."""
        from ctrlsim.backends import load_encoder

        return worker_cache(f"encoder:{spec}", lambda: load_encoder(spec))

    def once(self, name: str, factory: Callable[[], Any]):
        """`factory()`, built once per process under `name` (which must name all it depends on)."""
        return worker_cache(name, factory)

    # ------------------------------------------------------------------------------- caches
    def response_cache_files(self) -> tuple[str, ...]:
        """The response-cache files of this run here: the run folder's (where the folder is
        visible from this process), then the shared one (`--shared-cache`)."""
        files = []
        folder = self.settings.run_folder
        if folder is not None and Path(folder).is_dir():
            files.append(str(Path(folder) / RESPONSE_CACHE_FILE))
        if self.settings.shared_cache is not None:
            files.append(str(Path(self.settings.shared_cache) / RESPONSE_CACHE_FILE))
        return tuple(files)

    def profile_store(self, *, cached: bool = True) -> Path | None:
        """The run folder's persona cache (None where the folder is not visible, or uncached)."""
        folder = self.settings.run_folder
        if not cached or folder is None or not Path(folder).is_dir():
            return None
        return Path(folder) / PROFILE_FILE

    # ------------------------------------------------------------------------------ progress
    @property
    def show_progress(self) -> bool:
        """Whether this unit draws progress bars (for library calls that take the flag)."""
        return self.settings.show_progress

    def progress(self, iterable: Iterable | None = None, *, desc: str, total: int | None = None,
                 unit: str = "it", show: bool = True):
        """A progress bar, drawn only where this unit shows progress (and `show`)."""
        return progress_bar(iterable, desc=desc, total=total, unit=unit, show=show and self.show_progress)


def llm_cache_name(spec: str, files: Iterable[str]) -> str:
    """The worker-cache name of the LLM `spec` answering from the response-cache `files`."""
    files = tuple(files)
    return f"llm:{spec}|cache:{'+'.join(files) if files else None}"


def _open_cache(files: tuple[str, ...]):
    from ctrlsim.backends import ResponseCache

    if not files:
        return None
    caches = [ResponseCache(f) for f in files]
    return caches[0] if len(caches) == 1 else LayeredResponseCache(*caches)


# ------------------------------------------------------------------------- the driver's side

def run_settings(ctx, *, in_units: bool) -> UnitSettings:
    """The settings of run `ctx` (a `RunContext`), for its units (`in_units`: bars only where units
    run in the driver's process) or for its driver-side hooks. Lends `ctx`'s loaded LLMs to both."""
    folder = str(ctx.folder.path.resolve()) if ctx.folder is not None else None
    shared = ctx.options.shared_cache
    show = ctx.show_progress and (not in_units or ctx.options.executor == "local")
    settings = UnitSettings(folder, str(Path(shared).expanduser().resolve()) if shared else None, show)
    lend_llms(settings, ctx.resources.get("llms", {}))
    return settings


def lend_llms(settings: UnitSettings, llms: Mapping[str, Any]) -> None:
    """Make `UnitContext.llm(spec)` in this process return the loaded `llms[spec]` (tests and
    benchmarks share one model); units in other processes still load `spec`."""
    files = UnitContext(settings).response_cache_files()
    for spec, llm in llms.items():
        for cached in (files, ()):
            put_in_worker_cache(llm_cache_name(spec, cached), llm)


@dataclass(frozen=True)
class UnitPayload:
    """What the executor hands each unit: the runner's payload, the run's settings and the typed
    spec of every unit of the wave (by key)."""

    payload: Any
    settings: UnitSettings
    specs: Mapping[str, Any] = field(default_factory=dict)


def call_unit(unit_fn: Callable[[Any, UnitContext], dict], payload: UnitPayload, key: str) -> dict:
    """The executor's unit: `unit_fn(payload, unit)` with the unit's context (top-level, so it pickles)."""
    return unit_fn(payload.payload, UnitContext(payload.settings, key, payload.specs.get(key)))


def planned_units(planned: Iterable[Any]) -> tuple[list[str], dict[str, Any]]:
    """(keys, key -> spec) of what a runner's `plan` returned: typed specs, each with its `key`, or
    plain key strings (a repeated key stays in the list: the executor refuses it)."""
    planned = list(planned)
    keys = [unit if isinstance(unit, str) else unit.key for unit in planned]
    return keys, dict(zip(keys, planned))
