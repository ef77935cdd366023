"""Every merge and replay checks provenance (issue 45, item 2).

`ctrlsim report A B --out M` gathers records only from folders made alike (inputs, resolved defaults,
and code unless `--allow-code-change`), refuses a unit two folders hold with different records, and
records its sources' provenance. `--replay RUN` answers only from an exchange log whose answers and
chain of digests verify (`--replay-unverified` replays one anyway, recorded), and the replayed run
records which log it used and its digest."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from http_servers import FaultyService

from ctrlsim.errors import ReplayLogError, UnverifiedReplayWarning
from ctrlsim.experiments import provenance
from ctrlsim.experiments.cli import main
from ctrlsim.jsonlines import CHAIN

CTRLBENCH = ["ctrlbench", "--methods", "random", "--recommenders", "popularity", "--targets", "War",
             "--agents", "1,1", "--rounds", "1", "--figures", "false"]
KEY0, KEY1 = "random|popularity|War|seed=0", "random|popularity|War|seed=1"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def ml100k_copy(tmp_path) -> Path:
    """The embedded ml-100k's RecBole atomic files, copied to a folder the test may edit."""
    from ctrlsim.data.registry import recbole_example_dir

    folder = tmp_path / "data" / "ml-100k"
    folder.mkdir(parents=True)
    for name in ("ml-100k.inter", "ml-100k.item", "ml-100k.user"):
        shutil.copy(Path(recbole_example_dir("ml-100k")) / name, folder / name)
    return folder


def _run(out: Path, *extra: str, seeds: str = "0") -> None:
    assert main([*CTRLBENCH, "--seeds", seeds, "--out", str(out), *extra]) == 0


def _keys(out: Path) -> list[str]:
    return sorted(json.loads(line)["key"] for line in (out / "records.jsonl").read_text().splitlines()[1:])


def _entries(out: Path) -> list[dict]:
    return provenance.read_entries(out / provenance.PROVENANCE)


def _other_code(monkeypatch) -> dict:
    real = provenance.code_version()
    other = {**real, "source_sha256": "f" * 64}
    monkeypatch.setattr(provenance, "code_version", lambda: other)
    return real


# ----------------------------------------------------------------------------- merges


def test_folders_built_from_different_dataset_contents_are_not_merged(tmp_path, ml100k_copy, capsys):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    _run(a, "--dataset", str(ml100k_copy))
    inter = ml100k_copy / "ml-100k.inter"
    lines = inter.read_text(encoding="utf-8").splitlines(keepends=True)
    inter.write_text("".join(lines[:-20000]), encoding="utf-8")  # one config, other data
    _run(b, "--dataset", str(ml100k_copy), seeds="1")
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 2
    err = capsys.readouterr().err
    assert f"input {ml100k_copy}" in err and "files changed: ml-100k.inter" in err
    assert f"in {a}" in err and f"in {b}" in err  # both folders, each with its digest
    assert not merged.exists()


def test_folders_whose_defaults_resolved_differently_are_not_merged(tmp_path, monkeypatch, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a)
    from ctrlsim.experiments.ctrlbench import config as ctrlbench

    monkeypatch.setitem(ctrlbench.PAPER_SLATE_SIZE, "popularity", 5)  # B ran on code with another default
    _run(b, seeds="1")
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "m"), "--allow-code-change"]) == 2
    assert f"default slate_size.popularity: resolved to 3 in {a}, 5 in {b}" in capsys.readouterr().err


def test_folders_of_other_code_merge_only_when_allowed_and_the_allowance_is_recorded(tmp_path, monkeypatch,
                                                                                    capsys):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    _run(a)
    real = _other_code(monkeypatch)
    _run(b, seeds="1")
    monkeypatch.setattr(provenance, "code_version", lambda: real)
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 2
    err = capsys.readouterr().err
    assert "code: ctrlsim" in err and "ffffffffffff" in err and "--allow-code-change" in err
    assert not merged.exists()
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false",
                 "--allow-code-change"]) == 0
    assert _keys(merged) == [KEY0, KEY1]
    entry = _entries(merged)[-1]
    assert entry["allowed_code_change"][0].startswith(f"{b}: code: ctrlsim")
    assert [s["code"]["source_sha256"] for s in entry["merged_from"]] == [real["source_sha256"], "f" * 64]


