"""The runner contract, checked on every registered runner with its own `--preset smoke`.

Per runner: the CLI table and `RUNNERS` agree; the plan is not empty; an LLM server that cannot be
reached (`http://127.0.0.1:9/v1#m`: nothing listens on port 9) fails the units that need it, so the
run exits 1, lists them, and stores nothing for them; the same command with a working model then
completes every planned unit; and a third run finds nothing to do. Runners without an LLM (probe)
show the same policy with a unit that raises.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrlsim.experiments.cli import main
from ctrlsim.experiments.runner import RUNNER_MODULES, get_runner
from ctrlsim.experiments.store import read_run_records

UNREACHABLE = "http://127.0.0.1:9/v1#m"
MODEL = "smollm2-135m"

# runner -> (the LLM flag, planned units, whether the full run is slow); each runs its own `--preset
# smoke` (the smallest real run, declared in its config; ctrlbench and calibrate decide there with the
# JSON head, the cheapest decision: the question heads are tested in tests/agents/test_probe_validity.py)
CASES: dict[str, tuple[str | None, int, bool]] = {
    "probe": (None, 2, False),
    "ctrlbench": ("--llm", 2, False),
    "steereval": ("--llm", 2, False),
    "promptshift": ("--llms", 2, True),
    "evolve": ("--llm", 8, True),
    "calibrate": ("--llm", 2, False),
    "train-probe": (None, 1, False),
    "controls": (None, 7, False),
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def test_every_registered_runner_has_a_case_and_a_subcommand():
    from ctrlsim.experiments.cli import PROTOCOLS

    assert set(CASES) == set(RUNNER_MODULES) == set(PROTOCOLS)
    for name in RUNNER_MODULES:
        runner = get_runner(name)
        assert runner.name == name and callable(runner.unit_fn)
        assert (CASES[name][0] is None) == (not runner.llm_fields)
        assert "smoke" in runner.presets, f"{name} declares no smoke preset"


def _stored(out: Path) -> dict[str, dict]:
    return read_run_records(out / "records.jsonl")[1]


def _command(name: str, out: Path, llm: str | None) -> list[str]:
    llm_flag = CASES[name][0]
    return [name, "--preset", "smoke", *((llm_flag, llm) if llm_flag else ()), "--out", str(out),
            "--figures", "false"]


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[0]])
def test_an_unreachable_llm_fails_the_units_and_stores_nothing_for_them(name, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_command(name, out, UNREACHABLE)) == 1
    err = capsys.readouterr().err
    assert "unit(s) failed and were not stored" in err and "Rerun the same command" in err
    assert "127.0.0.1:9" in err  # each failure names its cause
    assert _stored(out) == {}  # every unit needs the LLM here: none is stored as finished
    about = json.loads((out / "config.json").read_text())
    assert about["runner"] == name


def test_a_unit_that_raises_fails_alone_and_the_rerun_retries_it(tmp_path, capsys, monkeypatch):
    """The policy without an LLM: the probe runner's ceiling unit raises, the episode is kept."""
    out = tmp_path / "run"

    def out_of_memory(*args, **kwargs):
        raise MemoryError("no memory left")

    monkeypatch.setattr("ctrlsim.envs.ceiling.controllability_ceiling", out_of_memory)
    assert main(_command("probe", out, None)) == 1
    assert "ceiling: MemoryError: no memory left" in capsys.readouterr().err
    assert set(_stored(out)) == {"episode"}
    monkeypatch.undo()
    assert main(_command("probe", out, None)) == 0
    assert set(_stored(out)) == {"episode", "ceiling"}


def _full_cases():
    for name, (llm_flag, _, slow) in CASES.items():
        marks = [pytest.mark.llm] if llm_flag else []
        if slow:
            marks.append(pytest.mark.slow)
        yield pytest.param(name, marks=marks)


