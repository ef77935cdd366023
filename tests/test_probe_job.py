"""`ctrlsim probe`: the random-probe main job, its run folder, resume, and bad input caught first."""
import json
import os

import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.probe.config import ProbeRunConfig

SMALL = ["--recommender", "popularity", "--agents", "3", "--rounds", "5", "--target", "Horror",
         "--ceiling-states", "30"]


def stored(folder):
    lines = (folder / "records.jsonl").read_text().splitlines()
    return json.loads(lines[0])["config"], {r["key"]: r["record"] for r in map(json.loads, lines[1:])}


def test_probe_job_writes_a_run_folder_and_prints_table1(tmp_path, capsys, ml100k):
    out = tmp_path / "run"
    assert main(["probe", *SMALL, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Cov% t=5" in text and "Eff t=5" in text and "Ceiling" in text
    config, records = stored(out)
    assert config["slate_size"] == 3 and config["checkpoints"] == [5] and config["agents"] == 3
    assert set(records) == {"episode", "ceiling"}
    episode = records["episode"]
    assert [p["name"] for p in episode["roster"]] == ["user-1", "user-2", "user-3"]  # the first users
    assert episode["recommender"]["recommender"] == "popularity" and episode["tokens"] == 0
    assert episode["metrics"]["5"]["avg_len"] == pytest.approx(episode["likes"] / 3)
    cov5, ceiling5 = episode["metrics"]["5"]["coverage"], records["ceiling"]["at"]["5"]
    assert f"{100 * cov5:.2f}" in text and f"{100 * ceiling5:.2f}" in text
    assert (out / "tables.md").read_text().strip() in text
    assert json.loads((out / "config.json").read_text())["config"] == config


def test_failure_after_work_keeps_the_finished_part_and_a_rerun_resumes(tmp_path, capsys, monkeypatch,
                                                                         ml100k):
    out = tmp_path / "run"

    def broken_ceiling(*args, **kwargs):
        raise MemoryError("ceiling ran out of memory")

    monkeypatch.setattr("ctrlsim.envs.ceiling.controllability_ceiling", broken_ceiling)
    assert main(["probe", *SMALL, "--out", str(out)]) == 1  # units failed (2 is for bad values)
    err = capsys.readouterr().err
    assert "ceiling: MemoryError: ceiling ran out of memory" in err and str(out) in err
    _, records = stored(out)
    assert set(records) == {"episode"}  # the finished episode is on disk
    assert "Base (random, K=3)" in (out / "tables.md").read_text()
    first_episode_line = (out / "records.jsonl").read_text().splitlines()[1]

    monkeypatch.undo()
    assert main(["probe", *SMALL, "--out", str(out)]) == 0
    lines = (out / "records.jsonl").read_text().splitlines()
    assert lines[1] == first_episode_line and len(lines) == 3  # resumed: only the ceiling was added
    assert json.loads(lines[2])["key"] == "ceiling"


@pytest.mark.parametrize("flags, named", [
    (["--ceiling-states", "0"], "ceiling_states must be in [1, 1000000], got 0"),
    (["--ceiling-states", "10"], "ceiling_states must be at least rounds (20)"),
    (["--slate-size", "0"], "slate_size must be in [1, 10000], got 0"),
    (["--like-prob", "2"], "like_prob must be in [0.0, 1.0], got 2.0"),
    (["--seed", "-1"], "seed must be in [0, 9223372036854775807], got -1"),
    (["--agents", "0"], "agents must be in [1, 100000], got 0"),
    (["--checkpoints", "5,25"], "round 25 is beyond --rounds 20"),
    (["--task", "bogus"], "'bogus'"),
    (["--recommender", "nope"], "'nope'"),
    (["--target", "Nope"], "'Nope'"),
    (["--agents", "5000"], "5000 probes"),
])
def test_bad_flags_fail_before_any_model_loads(tmp_path, capsys, monkeypatch, flags, named):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr("ctrlsim.recommenders.make_recommender", no_model)
    out = tmp_path / "run"
    assert main(["probe", *flags, "--out", str(out)]) == 2
    assert named in capsys.readouterr().err
    assert not (out / "records.jsonl").exists()


def test_bad_output_places_fail_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ctrlsim.recommenders.make_recommender",
                        lambda *a, **k: pytest.fail("model loaded before the output was checked"))
    a_file = tmp_path / "results.json"
    a_file.write_text("{}")
    assert main(["probe", "--out", str(a_file / "run")]) == 2
    assert f"{str(a_file)!r} is a file" in capsys.readouterr().err
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main(["probe", "--out", str(locked / "run")]) == 2
        assert "is not writable" in capsys.readouterr().err


def test_config_round_trips_and_resolves_paper_defaults():
    narm = ProbeRunConfig()
    assert narm.resolved_slate_size == 20 and narm.resolved_checkpoints == (5, 10, 15, 20)
    short = ProbeRunConfig(recommender="sasrec", rounds=12)
    assert short.resolved_slate_size == 3 and short.resolved_checkpoints == (5, 10)
    assert ProbeRunConfig(rounds=3, ceiling_states=3).resolved_checkpoints == (3,)
    assert short.to_dict()["checkpoints"] == [5, 10] and short.to_dict()["slate_size"] == 3
    with pytest.raises(ConfigError, match=r"recommender_options\['model'\] is a object"):
        ProbeRunConfig(recommender_options={"model": object()})  # config.json holds plain data only


def test_sigkill_between_units_then_resume_gives_the_uninterrupted_records(tmp_path, ml100k):
    import signal
    import subprocess
    import sys
    import time

    flags = ["--recommender", "popularity", "--agents", "3", "--rounds", "20", "--target", "Horror",
             "--ceiling-states", "2000"]

    def records_of(folder):
        _, records = stored(folder)
        for record in records.values():
            record.pop("seconds", None)  # wall time is the only thing allowed to differ
        return records

    def run(folder):
        return subprocess.Popen([sys.executable, "-m", "ctrlsim.experiments.cli", "probe", *flags,
                                 "--out", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "CTRLSIM_THREADS": "1"})

    killed = tmp_path / "killed"
    proc = run(killed)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        path = killed / "records.jsonl"
        if path.exists() and '"key": "episode"' in path.read_text():
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and set(stored(killed)[1]) == {"episode"}  # killed mid-ceiling
    assert run(killed).wait() == 0  # resumes
    assert run(tmp_path / "whole").wait() == 0
    assert records_of(killed) == records_of(tmp_path / "whole")
    keys = [json.loads(line).get("key") for line in (killed / "records.jsonl").read_text().splitlines()[1:]]
    assert keys == ["episode", "ceiling"]  # nothing repeated
