"""Learned probes (`ctrlsim.agents.rl`, `ctrlsim train-probe`, ctrlbench's `rl:PATH` methods): a saved
policy acts as it acted in training, runs as a ctrlbench method, and bad policies or mismatched runs
are refused up front."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.cli import main

sb3 = pytest.importorskip("stable_baselines3")

TRAIN = [
    "train-probe",
    "--recommender",
    "dial:1",
    "--target",
    "War",
    "--timesteps",
    "256",
    "--n-steps",
    "64",
    "--budget",
    "5",
    "--figures",
    "true",
]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy")
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


def test_train_probe_writes_the_policy_its_curve_and_a_figure(trained):
    from ctrlsim.agents.rl import read_curve, read_meta

    for name in (
        "policy.zip",
        "policy.json",
        "learning_curve.csv",
        "figures/learning_curve.png",
        "tables.md",
        "records.jsonl",
    ):
        assert (trained / name).is_file(), name
    meta = read_meta(trained)
    assert meta["timesteps"] == 256 and meta["algorithm"] == "PPO" and meta["search_menu"] == []
    assert meta["config"]["recommender"] == "dial:1" and meta["features"]["slate_size"] == 3
    rows = read_curve(trained / "learning_curve.csv")
    assert len(rows) == meta["episodes"] == 256 // 5  # budget 5: one episode per 5 steps
    assert [r["timesteps"] for r in rows] == sorted(r["timesteps"] for r in rows)
    assert all(0.0 <= r["coverage"] <= 1.0 for r in rows)
    assert "| black box" in (trained / "tables.md").read_text()


def test_a_finished_training_folder_resumes_to_nothing(trained, capsys):
    before = (trained / "policy.zip").read_bytes()
    assert main([*TRAIN, "--out", str(trained)]) == 0
    assert (trained / "policy.zip").read_bytes() == before  # not trained again


def test_a_loaded_policy_acts_on_raw_observations_as_the_model_does_on_features(trained, ml100k):
    from ctrlsim.agents.rl import LearnedProbe
    from ctrlsim.envs import ProbeEnv
    from ctrlsim.envs.wrappers import SlateFeatures

    probe = LearnedProbe.load(trained, ml100k)
    model = sb3.PPO.load(trained / "policy.zip", device="cpu")
    features = SlateFeatures(ml100k, 3, 5)
    env = ProbeEnv("dial:1", dataset=ml100k, target="War", budget=5, allow_search=False)
    observation, info = env.reset(seed=0)
    for _ in range(5):
        action = probe.act(observation, info)
        expected, _ = model.predict(features.encode(observation), deterministic=True)
        assert action["query"] == "" and action["likes"].tolist() == np.asarray(expected).tolist()
        observation, _, _, truncated, info = env.step(action)
    assert truncated


def test_a_saved_policy_is_a_ctrlbench_method(trained, tmp_path):
    out = tmp_path / "bench"
    code = main(
        [
            "ctrlbench",
            "--methods",
            f"random,rl:{trained}",
            "--recommenders",
            "dial:1",
            "--targets",
            "War",
            "--agents",
            "2,2",
            "--rounds",
            "3",
            "--seeds",
            "0,1",
            "--reference",
            "random",
            "--out",
            str(out),
            "--figures",
            "false",
        ]
    )
    assert code == 0
    lines = (out / "records.jsonl").read_text().splitlines()[1:]
    methods = sorted({json.loads(line)["record"]["method"] for line in lines})
    assert methods == sorted(["random", f"rl:{trained}"])
    tables = (out / "tables.md").read_text()
    assert f"RL ({trained.name}, trained on dial:1)" in tables
    assert "Paired comparison with random" in tables


def test_a_policy_trained_on_other_slates_or_with_search_is_refused(trained, tmp_path, capsys):
    common = [
        "--recommenders",
        "dial:1",
        "--targets",
        "War",
        "--agents",
        "1,1",
        "--rounds",
        "1",
        "--out",
        str(tmp_path / "x"),
    ]
    assert main(["ctrlbench", "--methods", f"rl:{trained}", "--slate-size", "4", *common]) == 2
    assert "trained on slates of 3" in capsys.readouterr().err
    meta = json.loads((trained / "policy.json").read_text())
    searching = tmp_path / "searching"
    searching.mkdir()
    (searching / "policy.zip").write_bytes((trained / "policy.zip").read_bytes())
    (searching / "policy.json").write_text(json.dumps({**meta, "search_menu": ["War"]}))
    assert main(["ctrlbench", "--methods", f"rl:{searching}", *common]) == 2
    assert "--allow-search" in capsys.readouterr().err


def test_missing_or_damaged_policies_are_named(tmp_path):
    from ctrlsim.agents.rl import read_meta

    with pytest.raises(ConfigError, match="policy.zip is missing"):
        read_meta(tmp_path)
    (tmp_path / "policy.zip").write_bytes(b"x")
    (tmp_path / "policy.json").write_text("{not json")
    with pytest.raises(DataFileError, match="not valid JSON"):
        read_meta(tmp_path)
    (tmp_path / "policy.json").write_text(json.dumps({"features": {}}))
    with pytest.raises(DataFileError, match="not a learned probe"):
        read_meta(tmp_path)


def test_features_of_another_catalogue_are_refused(trained, ml100k):
    from ctrlsim.agents.rl import read_meta
    from ctrlsim.envs.wrappers import SlateFeatures

    settings = read_meta(trained)["features"]
    with pytest.raises(ConfigError, match="other tags"):
        SlateFeatures.from_settings(ml100k, {**settings, "catalogue_tags": ["Jazz"]})
    with pytest.raises(ConfigError, match="retrain"):
        SlateFeatures.from_settings(ml100k, {**settings, "version": 0})


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--timesteps", "0"], "timesteps must be an integer in [1, 10000000]"),
        (["--algorithm", "DQN"], "'DQN'"),
        (["--target", "Jazz"], "unknown target tag(s) ['Jazz']"),
        (["--recommender", "nope"], "'nope'"),
        (["--search-menu", "genres"], "search_menu must be 'tags'"),
    ],
)
def test_bad_training_flags_fail_before_training(flags, named, tmp_path, capsys):
    assert main(["train-probe", *flags, "--out", str(tmp_path / "t")]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_a_learned_probe_beats_random_where_likes_steer_and_not_where_they_do_not(tmp_path):
    """Issue 23's evidence at a smaller budget (benchmarks/rl_probe_evidence.py, 10,000 steps)."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "rl_probe_evidence.py"
    spec = importlib.util.spec_from_file_location("rl_probe_evidence", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary_path = tmp_path / "summary.json"
    assert (
        module.main(["--timesteps", "10000", "--work", str(tmp_path / "work"), "--save", str(summary_path)])
        == 0
    )
    boxes = json.loads(summary_path.read_text())["boxes"]
    steered = boxes["dial:1"]["difference"]
    assert steered["low"] > 0  # the 95% CI excludes zero
    for box in ("dial:0", "popularity"):  # negative controls: not resolved above random
        assert boxes[box]["difference"]["low"] <= 0


@pytest.mark.parametrize(
    "field, value",
    [("learning_rate", True), ("learning_rate", 0.0), ("timesteps", 2.5), ("seed", -1), ("target", ())],
)
def test_a_bad_training_config_from_python_is_a_config_error(field, value):
    from ctrlsim.agents.rl import TrainProbeConfig

    with pytest.raises(ConfigError, match=field):
        TrainProbeConfig(**{field: value})
