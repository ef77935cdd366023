"""`ctrlsim ctrlbench`: config checks, metric curves by hand, resumable runs, CLI, rosters."""
import json

import pytest
from ctrlsim.agents.population import EpisodeTrace, ProbeTrace
from decision_check import usable_decision

import ctrlsim
from ctrlsim.errors import ConfigError, DataFileError
from ctrlsim.experiments.commands import build_parser, config_from_cli, runner_main
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig, episode_key, parse_key
from ctrlsim.experiments.ctrlbench.report import round_curves
from ctrlsim.experiments.ctrlbench.runner import RUNNER


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def fast(**kw):
    """Random probes on the popularity box: no model at all, so runs take seconds."""
    base = dict(methods=("random",), recommenders=("popularity",), targets=("War", "Film-Noir"),
                agents=(6, 4), rounds=4, seeds=(0, 1))
    return CtrlBenchConfig(**{**base, **kw})


@pytest.mark.parametrize("kw, message", [
    ({"methods": ("base-large", "bogus")}, "bogus"),
    ({"recommenders": ("nope",)}, "nope"),
    ({"agents": (3, 5)}, "K_small <= K_large"),
    ({"agents": (5,)}, "K_large,K_small"),
    ({"rounds": 0}, "rounds"),
    ({"checkpoints": (3, 30)}, "checkpoints"),
    ({"seeds": (1, 1)}, "seeds"),
    ({"targets": ()}, "targets"),
    ({"targets": ("War", "War")}, "War"),
    ({"roster": "/no/such/roster.json"}, "roster"),
    ({"methods": ("roster",)}, "needs --roster"),
    ({"temperature": -1.0}, "temperature"),
    ({"targets": ("War+War",)}, "more than once"),
    ({"targets": ("War+",)}, "empty"),
    ({"task": "ranking"}, "task"),
    ({"reference": "base-large"}, "reference"),
    ({"methods": ("no_such_module_xyz:build",)}, "cannot import module 'no_such_module_xyz'"),
    ({"methods": ("json:no_such_attribute",)}, "has no attribute"),
])
def test_bad_config_values_are_config_errors(kw, message):
    with pytest.raises(ConfigError, match=message):
        fast(**kw)


@pytest.mark.parametrize("targets, message", [(("Noir",), "unknown target tag 'Noir'"),
                                              (("War+Noir",), "unknown target tag 'Noir' in 'War[+]Noir'"),
                                              (("Documentary",), "has only 50 items")])
def test_bad_targets_fail_before_any_work(ml100k, tmp_path, targets, message):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=message):
        ctrlsim.run("ctrlbench", config=fast(targets=targets, min_target_items=60),
                    options=RunOptions(out=str(out)), show_progress=False, raise_on_failure=False)
    assert not out.exists()


def test_keys_round_trip_and_report_rounds():
    assert parse_key(episode_key("base-large", "recbole:GRU4Rec", "Film-Noir", 3)) == \
        ("base-large", "recbole:GRU4Rec", "Film-Noir", 3)
    with pytest.raises(ConfigError):
        parse_key("base-large|narm")
    assert fast(rounds=20).report_rounds() == (5, 10, 15, 20)
    assert fast(rounds=8).report_rounds() == (2, 4, 6, 8)
    assert fast(rounds=8, checkpoints=(8, 3)).report_rounds() == (3, 8)
    assert len(fast().keys()) == 4


def _round(liked, source="recommender"):
    return {"slate": list(liked), "source": source, "liked": list(liked), "query": "", "reply": None}


def test_round_curves_match_hand_computed_values():
    # Target {a, b, c, d}. Probe 1 likes a, x in round 1 and b in round 2; probe 2 likes a and is dropped.
    # Probe 3 likes c on a search-result slate: it never counts.
    trace = EpisodeTrace(2, [ProbeTrace("p1", "probe_0", [], [["a", "x"], ["b"]], [5, 12],
                                        rounds=[_round(["a", "x"]), _round(["b"])]),
                             ProbeTrace("p2", "probe_1", [], [["a"]], [10], dropped="LLM call failed",
                                        rounds=[_round(["a"])]),
                             ProbeTrace("p3", "probe_2", [], [["c"], []], [3, 6],
                                        rounds=[_round(["c"], "search"), _round([])])])
    curves = round_curves(trace, {"a", "b", "c", "d"}, 2)
    assert curves["coverage"] == [0.25, 0.5]
    assert curves["efficiency"] == [2.0, 1.5]             # target likes (a twice, then b) / distinct found
    assert curves["efficiency_all_likes"] == [3.0, 2.0]   # all likes (x too) / distinct found
    assert curves["len"] == [1.0, 4 / 3]                  # (2 + 1 + 0) / 3, then (3 + 1 + 0) / 3
    assert curves["tokens"] == [6.0, 28 / 3]
    empty = round_curves(EpisodeTrace(1, [ProbeTrace("p", "probe_0", [], [["x"]], [0])]), {"a"}, 1)
    assert empty["efficiency"] == [None] and empty["coverage"] == [0.0]


def _without_timing(records):
    return {k: {f: v for f, v in r.items() if f != "timing"} for k, r in records.items()}


