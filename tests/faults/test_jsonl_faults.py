"""Every JSON-lines log ctrlsim appends to goes through one guarded appender (issue 45, item 4):
provenance.jsonl, exchanges.jsonl, unit-seconds.jsonl (the run's and the machine's) and the audit's
cost.jsonl. A torn last line is moved aside before the next append, never joined into the log (it
used to become a damaged middle line: a failed replay, a resume refused for good); a link planted
where a log belongs is refused, never written through (the exchange log's path used to be resolved
before its O_NOFOLLOW open)."""
from __future__ import annotations

import json
import os

import pytest

from ctrlsim.errors import DataFileError, TornLineWarning
from ctrlsim.experiments import cost, provenance
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.store import read_run_records
from ctrlsim.jsonlines import append_object, read_objects

CTRLBENCH = ["ctrlbench", "--methods", "random", "--recommenders", "popularity", "--targets", "War",
             "--agents", "1,1", "--rounds", "1", "--figures", "false"]
TORN = b'{"key": "half a li'


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def tear(path) -> None:
    """What a kill mid-write leaves: the start of a line, without its newline."""
    with open(path, "ab") as fh:
        fh.write(TORN)


def assert_torn_line_kept_aside(path) -> None:
    [aside] = path.parent.glob(f"{path.name}.torn-*")
    assert aside.read_bytes() == TORN
    assert path.read_bytes().endswith(b"\n") and TORN not in path.read_bytes()


# ----------------------------------------------------------------------------- torn last lines

def test_a_torn_exchange_log_still_replays_after_the_next_append(tmp_path):
    """The reported reproduction: the append used to end the torn line, making it a middle line, and
    every replay of the log then failed."""
    from ctrlsim.recommenders.http.exchanges import MISSING, ExchangeLog

    path = tmp_path / "exchanges.jsonl"
    ExchangeLog(path).append({"key": "k1", "response": [1, 2]})
    tear(path)
    with pytest.warns(TornLineWarning, match="exchanges.jsonl"):
        ExchangeLog(path).append({"key": "k2", "response": [3, 4]})
    replay = ExchangeLog(path)
    assert replay.answer("k1") == [1, 2] and replay.answer("k2") == [3, 4]
    assert replay.answer("k3") is MISSING
    assert_torn_line_kept_aside(path)


def test_a_torn_provenance_log_never_blocks_a_later_resume(tmp_path):
    """A torn provenance.jsonl, then a run that appends a new entry (here: a new run in the folder),
    then resumes: every one opens the folder."""
    from ctrlsim.experiments.runfolder import RunFolder

    run = tmp_path / "r"
    with RunFolder(run, {"seed": 0}, resolved={"x": 1}):
        pass
    tear(run / provenance.PROVENANCE)
    with pytest.warns(TornLineWarning, match="provenance.jsonl"):
        with RunFolder(run, {"seed": 0}, resolved={"x": 2}) as folder:  # no results yet: a new entry
            folder.store.add("a", {"v": 1})
    for _ in range(2):
        with RunFolder(run, {"seed": 0}, resolved={"x": 2}) as folder:
            assert "a" in folder.store
    entries = provenance.read_entries(run / provenance.PROVENANCE)
    assert [e["resolved"] for e in entries] == [{"x": 1}, {"x": 2}]
    assert_torn_line_kept_aside(run / provenance.PROVENANCE)


def test_a_torn_unit_seconds_log_is_repaired_by_the_next_run(tmp_path):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    tear(run / cost.FOLDER_LOG)
    with pytest.warns(TornLineWarning, match="unit-seconds.jsonl"):
        assert main([*CTRLBENCH, "--seeds", "0,1", "--out", str(run)]) == 0
    rows = read_objects(run / cost.FOLDER_LOG)
    assert len(rows) == 2 and all(set(r) == {"key", "seconds", "cpu_seconds"} for r in rows)
    assert_torn_line_kept_aside(run / cost.FOLDER_LOG)


def test_a_torn_machine_cost_log_is_repaired(tmp_path):
    (tmp_path / "cache").mkdir()
    log = tmp_path / "cache" / cost.CACHE_LOG
    cost.record_run("probe", "sig", [1.0])
    tear(log)
    with pytest.warns(TornLineWarning):
        cost.record_run("probe", "sig", [3.0])
    assert [r["seconds_per_unit"] for r in read_objects(log)] == [1.0, 3.0]
    assert_torn_line_kept_aside(log)


