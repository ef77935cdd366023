"""A run knows what it is (issue 20, point 2): config.json records the resolved defaults, the digests of
inputs given by path and the code version; a resume whose inputs, defaults or code changed is refused
(code only with an explicit, recorded allowance); the evolution ledger belongs to its config."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ctrlsim.errors import ConfigError, DataFileError, TornLineWarning
from ctrlsim.experiments import provenance
from ctrlsim.experiments.cli import main

CTRLBENCH = ["ctrlbench", "--methods", "random", "--recommenders", "popularity", "--targets", "War",
             "--agents", "1,1", "--rounds", "1", "--figures", "false"]


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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _config_json(run: Path) -> dict:
    return json.loads((run / "config.json").read_text(encoding="utf-8"))


def test_config_json_records_resolved_defaults_input_digests_and_the_code(tmp_path, ml100k_copy):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--dataset", str(ml100k_copy), "--out", str(run)]) == 0
    stored = _config_json(run)["provenance"]
    assert stored["resolved"]["slate_size"] == {"popularity": 3}  # --slate-size left open: the paper's 3
    # A folder's digest: SHA-256 over each file's relative name and SHA-256, in name order.
    folder_digest = hashlib.sha256()
    for name in sorted(p.name for p in ml100k_copy.iterdir()):
        folder_digest.update(name.encode() + b"\0" + _sha256(ml100k_copy / name).encode() + b"\0")
    files = {name: _sha256(ml100k_copy / name) for name in ("ml-100k.inter", "ml-100k.item", "ml-100k.user")}
    assert stored["inputs"] == {str(ml100k_copy): {"path": str(ml100k_copy.resolve()),
                                                   "sha256": folder_digest.hexdigest(), "files": files}}
    code = stored["code"]
    import ctrlsim

    assert code["ctrlsim"] == ctrlsim.__version__ and len(code["source_sha256"]) == 64
    repo = Path(ctrlsim.__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (a wheel install has no commit)
        assert code["git_commit"] == head.stdout.strip()
    # The same entry starts the append-only provenance log.
    entries = provenance.read_entries(run / provenance.PROVENANCE)
    assert len(entries) == 1 and entries[0]["inputs"] == stored["inputs"]


def test_a_dataset_edited_under_the_same_path_refuses_the_resume(tmp_path, ml100k_copy, capsys):
    run = tmp_path / "r"
    args = [*CTRLBENCH, "--dataset", str(ml100k_copy), "--out", str(run)]
    assert main([*args, "--seeds", "0"]) == 0
    inter = ml100k_copy / "ml-100k.inter"
    lines = inter.read_text(encoding="utf-8").splitlines(keepends=True)
    inter.write_text("".join(lines[:-500]), encoding="utf-8")  # fewer ratings, same path
    records = (run / "records.jsonl").read_bytes()
    assert main([*args, "--seeds", "0,1"]) == 2
    err = capsys.readouterr().err
    assert f"input {ml100k_copy}" in err and "files changed: ml-100k.inter (" in err
    assert "--overwrite" in err
    assert (run / "records.jsonl").read_bytes() == records  # seed 1 did not join seed 0's table


def test_a_model_file_replaced_under_the_same_path_refuses_the_resume(tmp_path, capsys):
    # The random method never loads the probe LLM, so any file stands for the GGUF here.
    run, model = tmp_path / "r", tmp_path / "model.gguf"
    model.write_bytes(b"GGUF version one")
    args = [*CTRLBENCH, "--llm", str(model), "--out", str(run)]
    assert main([*args, "--seeds", "0"]) == 0
    model.write_bytes(b"GGUF version two")
    assert main([*args, "--seeds", "0"]) == 2
    assert f"input {model}" in capsys.readouterr().err


def test_changed_code_is_refused_unless_allowed_and_the_allowance_is_recorded(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    real = provenance.code_version()
    other = {**real, "source_sha256": "f" * 64, "libraries": {**real["libraries"], "numpy": "0.0-other"}}
    monkeypatch.setattr(provenance, "code_version", lambda: other)
    assert main([*CTRLBENCH, "--seeds", "0,1", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "code: ctrlsim" in err and "ffffffffffff" in err and "library numpy" in err
    assert "--allow-code-change" in err
    assert main([*CTRLBENCH, "--seeds", "0,1", "--out", str(run), "--allow-code-change"]) == 0
    entries = provenance.read_entries(run / provenance.PROVENANCE)
    assert [e["code"]["source_sha256"] for e in entries] == [real["source_sha256"], "f" * 64]
    assert any(line.startswith("code:") for line in entries[-1]["allowed_code_change"])
    keys = [json.loads(line).get("key") for line in (run / "records.jsonl").read_text().splitlines()[1:]]
    assert sorted(k for k in keys if k) == ["random|popularity|War|seed=0", "random|popularity|War|seed=1"]


def test_a_changed_default_is_refused_even_with_a_code_change_allowed(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    from ctrlsim.experiments.ctrlbench import config as ctrlbench

    monkeypatch.setitem(ctrlbench.PAPER_SLATE_SIZE, "popularity", 5)  # the code's default changed
    assert main([*CTRLBENCH, "--seeds", "0,1", "--out", str(run), "--allow-code-change"]) == 2
    err = capsys.readouterr().err
    assert "default slate_size.popularity: resolved to 3 then, 5 now" in err


def test_an_unchanged_resume_appends_no_provenance_entry(tmp_path):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    assert main([*CTRLBENCH, "--seeds", "0,1", "--out", str(run)]) == 0
    assert len(provenance.read_entries(run / provenance.PROVENANCE)) == 1


def test_a_file_rewritten_in_place_is_hashed_again(tmp_path):
    path = tmp_path / "table.csv"
    path.write_bytes(b"a,b\n1,2\n")
    first = provenance.file_digest(path)
    assert first == _sha256(path)
    path.write_bytes(b"a,b\n3,4\n")  # same size: the remembered digest must not answer
    assert provenance.file_digest(path) == _sha256(path) != first


def test_a_folder_digest_covers_every_file_and_its_name(tmp_path):
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"x")
    (folder / "sub" / "b.bin").write_bytes(b"y")
    digest = provenance.path_digest(folder)
    (folder / "sub" / "b.bin").rename(folder / "sub" / "c.bin")
    renamed = provenance.path_digest(folder)
    (folder / "sub" / "c.bin").write_bytes(b"z")
    assert len({digest, renamed, provenance.path_digest(folder)}) == 3


def test_a_torn_last_provenance_line_is_skipped_and_a_bad_middle_line_named(tmp_path):
    log = tmp_path / provenance.PROVENANCE
    provenance.append_entry(log, {"code": {"source_sha256": "a"}})
    with open(log, "ab") as fh:
        fh.write(b'{"code": {"sour')  # killed mid-write
    assert [e["code"] for e in provenance.read_entries(log)] == [{"source_sha256": "a"}]
    with pytest.warns(TornLineWarning):  # the torn line is moved aside, never joined into the log
        provenance.append_entry(log, {"code": {"source_sha256": "b"}})
    assert [e["code"]["source_sha256"] for e in provenance.read_entries(log)] == ["a", "b"]
    [aside] = tmp_path.glob(f"{provenance.PROVENANCE}.torn-*")
    assert aside.read_bytes() == b'{"code": {"sour'
    with open(log, "ab") as fh:  # damage that is not a torn tail: a bad line with lines after it
        fh.write(b'{"code": \n{"code": {}}\n')
    with pytest.raises(DataFileError, match="line 3 is not JSON"):
        provenance.read_entries(log)


def test_the_evolution_ledger_belongs_to_its_config(tmp_path):
    from ctrlsim.agents.evolution.artefacts import LEDGER, ArtefactFolder

    folder = ArtefactFolder(tmp_path)
    folder.bind({"agents": 2, "target": ["Film-Noir"]})
    folder.finish("profiles", {"seconds": 1.0})
    again = ArtefactFolder(tmp_path)
    again.bind({"agents": 2, "target": ["Film-Noir"]})
    assert again.done("profiles")
    other = ArtefactFolder(tmp_path)
    with pytest.raises(ConfigError, match="agents, target"):
        other.bind({"agents": 3, "target": ["War"]})
    # A ledger written before ledgers were bound adopts the identity of the run that resumes it.
    (tmp_path / LEDGER).write_text(json.dumps({"phases": {"profiles": {"seconds": 1.0}}}))
    legacy = ArtefactFolder(tmp_path)
    legacy.bind({"agents": 3})
    legacy.finish("interact_g0", {"seconds": 2.0})
    assert json.loads((tmp_path / LEDGER).read_text())["identity"] == {"agents": 3}


def test_a_ledger_that_is_not_an_object_is_named(tmp_path):
    from ctrlsim.agents.evolution.artefacts import LEDGER, ArtefactFolder

    (tmp_path / LEDGER).write_text("[1, 2]")
    with pytest.raises(DataFileError, match="not an evolution ledger"):
        ArtefactFolder(tmp_path)


def test_an_extension_keeps_the_resolved_defaults_of_the_boxes_it_did_not_ask_for(tmp_path):
    run = tmp_path / "r"
    assert main([*CTRLBENCH, "--seeds", "0", "--out", str(run)]) == 0
    assert main([*CTRLBENCH[:4], "dial:0", *CTRLBENCH[5:], "--seeds", "0", "--out", str(run)]) == 0
    stored = _config_json(run)["provenance"]["resolved"]["slate_size"]
    assert stored == {"popularity": 3, "dial:0": 3}