def test_a_unit_two_folders_hold_with_different_records_is_refused(tmp_path, capsys):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    _run(a)
    shutil.copytree(a, b)
    lines = (b / "records.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["record"]["target_size"] = 14  # the same unit, another number
    (b / "records.jsonl").write_text("\n".join([lines[0], json.dumps(row)]) + "\n")
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 2
    err = capsys.readouterr().err
    assert f"unit {KEY0!r} is in {a} and in {b}" in err and "target_size" in err
    assert not merged.exists()


def test_identical_duplicates_merge(tmp_path):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    _run(a)
    shutil.copytree(a, b)
    _run(b, seeds="0,1")  # B: a copy of A, extended
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 0
    assert _keys(merged) == [KEY0, KEY1]


def test_a_folder_at_out_is_one_more_source(tmp_path, capsys):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    _run(a)
    _run(b, seeds="1")
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 0
    lines = (merged / "records.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:]]
    for row in rows:
        row["record"]["target_size"] = 14
    (merged / "records.jsonl").write_text("\n".join([lines[0], *map(json.dumps, rows)]) + "\n")
    before = (merged / "records.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 2
    assert f"is in {a} and in {merged}" in capsys.readouterr().err
    assert (merged / "records.jsonl").read_bytes() == before  # nothing the user had is lost


def test_a_folder_without_provenance_is_not_merged(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a)
    _run(b, seeds="1")
    (b / provenance.PROVENANCE).unlink()  # as written by a ctrlsim before provenance
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert f"run folder {b} has no provenance.jsonl" in err


def test_the_merged_folder_records_its_sources_provenance_not_todays(tmp_path, monkeypatch):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    _run(a)
    _run(b, seeds="1")
    real = _other_code(monkeypatch)  # the report runs on newer code than the records
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 0
    (entry,) = _entries(merged)
    assert entry["code"]["source_sha256"] == real["source_sha256"]
    assert entry["inputs"] == _entries(a)[-1]["inputs"] and entry["resolved"] == _entries(a)[-1]["resolved"]
    assert [s["folder"] for s in entry["merged_from"]] == [str(a.resolve()), str(b.resolve())]
    # Rebuilding one folder's report on newer code (a report fix) is what `report` is for: no refusal,
    # and its provenance stays what made its records.
    before = (a / provenance.PROVENANCE).read_bytes()
    assert main(["report", str(a), "--figures", "false"]) == 0
    assert (a / provenance.PROVENANCE).read_bytes() == before


def test_a_report_whose_inputs_changed_since_its_records_is_refused(tmp_path, ml100k_copy, capsys):
    a = tmp_path / "a"
    _run(a, "--dataset", str(ml100k_copy))
    inter = ml100k_copy / "ml-100k.inter"
    inter.write_text("".join(inter.read_text().splitlines(keepends=True)[:-20000]))
    tables = (a / "tables.md").read_bytes()
    capsys.readouterr()
    assert main(["report", str(a)]) == 2
    err = capsys.readouterr().err
    assert f"input {ml100k_copy}" in err and "when the records were made" in err
    assert (a / "tables.md").read_bytes() == tables


# ----------------------------------------------------------------------------- replays


@pytest.fixture(scope="module")
def recorded(ml100k, tmp_path_factory):
    """(the service's URL, a live run folder recorded through it); the service is gone afterwards,
    so every replay below answers from the log alone."""
    folder = tmp_path_factory.mktemp("recorded")
    service = FaultyService(ml100k)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CTRLSIM_CACHE", str(folder / "cache"))
        assert main(_http(service.url, folder / "live")) == 0
    service.close()
    return service.url, folder / "live"


def _http(url: str, out: Path, *extra: str) -> list[str]:
    return ["ctrlbench", "--methods", "random", "--recommenders", url, "--targets", "War", "--agents", "2,2",
            "--rounds", "3", "--seeds", "0", "--figures", "false", "--out", str(out), *extra]


@pytest.fixture
def log_copy(recorded, tmp_path) -> Path:
    """A copy of the recorded run folder, whose exchange log a test may edit."""
    copy = tmp_path / "recorded"
    shutil.copytree(recorded[1], copy)
    return copy


def _lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _write(log: Path, rows: list[dict]) -> None:
    log.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def _replay_refused(recorded, log_copy, tmp_path, capsys, *extra: str) -> str:
    capsys.readouterr()
    out = tmp_path / "replayed"
    assert main(_http(recorded[0], out, "--replay", str(log_copy), *extra)) == 2
    assert not (out / "records.jsonl").exists()  # refused before the run folder opened
    return capsys.readouterr().err


def test_a_replay_records_the_log_and_its_digest(recorded, tmp_path):
    url, live = recorded
    log = live / "exchanges.jsonl"
    assert all(CHAIN in row and "answer_sha256" in row for row in _lines(log))
    out = tmp_path / "replayed"
    assert main(_http(url, out, "--replay", str(live))) == 0
    replay = _entries(out)[-1]["replay"]
    assert replay["path"] == str(log.resolve()) and replay["verified"] is True
    assert replay["sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()
    assert replay["lines"] == len(_lines(log)) and replay["chain_sha256"] == _lines(log)[-1][CHAIN]
    assert json.loads((out / "config.json").read_text())["provenance"]["replay"] == replay


def test_an_edited_answer_refuses_the_replay(recorded, log_copy, tmp_path, capsys):
    log = log_copy / "exchanges.jsonl"
    rows = _lines(log)
    rows[1]["response"]["lists"][0]["items"].reverse()  # the same items, another order: a silent change
    _write(log, rows)
    err = _replay_refused(recorded, log_copy, tmp_path, capsys)
    assert str(log) in err and "the answer on line(s) 2 no longer matches" in err
    assert "--replay-unverified" in err


def test_an_edit_with_its_answer_digest_recomputed_still_breaks_the_chain(recorded, log_copy, tmp_path,
                                                                        capsys):
    from ctrlsim.recommenders.http.exchanges import answer_digest

    log = log_copy / "exchanges.jsonl"
    rows = _lines(log)
    rows[1]["response"]["lists"][0]["items"].reverse()
    rows[1]["answer_sha256"] = answer_digest(rows[1]["response"])  # the editor updates the line's digest
    _write(log, rows)
    err = _replay_refused(recorded, log_copy, tmp_path, capsys)
    assert "the chain of digests breaks at line(s) 2" in err


@pytest.mark.parametrize("edit", ["removed", "reordered", "inserted"])
def test_a_line_removed_reordered_or_inserted_refuses_the_replay(recorded, log_copy, tmp_path, capsys, edit):
    log = log_copy / "exchanges.jsonl"
    rows = _lines(log)
    assert len(rows) >= 3
    if edit == "removed":
        del rows[1]
    elif edit == "reordered":
        rows[1], rows[2] = rows[2], rows[1]
    else:
        rows.insert(1, dict(rows[2]))  # an earlier answer to the same request: it would win
    _write(log, rows)
    err = _replay_refused(recorded, log_copy, tmp_path, capsys)
    assert str(log) in err and "the chain of digests breaks at line(s) 2" in err


def test_a_log_without_digests_is_refused_unless_replayed_unverified(recorded, log_copy, tmp_path, capsys):
    log = log_copy / "exchanges.jsonl"
    old = [{k: v for k, v in row.items() if k not in (CHAIN, "answer_sha256")} for row in _lines(log)]
    _write(log, old)  # as a ctrlsim before digests wrote it
    err = _replay_refused(recorded, log_copy, tmp_path, capsys)
    assert f"{len(old)} of {len(old)} line(s) carry no digest" in err and "--replay-unverified" in err
    out = tmp_path / "unverified"
    with pytest.warns(UnverifiedReplayWarning, match="carry no digest"):
        assert main(_http(recorded[0], out, "--replay", str(log_copy), "--replay-unverified")) == 0
    replay = _entries(out)[-1]["replay"]
    assert replay["verified"] is False and "carry no digest" in replay["problems"][0]
    assert replay["sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()
    assert _keys(out) == _keys(recorded[1])


def test_the_replay_option_of_a_box_checks_the_log_too(recorded, log_copy, ml100k):
    from ctrlsim.recommenders import UserState, make_recommender

    log = log_copy / "exchanges.jsonl"
    rows = _lines(log)
    rows[0]["response"]["lists"][0]["items"].reverse()
    _write(log, rows)
    box = make_recommender(recorded[0], ml100k, replay=str(log))
    with pytest.raises(ReplayLogError, match="line.s. 1 no longer matches") as caught:
        box.recommend([UserState(history=("1", "2", "3"))], 3)
    assert caught.value.path == str(log)


def test_a_log_edited_in_place_after_a_replay_is_checked_again(recorded, log_copy, tmp_path, capsys):
    log = log_copy / "exchanges.jsonl"
    assert main(_http(recorded[0], tmp_path / "first", "--replay", str(log))) == 0
    rows = _lines(log)
    rows[-1]["response"]["lists"][0]["items"].reverse()
    with open(log, "r+", encoding="utf-8") as fh:  # the same file (inode), rewritten in place
        fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        fh.truncate()
    err = _replay_refused(recorded, log_copy, tmp_path, capsys)
    assert f"line(s) {len(rows)} no longer matches" in err


def test_replay_unverified_without_a_replay_is_refused(tmp_path, capsys):
    assert main([*CTRLBENCH, "--out", str(tmp_path / "r"), "--replay-unverified"]) == 2
    assert "--replay-unverified goes with --replay" in capsys.readouterr().err


def test_no_url_fragment_switches_the_check_off(ml100k):
    from ctrlsim.errors import ConfigError
    from ctrlsim.recommenders import make_recommender

    with pytest.raises(ConfigError, match="unknown HTTP box option 'replay_unverified'"):
        make_recommender("http://127.0.0.1:9#replay_unverified=true", ml100k)