def test_a_torn_audit_cost_log_is_repaired(tmp_path):
    from ctrlsim.experiments.audit.folder import AuditFolder

    with AuditFolder(tmp_path / "a") as folder:
        folder.append_cost({"wall_s": 1.0, "cpu_s": 1.0})
        tear(folder.file("cost.jsonl"))
        assert [c["wall_s"] for c in folder.read_costs()] == [1.0]  # a torn last line is skipped
        with pytest.warns(TornLineWarning, match="cost.jsonl"):
            folder.append_cost({"wall_s": 2.0, "cpu_s": 2.0})
        assert [c["wall_s"] for c in folder.read_costs()] == [1.0, 2.0]
        assert_torn_line_kept_aside(folder.file("cost.jsonl"))


def test_two_torn_lines_in_one_second_are_both_kept(tmp_path):
    log = tmp_path / "log.jsonl"
    for n in range(2):
        tear(log)
        with pytest.warns(TornLineWarning):
            append_object(log, {"n": n})
    assert read_objects(log) == [{"n": 0}, {"n": 1}]
    assert sorted(p.read_bytes() for p in tmp_path.glob("log.jsonl.torn-*")) == [TORN, TORN]


def test_a_whole_last_line_without_its_newline_is_ended_and_kept(tmp_path, recwarn):
    """A hand edit that dropped the final newline is not a torn line: nothing is moved aside."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"n": 0}\n{"n": 1}')
    append_object(log, {"n": 2})
    assert read_objects(log) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert not list(tmp_path.glob("*.torn-*")) and not recwarn.list


def test_a_damaged_line_that_ends_with_its_newline_is_named_not_skipped(tmp_path):
    """A kill leaves a line without its newline; a bad line with its newline is damage, named even when
    last, so it cannot turn into a damaged middle line silently later."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"n": 0}\n{"n": \n')
    with pytest.raises(DataFileError, match=r"log\.jsonl: line 2 is not JSON"):
        read_objects(log)


# ----------------------------------------------------------------------------- links and odd files

def test_the_exchange_log_path_is_never_resolved_and_a_planted_link_is_refused(tmp_path):
    from ctrlsim.experiments.config import RunOptions
    from ctrlsim.experiments.driver import exchange_settings
    from ctrlsim.recommenders.http.exchanges import log_for

    run, victim = tmp_path / "r", tmp_path / "victim.txt"
    run.mkdir()
    victim.write_text("precious\n")
    (run / "exchanges.jsonl").symlink_to(victim)
    settings = exchange_settings(run, RunOptions())
    assert settings.log == str(run.absolute() / "exchanges.jsonl")  # the link's own path
    log = log_for(settings.log)
    assert log.path == run.absolute() / "exchanges.jsonl"
    with pytest.raises(DataFileError, match=r"exchanges\.jsonl: is a symbolic link"):
        log.append({"key": "k", "response": [1]})
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("name", ["exchanges.jsonl", cost.FOLDER_LOG])
def test_a_run_refuses_a_link_planted_at_a_log_before_any_unit_runs(tmp_path, name, capsys):
    run, victim = tmp_path / "r", tmp_path / "victim.txt"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    victim.write_text("precious\n")
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(victim)
    records = read_run_records(run / "records.jsonl")[1]
    capsys.readouterr()
    assert main([*CTRLBENCH, "--seeds", "0,1", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert name in err and "symbolic link" in err
    assert victim.read_text() == "precious\n"
    assert read_run_records(run / "records.jsonl")[1] == records  # the new unit never ran


def test_a_link_at_the_machine_cost_log_is_never_written_through(tmp_path):
    (tmp_path / "cache").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "cache" / cost.CACHE_LOG).symlink_to(victim)
    cost.record_run("probe", "sig", [1.0])  # a lost line costs an estimate, never a run
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_log_that_is_not_a_regular_file_is_named(tmp_path, kind):
    log = tmp_path / "provenance.jsonl"
    if kind == "folder":
        log.mkdir()
    else:
        os.mkfifo(log)
    with pytest.raises(DataFileError, match=r"provenance\.jsonl"):
        provenance.append_entry(log, {"code": {}})


def test_appended_lines_are_whole_objects_one_per_line(tmp_path):
    log = tmp_path / "log.jsonl"
    append_object(log, {"url": "http://user:secret@host/v1", "n": 1})
    [line] = log.read_text().splitlines()
    assert json.loads(line) == {"url": "http://***@host/v1", "n": 1}
