"""Runs sized to answer (--precision, --budget-minutes) and the planned-units cost line.

Scripted probes (oracle, random) on a dial box and the popularity box: no model loads, so every run
here takes a second or two."""
from __future__ import annotations

import json

import numpy as np
import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments import cost
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.sizing import SIZING_FILE, seeds_to_add
from ctrlsim.experiments.store import read_run_records
from ctrlsim.metrics.sequential import bounded_mean_sequence

SCRIPTED = dict(methods=("oracle", "random"), recommenders=("dial:0.5",), targets=("War",), agents=(1, 1),
                rounds=2, seeds=(0, 1))


def _per_seed_coverage(out, method: str) -> np.ndarray:
    _, records = read_run_records(out / "records.jsonl")
    by_seed = sorted((r["seed"], r["curves"]["coverage"][-1]) for r in records.values()
                     if r["method"] == method)
    return np.array([value for _, value in by_seed])


def test_seeds_to_add_doubles_within_the_budget():
    assert seeds_to_add(2, 10.0, 1000.0) == 2      # doubling: 2 more
    assert seeds_to_add(8, 10.0, 35.0) == 3        # the budget pays for 3 seeds of 10 s
    assert seeds_to_add(8, 10.0, 5.0) == 0         # nothing fits: the run stops
    assert seeds_to_add(999, 0.0, 10.0) == 1       # never past MAX_SEEDS (1000)


def test_a_sized_run_adds_seeds_until_the_confidence_sequences_are_narrow_enough(tmp_path):
    out = tmp_path / "sized"
    result = ctrlsim.run("ctrlbench", out=out, show_progress=False,
                         options=RunOptions(precision=0.2, budget_minutes=5, figures=False), **SCRIPTED)
    sizing = json.loads((out / SIZING_FILE).read_text())
    assert sizing["stopped_by"] == "precision"
    seeds = sizing["rounds"][-1]["seeds"]
    assert seeds[:2] == [0, 1] and seeds == list(range(len(seeds))) and len(seeds) > 2
    # each round doubles the seeds: 2, 4, 8, ...
    assert [len(r["seeds"]) for r in sizing["rounds"]] == [2 * 2 ** i for i in range(len(sizing["rounds"]))]
    for interval in sizing["intervals"]:  # the confidence sequence over per-seed means, by hand
        low, high = bounded_mean_sequence(_per_seed_coverage(out, interval["method"])).final
        assert interval["low"] == pytest.approx(low) and interval["high"] == pytest.approx(high)
        assert interval["half_width"] <= 0.2
    # the previous round was not narrow enough: otherwise the run would have stopped there
    assert sizing["rounds"][-2]["max_half_width"] > 0.2
    assert json.loads((out / "config.json").read_text())["config"]["seeds"] == seeds
    assert "Sized run: headline intervals valid under optional stopping (precision)" in result.markdown
    assert "Sized run" in (out / "tables.md").read_text()


def test_a_sized_run_stops_on_its_budget_and_says_so(tmp_path):
    out = tmp_path / "budget"
    ctrlsim.run("ctrlbench", out=out, show_progress=False,
                options=RunOptions(precision=0.001, budget_minutes=0.0001 + 1e-2, figures=False), **SCRIPTED)
    sizing = json.loads((out / SIZING_FILE).read_text())
    # a half-width of 0.001 needs thousands of seeds; 0.6 s pays for a few rounds of scripted episodes
    assert sizing["stopped_by"] == "budget" and sizing["rounds"][-1]["max_half_width"] > 0.001
    assert "stopped by the budget of 0.0101 min" in (out / "tables.md").read_text()


def test_sizing_options_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="go together"):
        RunOptions(precision=0.05)
    with pytest.raises(ConfigError, match="precision must be in"):
        RunOptions(precision=0.7, budget_minutes=5)
    with pytest.raises(ConfigError, match="no seeds that grow"):
        ctrlsim.run("probe", out=tmp_path / "p", show_progress=False,
                    options=RunOptions(precision=0.05, budget_minutes=1))
    assert not (tmp_path / "p").exists()


def test_every_run_prints_its_planned_units_and_a_measured_estimate(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))  # absent: a scripted run never creates it
    out = tmp_path / "run"
    ctrlsim.run("ctrlbench", out=out, show_progress=True, **SCRIPTED)
    first = capsys.readouterr().err
    assert "ctrlbench: 4 episodes planned, 0 finished, 4 to run; cost unknown" in first
    assert not (tmp_path / "cache").exists()
    measured = cost.folder_seconds(out, ["oracle|dial:0.5|War|seed=0"])
    assert set(measured) == {"oracle|dial:0.5|War|seed=0"} and measured["oracle|dial:0.5|War|seed=0"] >= 0
    assert len((out / cost.FOLDER_LOG).read_text().splitlines()) == 4
    # extended by two seeds: the estimate comes from this folder's four measured units
    ctrlsim.run("ctrlbench", out=out, show_progress=True, **{**SCRIPTED, "seeds": (0, 1, 2, 3)})
    second = capsys.readouterr().err
    assert "8 episodes planned, 4 finished, 4 to run; estimated" in second
    assert "median of 4 measured: this folder's finished units" in second
    # a cache folder that exists gets the machine's log, and a new folder of the same config reads it
    (tmp_path / "cache").mkdir()
    ctrlsim.run("ctrlbench", out=tmp_path / "again", show_progress=False, **SCRIPTED)
    rows = [json.loads(line) for line in (tmp_path / "cache" / cost.CACHE_LOG).read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["runner"] == "ctrlbench" and rows[0]["units"] == 4
    ctrlsim.run("ctrlbench", out=tmp_path / "third", show_progress=True,
                **{**SCRIPTED, "seeds": (5, 6)})
    assert "earlier runs of this config on this machine" in capsys.readouterr().err
