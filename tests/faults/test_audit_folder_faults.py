"""The audit folder is a run folder in the guarded sense, and the audit owns what it audits (issue 45,
items 4 and 7), with the reported reproductions: `ctrlsim audit --out` a user's folder deleted its
report.html and summary.json and crashed; links planted at audit.json and cost.jsonl were written
through; a sub-run setting replaced the audited box."""
from __future__ import annotations

import json
import os

import pytest

from ctrlsim.errors import ConfigError, DataFileError, RunLockedError
from ctrlsim.experiments.audit.config import AUDIT_FILE, COST_FILE, REPORT, SUMMARY, AuditConfig, plan_subruns
from ctrlsim.experiments.audit.folder import LOCK, AuditFolder
from ctrlsim.experiments.audit.units import AuditFailedError, run_audit
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.config import RunOptions

QUICK = {"ctrlbench": {"methods": ["oracle"], "rounds": 1, "seeds": [0, 1]}}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def broken_box(monkeypatch):
    """A box whose every unit fails at once: an audit into it stops after its folder is set up."""
    from ctrlsim.recommenders import registry

    class Broken:
        def __init__(self, dataset, **options):
            pass

        def recommend(self, states, k, **kwargs):
            raise RuntimeError("the box is down")

    monkeypatch.setitem(registry.RECOMMENDERS, "audit-broken", Broken)
    return "audit-broken"


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def users_folder(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / REPORT).write_text("<p>my own report</p>")
    (folder / SUMMARY).write_text('{"mine": true}')
    (folder / "notes.txt").write_text("precious\n")
    return folder


# ------------------------------------------------------------------------ a folder that is not the audit's

