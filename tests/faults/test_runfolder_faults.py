"""The run folder is the run's own (issue 20, point 1), with the issue's reproductions: a planted lock
or artefact symlink, two --overwrite runs in one second, a folder that is not a run folder, a lock
file deleted while held, and artefacts lost after their records."""
from __future__ import annotations

import json

import pytest

from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.runfolder import RunFolder
from ctrlsim.experiments.store import StoreLockedError

PROBE = ["probe", "--recommender", "popularity", "--agents", "2", "--rounds", "2", "--ceiling-states", "4",
         "--figures", "false"]
CTRLBENCH = ["ctrlbench", "--methods", "random", "--recommenders", "popularity", "--targets", "War",
             "--agents", "1,1", "--rounds", "1", "--figures", "false"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def test_a_planted_lock_symlink_is_refused_and_its_target_untouched(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run / "records.jsonl.lock").symlink_to("../victim")
    assert main([*PROBE, "--out", str(run)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "precious\n"


def test_a_planted_records_symlink_is_refused(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (tmp_path / "elsewhere.jsonl").write_text("")
    (run / "records.jsonl").symlink_to("../elsewhere.jsonl")
    with pytest.raises(DataFileError, match="symbolic link"):
        RunFolder(run, {"seed": 0})
    assert (tmp_path / "elsewhere.jsonl").read_text() == ""


@pytest.mark.parametrize("link", ["rosters", "figures"])
def test_nothing_is_written_through_an_artefact_symlink(tmp_path, link, capsys):
    run, outside = tmp_path / "r", tmp_path / "outside"
    outside.mkdir()
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    if (run / link).exists():
        import shutil

        shutil.rmtree(run / link)
    (run / link).symlink_to(outside)
    figures = ["--figures", "true"] if link == "figures" else []
    code = main([*CTRLBENCH, "--seeds", "0,1", "--out", str(run), *figures])
    assert code == 2 and "symbolic link" in capsys.readouterr().err
    assert list(outside.iterdir()) == []


def test_two_overwrites_in_one_second_keep_both_previous_runs(tmp_path):
    run = tmp_path / "r"
    with RunFolder(run, {"seed": 0}) as folder:
        folder.store.add("a", {"v": 1})
        folder.write_tables("| first |")
    with RunFolder(run, {"seed": 1}, overwrite=True) as folder:
        first = folder.previous
        folder.store.add("b", {"v": 2})
    with RunFolder(run, {"seed": 2}, overwrite=True) as folder:
        second = folder.previous
    assert first is not None and second is not None and first != second
    assert '"key": "a"' in (first / "records.jsonl").read_text()
    assert (first / "tables.md").read_text().startswith("| first |")
    assert '"key": "b"' in (second / "records.jsonl").read_text()
    # the whole previous run moved: nothing of it stays beside the new one
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "provenance.jsonl", "records.jsonl",
                                                    "records.jsonl.lock"]


def test_overwrite_moves_rosters_tables_and_figures_too(tmp_path):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run), "--figures", "true"]) == 0
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    assert any(name.startswith("rosters/") for name in before) and "tables.md" in before
    assert main([*CTRLBENCH, "--seeds", "1", "--out", str(run), "--overwrite"]) == 0
    (backup,) = tmp_path.glob("r.previous-*")
    moved = sorted(p.relative_to(backup).as_posix() for p in backup.rglob("*") if p.is_file())
    assert moved == [name for name in before if name != "records.jsonl.lock"]
    records = (run / "records.jsonl").read_text()
    assert "seed=1" in records and "seed=0" not in records


def test_a_folder_that_is_not_a_run_folder_is_refused_unless_overwrite(tmp_path, capsys):
    mine = tmp_path / "my-project"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}\n')
    (mine / "tables.md").write_text("my notes\n")
    assert main([*PROBE, "--out", str(mine)]) == 2
    assert "not a ctrlsim run folder" in capsys.readouterr().err
    assert json.loads((mine / "config.json").read_text()) == {"mine": True}
    assert main([*PROBE, "--out", str(mine), "--overwrite"]) == 0
    (backup,) = tmp_path.glob("my-project.previous-*")
    assert (backup / "tables.md").read_text() == "my notes\n"
    assert json.loads((backup / "config.json").read_text()) == {"mine": True}


def test_a_lock_deleted_while_held_stops_the_holder_before_it_writes(tmp_path):
    run = tmp_path / "r"
    first = RunFolder(run, {"seed": 0})
    first.store.add("a", {"v": 1})
    (run / "records.jsonl.lock").unlink()  # it looked stale
    second = RunFolder(run, {"seed": 0})  # takes a new lock: the first run must not write any more
    with pytest.raises(StoreLockedError, match="deleted or replaced"):
        first.store.add("b", {"v": 2})
    second.store.add("c", {"v": 3})
    second.close()
    first.close()
    keys = [json.loads(line).get("key") for line in (run / "records.jsonl").read_text().splitlines()]
    assert keys == [None, "a", "c"]


def test_an_artefact_lost_after_its_record_is_rebuilt_on_resume(tmp_path):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    (roster,) = (run / "rosters").iterdir()
    kept = roster.read_text()
    roster.unlink()  # as a kill between the record and its roster would leave it
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    assert roster.read_text() == kept


def test_artefact_names_stay_inside_the_folder(tmp_path):
    with RunFolder(tmp_path / "r", {"seed": 0}) as folder:
        for name in ("../escape.json", "/tmp/escape.json", ""):
            with pytest.raises(ConfigError, match="inside the run folder"):
                folder.write_json(name, {})
    assert not (tmp_path / "escape.json").exists()


def test_a_full_disk_is_one_error_naming_the_path_and_leaves_no_tmp_file(tmp_path, monkeypatch):
    import errno
    import os

    with RunFolder(tmp_path / "r", {"seed": 0}) as folder:
        folder.store.add("a", {"v": 1})
        folder.write_tables("| old |")

        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(DataFileError, match=r"tables\.md.*No space left on device"):
            folder.write_tables("| new |")
        with pytest.raises(DataFileError, match=r"records\.jsonl.*No space left on device.*resumes"):
            folder.store.add("b", {"v": 2})
        monkeypatch.undo()
        assert (tmp_path / "r" / "tables.md").read_text() == "| old |\n"  # the old file is intact
        assert not list((tmp_path / "r").glob(".*.tmp"))
    from ctrlsim.experiments.store import read_run_records

    # what was stored before is kept (an unsynced line may or may not have reached the disk)
    assert "a" in read_run_records(tmp_path / "r" / "records.jsonl")[1]


def test_a_folder_holding_only_an_llm_cache_opened_first_is_a_new_run_folder(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "llm-cache.sqlite").write_bytes(b"")  # a response cache the caller opened there first
    with RunFolder(run, {"seed": 0}) as folder:
        folder.store.add("a", {"v": 1})
    assert (run / "llm-cache.sqlite").exists() and (run / "records.jsonl").exists()
