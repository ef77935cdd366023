"""The driver's policies on runs that need no model (random probes on the popularity box):
extending a run folder, refusing a config change with the fields named, --config files,
`ctrlsim report` on one and on several folders, and the Python API."""
from __future__ import annotations

import json

import pandas as pd
import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.identity import differing_fields, extend_config
from ctrlsim.experiments.store import read_run_records
from ctrlsim.experiments.tables import markdown_tables

FAST = ["--methods", "random", "--recommenders", "popularity", "--targets", "War", "--agents", "4,3",
        "--rounds", "3", "--figures", "false"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def _records(out):
    return read_run_records(out / "records.jsonl")


def test_identity_diff_and_extension_by_hand():
    stored = {"seeds": [0], "rounds": 8, "nested": {"llms": ["a"], "k": 5}}
    assert differing_fields(stored, {**stored, "seeds": [0, 1]}) == ["seeds"]
    assert extend_config(stored, {**stored, "seeds": [1, 0, 2]}, ["seeds"], where="x")["seeds"] == [0, 1, 2]
    grown = extend_config(stored, {**stored, "nested": {"llms": ["b"], "k": 5}}, ["nested.llms"], where="x")
    assert grown["nested"] == {"llms": ["a", "b"], "k": 5}
    with pytest.raises(ConfigError) as caught:
        extend_config(stored, {**stored, "rounds": 9, "seeds": [0, 1]}, ["seeds"], where="run/records.jsonl")
    message = str(caught.value)
    assert "rounds: stored 8, now 9" in message and "seeds" not in message.split("\n")[1]
    assert len(message.splitlines()) <= 4  # a few lines, not two whole configs


def test_adding_seeds_and_targets_extends_the_run(tmp_path):
    out = tmp_path / "run"
    assert main(["ctrlbench", *FAST, "--seeds", "0", "--out", str(out)]) == 0
    first = (out / "records.jsonl").read_text().splitlines()
    assert main(["ctrlbench", *FAST, "--seeds", "0,1", "--targets", "War,Film-Noir", "--out", str(out)]) == 0
    lines = (out / "records.jsonl").read_text().splitlines()
    assert lines[:len(first)] == first  # finished units kept, byte for byte
    config, records = _records(out)
    assert config["seeds"] == [0, 1] and config["targets"] == ["War", "Film-Noir"]
    assert sorted(records) == sorted(f"random|popularity|{t}|seed={s}" for t in ("War", "Film-Noir")
                                     for s in (0, 1))
    assert json.loads((out / "config.json").read_text())["config"]["seeds"] == [0, 1]
    # Asking for the first config again resumes the extended folder: nothing runs, nothing is lost.
    assert main(["ctrlbench", *FAST, "--seeds", "0", "--out", str(out)]) == 0
    assert (out / "records.jsonl").read_text().splitlines() == lines
    assert "Film-Noir" in (out / "tables.md").read_text()  # the tables cover the whole folder


def test_a_change_that_would_alter_finished_units_is_refused_naming_the_fields(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["ctrlbench", *FAST, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["ctrlbench", *FAST, "--rounds", "4", "--like-prob", "0.5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rounds: stored 3, now 4" in err and "like_prob: stored 0.3, now 0.5" in err
    assert "methods" not in err.split("use another --out")[0].split("differ:")[1]
    assert len(err.strip().splitlines()) <= 6


def test_config_file_then_flags(tmp_path):
    out = tmp_path / "run"
    assert main(["ctrlbench", *FAST, "--seeds", "3", "--out", str(out)]) == 0
    again = tmp_path / "again"
    assert main(["ctrlbench", "--config", str(out / "config.json"), "--rounds", "2", "--figures", "false",
                 "--out", str(again)]) == 0
    config, _ = _records(again)
    assert config["seeds"] == [3] and config["agents"] == [4, 3] and config["rounds"] == 2
    assert main(["probe", "--config", str(out / "config.json"), "--out", str(tmp_path / "p")]) == 2


def test_report_rebuilds_one_folder_and_merges_several(tmp_path):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "merged"
    assert main(["ctrlbench", *FAST, "--seeds", "0", "--out", str(a)]) == 0
    assert main(["ctrlbench", *FAST, "--seeds", "1", "--out", str(b)]) == 0
    tables = (a / "tables.md").read_text()
    (a / "tables.md").write_text("stale\n")
    assert main(["report", str(a)]) == 0
    assert (a / "tables.md").read_text() == tables
    assert main(["report", str(a), str(b), "--out", str(merged), "--figures", "false"]) == 0
    config, records = _records(merged)
    assert config["seeds"] == [0, 1] and len(records) == 2
    table1 = markdown_tables((merged / "tables.md").read_text())
    n_column = next(df for name, df in table1.items() if "n" in df.columns)["n"]
    assert list(n_column) == [2.0]  # both seeds in one row
    assert main(["report", str(a), str(b)]) == 2  # several folders need --out


def test_python_api_returns_records_and_dataframes(tmp_path):
    result = ctrlsim.run("ctrlbench", out=tmp_path / "run", methods=("random",), recommenders=("popularity",),
                         targets=("War",), agents=(4, 3), rounds=3, seeds=(0,), show_progress=False)
    assert result.ok and [r["key"] for r in result.records] == ["random|popularity|War|seed=0"]
    assert all(isinstance(df, pd.DataFrame) for df in result.tables.values()) and result.tables
    with pytest.raises(ConfigError, match="unknown field"):
        ctrlsim.run("ctrlbench", out=tmp_path / "x", bogus=1)


def test_markdown_tables_parse_by_hand():
    text = ("# Title\n\n## One\n\n| a | b |\n|---|--:|\n| x | 1.5 |\n| y | - |\n\n"
            "## One\n\n| c |\n|---|\n| 2 |\n")
    tables = markdown_tables(text)
    assert list(tables) == ["One", "One (2)"]
    assert tables["One"].to_dict("list") == {"a": ["x", "y"], "b": [1.5, "-"]}
    assert tables["One (2)"]["c"].tolist() == [2.0]


@pytest.mark.parametrize("command, message", [
    (["promptshift", "--llms", "smollm2-135m,/no/such/model.gguf"],
     "llms: no model file or folder at /no/such"),
    (["ctrlbench", "--llm", "no-such-model"], "llm: 'no-such-model' is not a bundled LLM"),
    (["steereval", "--llm", "openai:qwen"], "the openai runtime needs an http(s) URL"),
    (["evolve", "--encoder", "no-such-encoder"], "encoder: unknown encoder 'no-such-encoder'"),
    (["steereval", "--encoder", "no-such-encoder"], "encoder: unknown encoder 'no-such-encoder'"),
])
def test_model_specs_that_can_only_fail_are_refused_before_anything_runs(command, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*command, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # refused before the run folder was made


def test_llm_spec_check_by_hand(tmp_path):
    from ctrlsim.backends.spec_check import check_llm_spec
    from ctrlsim.errors import ModelNotFoundError

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    for good in ("smollm2-135m", "http://127.0.0.1:9/v1#m", f"llamacpp:{model}", "org/name", str(model)):
        check_llm_spec(good)
    for bad, error in (("", ConfigError), ("http://", ConfigError), ("qwen-7b", ModelNotFoundError),
                       (str(tmp_path / "absent.gguf"), ModelNotFoundError), ("llamacpp:", ConfigError)):
        with pytest.raises(error):
            check_llm_spec(bad)


def test_a_shuffled_unit_order_changes_no_record(tmp_path):
    """`--unit-order-seed` runs a wave's units in a seeded order (what `ctrlsim noise` varies); a unit is
    a pure function of its config and key, so only the order of the lines and the timings differ."""
    def run(out, *extra):
        assert main(["ctrlbench", *FAST, "--seeds", "0,1,2", *extra, "--out", str(out)]) == 0
        lines = (out / "records.jsonl").read_text().splitlines()[1:]
        return [json.loads(line)["key"] for line in lines], _records(out)[1]

    plain, records = run(tmp_path / "plain")
    shuffled, again = run(tmp_path / "shuffled", "--unit-order-seed", "5")
    assert sorted(shuffled) == sorted(plain) and shuffled != plain
    assert run(tmp_path / "same-seed", "--unit-order-seed", "5")[0] == shuffled
    drop = lambda record: {k: v for k, v in record.items() if k != "timing"}  # noqa: E731
    assert {k: drop(r) for k, r in again.items()} == {k: drop(r) for k, r in records.items()}