def test_audit_out_a_users_folder_is_refused_and_nothing_of_it_deleted(tmp_path, capsys):
    """The reported reproduction: the user's report.html and summary.json were deleted, then a traceback."""
    folder = users_folder(tmp_path)
    before = snapshot(folder)
    assert main(["audit", "popularity", "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert str(folder) in err and "not a ctrlsim audit folder" in err and "Traceback" not in err
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(before)


def test_a_runners_run_folder_is_not_an_audit_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text('{"config": {}}\n')
    (run / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a ctrlsim audit folder"):
        run_audit(AuditConfig(boxes=("popularity",)), RunOptions(out=str(run)), show_progress=False)
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "records.jsonl"]


def test_overwrite_moves_a_users_folder_aside_whole(tmp_path, broken_box):
    folder = users_folder(tmp_path)
    before = snapshot(folder)
    config = AuditConfig(boxes=(broken_box,), overrides=QUICK)
    with pytest.raises(AuditFailedError):
        run_audit(config, RunOptions(out=str(folder), overwrite=True), show_progress=False)
    [previous] = tmp_path.glob("mine.previous-*")
    assert snapshot(previous) == before
    assert not (folder / REPORT).exists() and (folder / AUDIT_FILE).is_file()


def test_overwrite_moves_an_earlier_audit_aside_and_a_rerun_resumes_in_place(tmp_path, broken_box):
    out = tmp_path / "a"
    config = AuditConfig(boxes=(broken_box,), overrides=QUICK)
    for _ in range(2):  # the audit's own folder: a rerun resumes in it, nothing moves
        with pytest.raises(AuditFailedError):
            run_audit(config, RunOptions(out=str(out)), show_progress=False)
    assert not list(tmp_path.glob("a.previous-*"))
    assert len((out / COST_FILE).read_text().splitlines()) == 2
    with pytest.raises(AuditFailedError):
        run_audit(config, RunOptions(out=str(out), overwrite=True), show_progress=False)
    [previous] = tmp_path.glob("a.previous-*")
    assert {AUDIT_FILE, COST_FILE, "ctrlbench"} <= {p.name for p in previous.iterdir()}
    assert len((previous / COST_FILE).read_text().splitlines()) == 2
    assert len((out / COST_FILE).read_text().splitlines()) == 1


def test_a_second_audit_on_a_folder_in_use_is_refused(tmp_path, capsys):
    out = tmp_path / "a"
    with AuditFolder(out):
        assert main(["audit", "popularity", "--out", str(out)]) == 2
        with pytest.raises(RunLockedError, match="being written by another audit"):
            run_audit(AuditConfig(boxes=("popularity",)), RunOptions(out=str(out)), show_progress=False)
    err = capsys.readouterr().err
    assert str(out) in err and "being written by another audit" in err
    assert sorted(p.name for p in out.iterdir()) == [LOCK]


def test_the_llms_audit_folder_is_guarded_too(tmp_path):
    from stand_in_llm import StandInLLM

    from ctrlsim.experiments.audit.sensitivity import run_audit_across_llms

    folder = users_folder(tmp_path)
    before = snapshot(folder)
    llms = {name: StandInLLM(name, 0.9, 0.1) for name in ("stand-in-a", "stand-in-b")}
    with pytest.raises(ConfigError, match="not a ctrlsim audit folder"):
        run_audit_across_llms(AuditConfig(boxes=("popularity",), overrides=QUICK), list(llms),
                              RunOptions(out=str(folder)), show_progress=False,
                              resources={"llms": llms, **llms})
    assert snapshot(folder) == before


def test_an_llms_audit_folder_from_before_its_top_marker_is_still_the_audits(tmp_path):
    out = tmp_path / "a"
    (out / "llm=stand-in-a").mkdir(parents=True)
    (out / "llm=stand-in-a" / AUDIT_FILE).write_text("{}")
    (out / REPORT).write_text("<p>the comparison</p>")
    with AuditFolder(out):
        pass
    (out / "notes.txt").write_text("precious\n")  # not an audit's: the folder is someone else's
    with pytest.raises(ConfigError, match="not a ctrlsim audit folder"):
        AuditFolder(out)


def test_a_runners_llms_folder_is_guarded_the_same_way(tmp_path):
    """`ctrlsim <runner> --llms A,B --out DIR` unlinked DIR's sensitivity.md and sensitivity.json."""
    from stand_in_llm import StandInLLM

    from ctrlsim.experiments.sensitivity import run_across_llms

    llms = {name: StandInLLM(name, 0.9, 0.1) for name in ("stand-in-a", "stand-in-b")}
    small = {"protocol": "ctrlbench", "methods": ("base-small",), "dials": (0.0, 1.0), "seeds": (0,),
             "targets": ("War",), "agents": (1, 1), "rounds": 1, "decision": "yesno"}
    folder = users_folder(tmp_path)
    (folder / "sensitivity.md").write_text("my notes")
    before = snapshot(folder)
    with pytest.raises(ConfigError, match="not the per-model runs of a --llms run"):
        run_across_llms("calibrate", list(llms), out=folder, loaded=llms, show_progress=False, **small)
    assert snapshot(folder) == before
    own, victim = tmp_path / "own", tmp_path / "victim"
    own.mkdir()
    victim.write_text("precious\n")
    (own / "sensitivity.md").symlink_to(victim)
    with pytest.raises(DataFileError, match="sensitivity.md: is a symbolic link"):
        run_across_llms("calibrate", list(llms), out=own, loaded=llms, show_progress=False, **small)
    assert victim.read_text() == "precious\n" and sorted(p.name for p in own.iterdir()) == ["sensitivity.md"]


# ----------------------------------------------------------------------------- links and writers

@pytest.mark.parametrize("name", [AUDIT_FILE, COST_FILE, REPORT, SUMMARY, "ctrlbench"])
def test_a_link_planted_in_an_audit_folder_is_refused_before_anything_runs(tmp_path, name, capsys):
    """Reported for audit.json and cost.jsonl (written through); report.html, summary.json and a
    sub-run folder are the same kind."""
    out, victim = tmp_path / "a", tmp_path / "victim"
    out.mkdir()
    if name != AUDIT_FILE:
        (out / AUDIT_FILE).write_text("{}")  # an earlier audit's folder
    if name == "ctrlbench":
        victim.mkdir()
    else:
        victim.write_text("precious\n")
    (out / name).symlink_to(victim)
    assert main(["audit", "popularity", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / name}: is a symbolic link" in err
    if name == "ctrlbench":
        assert list(victim.iterdir()) == []
    else:
        assert victim.read_text() == "precious\n"
    assert (out / name).is_symlink()


def test_a_link_at_a_predictable_temporary_name_is_never_written_through(tmp_path):
    """Atomic writes used `.<name>.<pid>.tmp`: a link planted there sent the data into its target."""
    from ctrlsim.atomic import atomic_write_text

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f".{REPORT}.{os.getpid()}.tmp").symlink_to(victim)
    atomic_write_text(tmp_path / REPORT, "<p>report</p>")
    assert victim.read_text() == "precious\n" and (tmp_path / REPORT).read_text() == "<p>report</p>"
    assert not (tmp_path / REPORT).is_symlink()


def test_audit_files_are_written_atomically_with_secrets_cut(tmp_path):
    with AuditFolder(tmp_path / "a") as folder:
        folder.write_json(SUMMARY, {"box": "http://user:secret@host:8000"})
        assert json.loads(folder.file(SUMMARY).read_text()) == {"box": "http://***@host:8000"}
        assert not list(folder.path.glob(".*.tmp"))


def test_a_cost_entry_without_its_seconds_is_named(tmp_path):
    with AuditFolder(tmp_path / "a") as folder:
        folder.append_cost({"wall_s": 1.0, "cpu_s": 1.0})
        folder.append_cost({"wall_s": "a lot"})
        with pytest.raises(DataFileError, match=r"cost\.jsonl: entry 2 is not an invocation's cost"):
            folder.read_costs()


# ----------------------------------------------------------------------------- fields the audit owns

@pytest.mark.parametrize("settings, named", [
    ({"ctrlbench": {"--recommenders": "dial:0"}}, "--recommenders is the audit's own"),  # the report
    ({"ctrlbench": {"recommenders": ["dial:0"]}}, "recommenders is the audit's own"),
    ({"calibrate-ctrlbench": {"compare": ["dial:0"]}}, "compare is the audit's own"),
    ({"ctrlbench": {"llm": "smollm2-135m"}}, "llm is the audit's own"),
    ({"calibrate-ctrlbench": {"llm": "smollm2-135m"}}, "llm is the audit's own"),
    ({"ctrlbench": {"dataset": "ml-1m"}}, "dataset is the audit's own"),
    ({"ctrlbench": {"slate_size": 20}}, "slate_size is the audit's own"),
    ({"calibrate-ctrlbench": {"slate-size": 20}}, "slate-size is the audit's own"),
    ({"ctrlbench": {"recommender_llm": "smollm2-135m"}}, "recommender_llm is the audit's own"),
    ({"ctrlbench": {"out": "/tmp/elsewhere"}}, "'out' is a run option"),
    ({"ctrlbench": {"--executor": "ray"}}, "'--executor' is a run option"),
    ({"calibrate-ctrlbench": {"overwrite": True}}, "'overwrite' is a run option"),
    ({"ctrlbench": {"llms": ["a", "b"]}}, "'llms' is a run option"),
    ({"ctrlbench": {"--rounds": 2}}, "'--rounds' is spelled as a flag"),
    ({"ctrlbench": {"roundz": 2}}, "unknown field(s) roundz"),
])
def test_a_sub_run_setting_cannot_change_what_is_audited(tmp_path, settings, named, capsys):
    config = tmp_path / "settings.json"
    config.write_text(json.dumps(settings))
    assert main(["audit", "popularity", "--out", str(tmp_path / "a"), "--config", str(config)]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("settings, named", [
    ({"steereval": {"encoder": "bge-small"}}, "encoder is the audit's own"),
    ({"steereval": {"conditions": ["default"]}}, "conditions is the audit's own"),
    ({"calibrate-steereval": {"protocol": "ctrlbench"}}, "protocol is the audit's own"),
])
def test_every_path_to_a_sub_run_config_is_checked(settings, named):
    """Python callers build the config without a file: the same check runs in `AuditConfig`."""
    with pytest.raises(ConfigError, match=named):
        AuditConfig(boxes=("embedding",), overrides=settings)


def test_a_callers_dict_changed_later_changes_no_audit():
    settings = {"ctrlbench": {"rounds": 2}}
    config = AuditConfig(boxes=("popularity",), overrides=settings)
    settings["ctrlbench"]["recommenders"] = ["dial:0"]
    [ctrlbench] = [s for s in plan_subruns(config) if s.name == "ctrlbench"]
    assert ctrlbench.fields["recommenders"] == ("popularity",) and ctrlbench.fields["rounds"] == 2


def test_the_llms_audit_keeps_each_model_as_the_probes_llm():
    """`--llms` replaces the probes' LLM per model; no sub-run setting can pin it back."""
    from dataclasses import replace

    config = AuditConfig(boxes=("popularity",), overrides={"ctrlbench": {"rounds": 2}})
    plan = {s.name: s.fields for s in plan_subruns(replace(config, llm="stand-in-a"))}
    assert plan["ctrlbench"]["llm"] == plan["calibrate-ctrlbench"]["llm"] == "stand-in-a"
