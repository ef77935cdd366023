"""Result store and run folder: no finished result is ever lost (issue: reliability, point 1)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.runfolder import RunFolder
from ctrlsim.experiments.store import ResultStore, StoreLockedError

CONFIG = {"seed": 0, "size": (1, 2)}


def test_second_writer_gets_an_error_naming_the_holder(tmp_path):
    path = tmp_path / "records.jsonl"
    with ResultStore(path, CONFIG):
        with pytest.raises(StoreLockedError, match=rf"pid {os.getpid()} on "):
            ResultStore(path, CONFIG)
    ResultStore(path, CONFIG).close()  # released on close


def test_lock_held_by_another_process(tmp_path):
    path = tmp_path / "records.jsonl"
    code = textwrap.dedent(f"""
        import sys, time
        from ctrlsim.experiments.store import ResultStore
        s = ResultStore({str(path)!r}, {{"seed": 0, "size": [1, 2]}})
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match=f"pid {proc.pid} "):
            ResultStore(path, CONFIG)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # SIGKILL released the lock: a new writer resumes.
    ResultStore(path, CONFIG).close()


def test_append_only_duplicates_resolved_by_first_record(tmp_path):
    path = tmp_path / "records.jsonl"
    with ResultStore(path, CONFIG) as store:
        store.add("a", {"v": 1})
    lines = path.read_text().splitlines()
    # A duplicate key from a foreign writer: the first record wins and nothing is rewritten.
    with open(path, "a") as fh:
        fh.write(json.dumps({"key": "a", "record": {"v": 2}}) + "\n")
    before = path.read_bytes()
    with ResultStore(path, CONFIG) as store:
        assert store.get("a") == {"v": 1}
        assert len(store) == 1
    assert path.read_bytes() == before
    assert path.read_text().splitlines()[:2] == lines


def test_torn_last_line_is_kept_and_skipped(tmp_path):
    path = tmp_path / "records.jsonl"
    with ResultStore(path, CONFIG) as store:
        store.add("a", {"v": 1})
    with open(path, "a") as fh:
        fh.write('{"key": "b", "rec')  # killed mid-write
    torn = path.read_bytes()
    with ResultStore(path, CONFIG) as store:
        assert list(store.records()) == [("a", {"v": 1})]
        store.add("b", {"v": 2})
    assert path.read_bytes().startswith(torn)  # nothing truncated
    with ResultStore(path, CONFIG) as store:
        assert dict(store.records()) == {"a": {"v": 1}, "b": {"v": 2}}


@pytest.mark.parametrize("content, problem", [
    ('[1, 2]\n', "line 1 is not a result-file header"),
    ('{"config": {"seed": 0, "size": [1, 2]}}\n{"record": {}}\n', "line 2 is not a record"),
    ('{"config": {"seed": 0, "size": [1, 2]}}\nnot json\n{"key": "a", "record": {}}\n', "line 2 is not JSON"),
])
def test_malformed_store_is_a_typed_error_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "records.jsonl"
    path.write_text(content)
    with pytest.raises(DataFileError, match=problem) as err:
        ResultStore(path, CONFIG)
    assert str(path) in str(err.value)


def test_binary_store_and_folder_store(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(DataFileError, match="not a UTF-8 text file"):
        ResultStore(path, CONFIG)
    with pytest.raises(DataFileError, match="is a folder"):
        ResultStore(tmp_path, CONFIG)


def test_other_config_is_refused_and_overwrite_keeps_a_backup(tmp_path):
    path = tmp_path / "records.jsonl"
    with ResultStore(path, CONFIG) as store:
        store.add("a", {"v": 1})
    with pytest.raises(ConfigError, match="another config"):
        ResultStore(path, {"seed": 1})
    ResultStore(path, {"seed": 1}, overwrite=True).close()
    backups = list(tmp_path.glob("records.jsonl.*.bak"))
    assert len(backups) == 1 and '"key": "a"' in backups[0].read_text()


def test_run_folder_layout_and_atomic_artefacts(tmp_path):
    with RunFolder(tmp_path / "run", {"seed": 3}) as run:
        run.store.add("u1", {"x": 1})
        run.write_tables("| a |\n|---|\n| 1 |")
        run.write_json("roster_gen0.json", [{"probe_id": "p"}])
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1])
        run.save_figure(fig, "coverage")
    files = sorted(p.relative_to(tmp_path / "run").as_posix() for p in (tmp_path / "run").rglob("*"))
    assert files == ["config.json", "figures", "figures/coverage.png", "provenance.jsonl", "records.jsonl",
                     "records.jsonl.lock", "roster_gen0.json", "tables.md"]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"] == {"seed": 3}
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        RunFolder(tmp_path / "file", {})