@pytest.mark.parametrize("name", list(_full_cases()))
def test_failed_units_are_retried_and_a_finished_run_resumes_to_nothing(name, tmp_path, capsys):
    from ctrlsim.experiments.commands import parse_command
    from ctrlsim.experiments.driver import drive

    out = tmp_path / "run"
    if CASES[name][0]:
        assert main(_command(name, out, UNREACHABLE)) == 1
        assert _stored(out) == {}
    # Resuming with another model would mix configs; a failed run stored nothing, so overwrite is not
    # needed: the folder's config is the unreachable one, so the rerun uses a fresh folder for the model.
    out = tmp_path / "run-working"
    assert main(_command(name, out, MODEL)) == 0, capsys.readouterr().err[-3000:]
    stored = _stored(out)
    assert len(stored) == CASES[name][1]
    lines = (out / "records.jsonl").read_text()
    config, options = parse_command(name, _command(name, out, MODEL)[1:])
    again = drive(get_runner(name), config, options, show_progress=False)
    assert again.ran == 0 and not again.failed and again.planned >= 1
    assert set(again.records_by_key) == set(stored)
    assert (out / "records.jsonl").read_text() == lines  # nothing was appended
    assert again.tables  # the report holds tables
    # One renderer: tables.md is the rendering of the report's data, which tables.json holds and
    # RunResult.tables returns (never parsed back from markdown).
    from ctrlsim.experiments.tables import blocks_from_json, render_markdown, report_tables, tables_json

    stored = json.loads((out / "tables.json").read_text(encoding="utf-8"))
    assert stored == json.loads(json.dumps(tables_json(again.report)))
    assert (out / "tables.md").read_text(encoding="utf-8") == render_markdown(blocks_from_json(stored)) \
        == again.markdown
    assert list(again.tables) == list(report_tables(blocks_from_json(stored)))
    # Every run's tables end with the measured cost of its units (ctrlsim.experiments.cost.table).
    from ctrlsim.experiments.cost import TITLE

    cost = again.tables[TITLE]
    units = len(_stored(out))
    assert cost["units measured"].tolist() == [f"{units} of {units}"]
    assert int(cost["decisions"].iloc[0].replace(",", "")) > 0
    assert float(cost["CPU s"].iloc[0].replace(",", "")) > 0


@pytest.mark.llm
def test_a_run_whose_server_was_down_completes_in_the_same_folder_once_it_is_back(tmp_path, capsys):
    """The reported case: ctrlbench against an OpenAI-compatible server that is not answering. The
    episode that needs it fails (exit 1, not stored); the one that does not is kept; once a real
    llama.cpp server answers at the same address, the same command runs exactly the failed episode."""
    pytest.importorskip("llama_cpp.server", exc_type=ImportError)
    from llama_servers import free_port, start_server, stop_server, wait_ready

    from ctrlsim.backends.bundled import bundled_llm_path

    port = free_port()
    out = tmp_path / "run"
    command = ["ctrlbench", "--methods", "random,base-small", "--recommenders", "popularity", "--targets",
               "War", "--agents", "1,1", "--rounds", "1", "--seeds", "0", "--llm", f"http://127.0.0.1:{port}/v1",
               "--out", str(out), "--figures", "false"]
    assert main(command) == 1
    assert "base-small|popularity|War|seed=0: BackendUnavailableError" in capsys.readouterr().err
    assert set(_stored(out)) == {"random|popularity|War|seed=0"}
    kept = (out / "records.jsonl").read_text()
    proc, log, url = start_server(bundled_llm_path(MODEL), tmp_path / "server.log", port=port)
    try:
        import time

        wait_ready(proc, url, tmp_path / "server.log", time.time() + 120)
        assert main(command) == 0, capsys.readouterr().err[-3000:]
    finally:
        stop_server(proc, log)
    stored = _stored(out)
    assert set(stored) == {"random|popularity|War|seed=0", "base-small|popularity|War|seed=0"}
    assert (out / "records.jsonl").read_text().startswith(kept)  # the finished episode was not redone
    episode = stored["base-small|popularity|War|seed=0"]
    assert episode["llm"]["runtime"] == "openai-compatible"
    assert episode["decisions"] >= 1 and not episode["dropped"]