def test_interrupted_run_resumes_to_the_same_records(ml100k, tmp_path):
    config = fast()
    whole = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "whole")),
                        show_progress=False, raise_on_failure=False)
    part = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "part")),
                       show_progress=False, max_units=1, raise_on_failure=False)
    assert len(part.records_by_key) == 1
    resumed = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "part")),
                          show_progress=False, raise_on_failure=False)
    assert _without_timing(resumed.records_by_key) == _without_timing(whole.records_by_key)
    lines = (tmp_path / "part" / "records.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 4  # header + each episode once: nothing lost, nothing repeated
    record = whole.records_by_key[episode_key("random", "popularity", "War", 0)]
    assert record["k"] == 4 and record["target_size"] == 71 and record["policy"] == "random"
    assert record["curves"]["tokens"] == [0.0] * 4 and record["target_visible"] is None
    # Coverage from the stored rounds, recomputed here: distinct War items liked / 71.
    war = set(ml100k.items_with_tag("War"))
    liked = {i for p in record["probes"] for r in p["rounds"] for i in r["liked"] if i in war}
    assert record["curves"]["coverage"][-1] == len(liked) / 71
    assert all(r["source"] == "recommender" and set(r["liked"]) <= set(r["slate"])
               for p in record["probes"] for r in p["rounds"])


def test_cli_prints_tables_and_writes_the_run_folder(ml100k, tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["--methods", "random", "--recommenders", "popularity", "--targets", "War", "--agents", "5,3",
            "--rounds", "3", "--out", str(out)]
    assert runner_main("ctrlbench", args) == 0
    printed = capsys.readouterr().out
    assert "Table 1" in printed and "Table 7" in printed and "per target" in printed
    tables = (out / "tables.md").read_text()
    sections = [line for line in tables.splitlines() if line.startswith("## ")]
    assert [s.split(":")[0].split(" (")[0] for s in sections] == [
        "## Probe validity", "## Table 1", "## Table 7", "## Paired comparison with random",
        "## pass^k of control", "## Coverage", "## Substitutions and failures per method",
        "## Cost of the units"]
    assert "2/2 episodes" in tables  # two seeds by default
    figures = {p.name for p in (out / "figures").iterdir()}
    assert figures == {"coverage_by_round.png", "coverage_by_target.png"}
    assert json.loads((out / "config.json").read_text())["config"]["agents"] == [5, 3]
    assert runner_main("ctrlbench", args) == 0  # resume: nothing left to do, same tables


def test_preset_paper_targets_the_union_with_search_off(ml100k):
    """The paper's union target: every item with any of the six genres, counted here from the raw
    genre columns; one population per (method, box, seed); flags on the command line win."""
    from ctrlsim.experiments.ctrlbench.inputs import sizes as _sizes

    parser = build_parser(RUNNER)
    config = config_from_cli(RUNNER, parser.parse_args(["--preset", "paper", "--methods",
                                                        "base-large,base-small"]))
    assert config.methods == ("base-large", "base-small") and not config.allow_search
    six = {"Action", "Thriller", "Romance", "Adventure", "War", "Film-Noir"}
    union = [i for i, tags in zip(ml100k.item_ids, ml100k.items["tags"]) if six & set(tags)]
    assert len(config.targets) == 1 and _sizes(config)[config.targets[0]] == len(union)
    assert len(config.keys()) == 2 * 5 * 1 * len(config.seeds)
    assert config_from_cli(RUNNER, parser.parse_args(["--preset", "paper", "--rounds", "5"])).rounds == 5


def test_bad_roster_files_are_reported(ml100k, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a roster"}')
    with pytest.raises(DataFileError, match="bad.json"):
        ctrlsim.run("ctrlbench", config=fast(methods=(), roster=str(bad)),
                    options=RunOptions(out=str(tmp_path / "r")), show_progress=False,
                    raise_on_failure=False)
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps([{"probe_id": "x", "name": "X", "bio": "b", "behaviour": ["99999"]}]))
    with pytest.raises(DataFileError, match="'x'"):
        ctrlsim.run("ctrlbench", config=fast(methods=(), roster=str(unknown)),
                    options=RunOptions(out=str(tmp_path / "r2")), show_progress=False,
                    raise_on_failure=False)


@pytest.mark.llm
def test_llm_methods_and_a_stored_roster_run_end_to_end(ml100k, tmp_path):
    roster = tmp_path / "roster.json"
    roster.write_text(json.dumps([{"probe_id": "fan", "name": "Sam", "bio": "Sam loves old war movies.",
                                   "interests": ["war"], "behaviour": ["1", "22"]}]))
    config = CtrlBenchConfig(methods=("base-small",), recommenders=("popularity",), targets=("War",),
                             agents=(1, 1), rounds=2, llm="smollm2-135m", roster=str(roster),
                             decision="json")  # the JSON head: its replies are what is checked below
    result = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "llm")),
                         show_progress=False, raise_on_failure=False)
    assert result.failed == {}
    small = result.records_by_key[episode_key("base-small", "popularity", "War", 0)]
    assert small["k"] == 1 and small["target_visible"] is True and small["llm"]["model"] == "smollm2-135m"
    assert small["setup_tokens"] > 0 and small["curves"]["tokens"][-1] > 0
    # Every reply is in the record; parse failures are the replies a plain JSON reader cannot use.
    replies = [r["reply"] for p in small["probes"] for r in p["rounds"]]
    assert small["decisions"] == len(replies) == 2
    assert small["parse_failures"] == sum(1 for text in replies if not usable_decision(text, 3))
    from_file = result.records_by_key[episode_key("roster", "popularity", "War", 0)]
    assert [p["probe_id"] for p in from_file["probes"]] == ["fan"] and from_file["setup_tokens"] == 0
    assert (tmp_path / "llm" / "rosters").is_dir()
