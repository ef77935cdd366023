"""The unit context (`ctrlsim.experiments.context`): one object per process and kind, the response-cache
policy (the run folder's cache in front of an optional shared one), lent LLMs, and typed unit specs
travelling with their keys through the driver."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import ctrlsim
from ctrlsim.backends import ResponseCache
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.context import (
    LayeredResponseCache,
    UnitContext,
    UnitSettings,
    lend_llms,
    llm_cache_name,
    planned_units,
)
from ctrlsim.experiments.runner import _REGISTERED, Runner, register_runner
from ctrlsim.experiments.units import cached_names


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def test_one_object_per_process_and_kind_under_one_key_format():
    here, elsewhere = UnitContext(), UnitContext(UnitSettings(run_folder="/nowhere"), "k", "spec")
    assert here.dataset("ml-100k") is elsewhere.dataset("ml-100k")
    box = here.box("popularity", "ml-100k", mask_shown=True)
    assert elsewhere.box("popularity", "ml-100k", mask_shown=True) is box
    assert here.box("popularity", "ml-100k", mask_shown=False) is not box
    assert box.dataset is here.dataset("ml-100k")  # the box is built over the process's one dataset
    assert {"dataset:ml-100k", 'box:ml-100k:popularity:{"mask_shown": true}',
            'box:ml-100k:popularity:{"mask_shown": false}'} <= set(cached_names())
    assert here.once("test-derived:1", lambda: ["built"]) is here.once("test-derived:1", lambda: ["again"])


def test_a_unit_gets_its_key_and_its_spec():
    assert (UnitContext(key="a").key, UnitContext(key="a").spec) == ("a", "a")  # a plain key is its own spec
    spec = object()
    assert UnitContext(key="a", spec=spec).spec is spec


def test_the_response_caches_are_the_run_folders_then_the_shared_one(tmp_path):
    run, shared = tmp_path / "run", tmp_path / "shared"
    run.mkdir()
    unit = UnitContext(UnitSettings(str(run), str(shared)))
    assert unit.response_cache_files() == (str(run / "llm-cache.sqlite"), str(shared / "llm-cache.sqlite"))
    assert unit.profile_store() == run / "profiles.sqlite"
    assert unit.profile_store(cached=False) is None
    # A worker that cannot see the run folder (another node) uses only what it can reach.
    away = UnitContext(UnitSettings(str(tmp_path / "not-here"), None))
    assert away.response_cache_files() == () and away.profile_store() is None
    assert llm_cache_name("m", ()) == "llm:m|cache:None"
    assert llm_cache_name("m", ("a.sqlite", "b.sqlite")) == "llm:m|cache:a.sqlite+b.sqlite"


def test_the_layered_cache_reads_the_run_first_and_the_first_stored_reply_wins(tmp_path):
    run, shared = ResponseCache(tmp_path / "run.sqlite"), ResponseCache(tmp_path / "shared.sqlite")
    layered = LayeredResponseCache(run, shared)
    shared.put_many({"old": {"text": "from another run"}})
    run.put_many({"mine": {"text": "this run's"}})
    shared.put_many({"mine": {"text": "another run's, stored later"}})
    assert layered.get_many(["old", "mine", "missing"]) == {"old": {"text": "from another run"},
                                                           "mine": {"text": "this run's"}}
    assert run.get_many(["old"]) == {"old": {"text": "from another run"}}  # copied into the run's file
    # A new reply goes to both files; one the shared file already holds is the one used.
    assert layered.put_many({"new": {"text": "n"}, "old": {"text": "recomputed"}}) == {
        "new": {"text": "n"}, "old": {"text": "from another run"}}
    assert shared.get_many(["new"]) == run.get_many(["new"]) == {"new": {"text": "n"}}


def test_a_lent_llm_serves_its_spec_cached_or_not_and_a_later_loan_replaces_it(tmp_path):
    lent, later = object(), object()
    settings = UnitSettings(str(tmp_path), None)
    lend_llms(settings, {"test-lent-model": lent})
    assert UnitContext(settings).llm("test-lent-model") is lent
    assert UnitContext(settings).llm("test-lent-model", cached=False) is lent
    lend_llms(settings, {"test-lent-model": later})  # another run lending another model for the spec
    assert UnitContext(settings).llm("test-lent-model") is later


def test_planned_units_keep_typed_specs_with_their_keys():
    spec = Cell("a", 1)
    assert planned_units([spec, "plain", spec]) == (["a/1", "plain", "a/1"], {"a/1": spec, "plain": "plain"})


def test_a_shared_cache_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="shared-cache"):
        RunOptions(shared_cache=str(tmp_path / "file"))


@dataclass(frozen=True)
class Cell:
    row: str
    col: int

    @property
    def key(self) -> str:
        return f"{self.row}/{self.col}"


@dataclass(frozen=True)
class GridConfig:
    rows: tuple[str, ...] = ("a", "b")


def grid_unit(config: GridConfig, unit: UnitContext) -> dict:
    """Records what the unit was handed: its spec's type and fields, and its caches."""
    return {"spec_type": type(unit.spec).__name__, "row": unit.spec.row, "col": unit.spec.col,
            "key": unit.key, "caches": list(unit.response_cache_files()), "bars": unit.show_progress}


def test_the_driver_hands_each_unit_its_spec_and_the_runs_caches(tmp_path):
    out, shared = tmp_path / "run", tmp_path / "shared"
    runner = register_runner(Runner(name="test-grid", config_cls=GridConfig, description="a grid of cells",
                                    unit_fn=grid_unit,
                                    plan=lambda ctx, finished: [Cell(r, 2) for r in ctx.config.rows]))
    try:
        result = ctrlsim.run(runner.name, out=out, options=RunOptions(shared_cache=str(shared)),
                             show_progress=False)
    finally:
        _REGISTERED.pop(runner.name)
    caches = [str(out.resolve() / "llm-cache.sqlite"), str(shared.resolve() / "llm-cache.sqlite")]
    assert result.records_by_key == {
        "a/2": {"spec_type": "Cell", "row": "a", "col": 2, "key": "a/2", "caches": caches, "bars": False},
        "b/2": {"spec_type": "Cell", "row": "b", "col": 2, "key": "b/2", "caches": caches, "bars": False}}
    assert not Path(shared).exists()  # nothing is created until a model's cache opens
