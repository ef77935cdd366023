"""The cost table every run's tables end with: its cells computed by hand from a unit log and records."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from ctrlsim.experiments import cost


def _runner(per_record):
    return SimpleNamespace(decisions=lambda config, key, record: per_record(record),
                           decision_name="a test step")


def _write_log(folder, rows):
    (folder / cost.FOLDER_LOG).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_cells_are_the_measured_sums(tmp_path):
    records = {
        "a": {"decisions_here": 10, "tokens": {"prompt": 900, "completion": 100}},
        "b": {"decisions_here": 30, "tokens": {"prompt": 2700, "completion": 300}},
        "c": {"decisions_here": 5, "tokens": {"prompt": 1, "completion": 1}},  # not measured: left out
    }
    # "a" was measured twice (its record was lost and the unit rerun): the last line counts
    _write_log(tmp_path, [{"key": "a", "seconds": 9.0, "cpu_seconds": 9.0},
                          {"key": "a", "seconds": 2.0, "cpu_seconds": 1.5},
                          {"key": "b", "seconds": 4.0, "cpu_seconds": 2.5},
                          {"key": "gone", "seconds": 1.0}])
    [table] = cost.cost_blocks(tmp_path, _runner(lambda r: r["decisions_here"]), None, records)
    row = dict(zip(table.header, table.frame.iloc[0]))
    assert row["units measured"] == "2 of 3"
    assert row["decisions"] == "40"
    assert row["CPU s"] == "4.0"
    assert row["decisions per CPU-hour"] == f"{40 * 3600 / 4.0:,.0f}" == "36,000"
    assert row["tokens"] == "4,000" and row["tokens per decision"] == "100"
    assert row["wall s per unit"] == "3.0"
    assert "A decision: a test step." in table.after


def test_units_without_cpu_time_and_records_timing_themselves(tmp_path):
    """Ray workers log wall time only; evolve's phases, run by the driver, carry their own times."""
    records = {"remote": {"n": 4, "tokens": 0},
               "phase/interact_g0": {"n": 6, "tokens": 0, "seconds": 3.0, "cpu_seconds": 2.0}}
    _write_log(tmp_path, [{"key": "remote", "seconds": 5.0}])
    [table] = cost.cost_blocks(tmp_path, _runner(lambda r: r["n"]), None, records)
    row = dict(zip(table.header, table.frame.iloc[0]))
    assert row["units measured"] == "2 of 2" and row["decisions"] == "10"
    # CPU-hour rates use only the units whose CPU time is known, and their decisions
    assert row["CPU s"] == "2.0" and row["decisions per CPU-hour"] == f"{6 * 3600 / 2.0:,.0f}"
    assert row["wall s per unit"] == "4.0"


def test_unknown_token_counts_make_a_lower_bound_and_nothing_measured_shows_nothing(tmp_path):
    records = {"a": {"n": 2, "tokens": {"prompt": 10, "completion": 10, "unknown_calls": 1}}}
    assert cost.cost_blocks(tmp_path, _runner(lambda r: r["n"]), None, records) == []
    _write_log(tmp_path, [{"key": "a", "seconds": 1.0, "cpu_seconds": 1.0}])
    [table] = cost.cost_blocks(tmp_path, _runner(lambda r: r["n"]), None, records)
    row = dict(zip(table.header, table.frame.iloc[0]))
    assert row["tokens"] == "≥ 20" and row["tokens per decision"] == "≥ 10"


def test_the_unit_clock_counts_this_process_cpu_only_when_units_run_here():
    clock = cost.UnitClock()
    end = time.process_time() + 0.05
    while time.process_time() < end:  # busy: CPU time passes
        pass
    wall, cpu = clock.lap()
    assert cpu is not None and cpu >= 0.04 and wall >= cpu * 0.5
    clock.restart(in_process=False)
    assert clock.lap()[1] is None


@pytest.mark.parametrize("protocol, key, record, expected", [
    ("ctrlbench", "m|b|t|seed=0", {"probes": [{"rounds": [{}, {}, {}]}, {"rounds": [{}]}]}, 4),
    ("steereval", "default/1/Horror/increase", {"reward": 0.1}, 1),
    ("promptshift", "user/1", {"lists": [{}, {}, {}]}, 3),
    ("train-probe", "policy", {"timesteps": 256}, 256),
])
def test_each_runner_counts_its_decisions(protocol, key, record, expected):
    from ctrlsim.experiments.runner import get_runner

    runner = get_runner(protocol)
    assert runner.decision_name and runner.decisions(None, key, record) == expected


def test_the_decisions_that_need_the_config():
    from ctrlsim.experiments.runner import get_runner

    probe = get_runner("probe")
    assert probe.decisions(SimpleNamespace(rounds=8), "episode", {"roster": [{}] * 4}) == 32
    assert probe.decisions(SimpleNamespace(rounds=8), "ceiling", {}) == 0
    evolve, config = get_runner("evolve"), SimpleNamespace(rounds_per_merge=3, eval_rounds=5)
    assert evolve.decisions(config, "phase/interact_g1", {"probes": 4}) == 12
    assert evolve.decisions(config, "phase/debate_g1", {"probes": 4}) == 0
    assert evolve.decisions(config, "evaluate", {"probes": 2, "rounds": 5}) == 10
    calibrate, config = get_runner("calibrate"), SimpleNamespace(rounds=4)
    assert calibrate.decisions(config, "k", {"details": {"probes": 3}}) == 12
    assert calibrate.decisions(config, "k", {"details": {"scenarios": 7}}) == 7
    assert calibrate.decisions(config, "k", {"details": {"calls": 5, "users": 2}}) == 5
