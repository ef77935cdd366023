"""The Tables 4-6 runner: config checks before any work, hand-computed tables, run folder, resume."""
import json
import shutil

import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.commands import parse_command
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.promptshift.config import PromptShiftConfig
from ctrlsim.experiments.promptshift.report import compute_summary as report
from ctrlsim.experiments.promptshift.report import format_tables, scenario_macro
from ctrlsim.experiments.promptshift.units import protocol_choices
from ctrlsim.experiments.tables import render_markdown
from ctrlsim.recommenders.promptshift.data import PromptShiftData, sample_users


def test_stratified_sample(ml100k):
    data = PromptShiftData.build(ml100k)
    users = sample_users(data, 6, seed=0)
    assert len(users) == len(set(users)) == 6 and set(users) <= set(data.eligible)
    strata = {data.user(u).slice_of("gender_age") for u in users}
    assert len(strata) == 6  # one per gender-age slice
    assert sample_users(data, 6, seed=0) == users and sample_users(data, 6, seed=1) != users
    assert len(sample_users(data, 40, seed=0)) == 40


@pytest.mark.parametrize("bad, field", [
    ({"users": -1}, "users"), ({"users": 0}, "users"), ({"k": 31}, "k"),
    ({"scenarios": ("bogus",)}, "scenarios"),
    ({"scenarios": ("age", "age")}, "scenarios"), ({"llms": ()}, "llms"), ({"llms": ("",)}, "llms"),
    ({"seed": -1}, "seed"), ({"p": 1.0}, "p"), ({"match_threshold": 120.0}, "match_threshold"),
    ({"domain": "books"}, "domain"), ({"unmatched": "drop"}, "unmatched"),
    ({"history_len": 30}, "min_fit_positives"),
])
def test_config_rejects_bad_values_naming_them(bad, field):
    with pytest.raises(ConfigError, match=field):
        PromptShiftConfig(**bad)


def test_cli_flags_come_from_the_config(tmp_path):
    cfg, options = parse_command("promptshift", ["--llms", "smollm2-135m,qwen2.5-0.5b", "--users", "3",
                                                 "--seed", "7", "--scenarios", "gender,age",
                                                 "--out", str(tmp_path / "run")])
    assert cfg == PromptShiftConfig(llms=("smollm2-135m", "qwen2.5-0.5b"), users=3, seed=7,
                                    scenarios=("gender", "age"))
    assert options.out == str(tmp_path / "run")
    defaults, _ = parse_command("promptshift", [])
    assert defaults == PromptShiftConfig() and defaults.users == 8  # one set of defaults
    with pytest.raises(ConfigError, match="users"):
        parse_command("promptshift", ["--users", "-1"])


def test_scenario_macro_is_a_mean_of_scenario_means():
    rec = lambda s, v: {"scenario": s, "metrics": {"B0": {"drift": v}}}  # noqa: E731
    records = [rec("gender", 0.2), rec("gender", 0.4), rec("gender", 0.6), rec("age", 1.0)]
    # (mean(0.2, 0.4, 0.6) + 1.0) / 2 = 0.7, not the pooled 0.55.
    assert scenario_macro(records, "B0", "drift", ["gender", "age"]) == pytest.approx(0.7)


def test_report_by_hand(hand_data, u1_lists):
    cfg = PromptShiftConfig(llms=("m",), dataset="hand", scenarios=("gender",), n_candidates=4, k=3, p=0.5,
                            history_len=2, min_fit_positives=2, match_threshold=90.0,
                            select_on_validation=False)
    records = {"m/u1": {"user": "u1", "lists": [g.to_dict() for g in u1_lists]}}
    result = report(cfg, hand_data, ["u1"], records, protocol_choices(cfg, hand_data))
    setting = result["settings"][0]
    # One user, one scenario: Table 4 is the hand-computed episode of test_promptshift_env.
    assert setting["table4"]["paraphrase_drift"] == pytest.approx(0.5)
    assert setting["table4"]["cue_drift"] == pytest.approx(17 / 24)
    assert setting["table4"]["delta_d"] == pytest.approx(5 / 24)
    assert setting["table4"]["slice_shift"] == pytest.approx(1 / 180)
    assert setting["variants"]["B0"]["difficulty@3"] == pytest.approx(527 / 90)
    assert setting["tokens"] == {"prompt_tokens": 50, "completion_tokens": 25}
    # Matching counts each list once: 3 + 4 + 3 + 3 + 3 titles, one unmatched.
    assert setting["matching"]["total"] == 16 and setting["matching"]["matched"] == 15
    # n = 1: the t-tests are undefined, and the table says so.
    text = render_markdown(format_tables(result))
    assert "0.7083" in text and "undefined" in text and "Protocol choices" in text


def fresh_calls(llm):
    usage = llm.meter.total
    return usage.calls - usage.cached_calls


@pytest.mark.llm
def test_run_folder_and_resume(smol, tmp_path):
    out = tmp_path / "ps"
    # Short histories and replies keep the smallest LLM quick: 2 users x 5 lists (L^0, P1-P3, one cue).
    cfg = PromptShiftConfig(llms=("smollm2-135m",), users=2, scenarios=("gender",), n_candidates=5, k=4,
                            history_len=5, max_tokens=48)
    options = RunOptions(out=str(out))
    llms = {"smollm2-135m": smol}

    # "Interrupted" after one user: its five lists are on disk.
    before = fresh_calls(smol)
    partial = ctrlsim.run("promptshift", config=cfg, options=options, llms=llms, max_units=1,
                          show_progress=False)
    assert fresh_calls(smol) - before == 5 and not partial.summary["complete"]
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 2  # config, one user

    # The rerun does only the second user; the first user's line stays as it was.
    before = fresh_calls(smol)
    result = ctrlsim.run("promptshift", config=cfg, options=options, llms=llms, show_progress=False)
    assert fresh_calls(smol) - before == 5 and result.summary["complete"]
    lines2 = (out / "records.jsonl").read_text().splitlines()
    assert lines2[:2] == lines and len(lines2) == 3
    # Nothing left to do: no LLM call at all, and the same tables.
    before = fresh_calls(smol)
    final = ctrlsim.run("promptshift", config=cfg, options=options, llms=llms, show_progress=False)
    assert fresh_calls(smol) == before
    # NaN-safe comparison
    assert json.dumps(final.summary["settings"]) == json.dumps(result.summary["settings"])

    setting = final.summary["settings"][0]
    assert setting["n_users"] == 2 and setting["n_records"] == 2
    assert setting["selection"]["match_threshold"] in (80.0, 85.0, 90.0, 95.0, 100.0)
    assert len(setting["selection"]["b3"]["grid"]) == 27
    stored = json.loads((out / "config.json").read_text())
    assert stored["config"]["config"]["users"] == 2 and len(stored["config"]["users"]) == 2
    assert "phi_bar_s" in stored["choices"] and stored["config"]["generation"]["domain"] == "movies"
    tables = (out / "tables.md").read_text()
    for head in ("Table 4", "Table 5", "Table 6", "Paraphrase Drift", "Difficulty@4", "PromptShift",
                 "smollm2-135m", "MovieLens 100K", "Frozen on validation"):
        assert head in tables
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert figures == ["scenarios_smollm2-135m.png", "variants.png"]
    assert all((out / "figures" / f).read_bytes()[:4] == b"\x89PNG" for f in figures)

    # `--figures false`: the same records and tables, no figures drawn.
    bare = out.parent / "no-figures"
    shutil.copytree(out, bare, ignore=shutil.ignore_patterns("figures", "*.lock"))
    again = ctrlsim.run("promptshift", config=cfg, options=RunOptions(out=str(bare), figures=False),
                        llms=llms, show_progress=False)
    assert json.dumps(again.summary["settings"]) == json.dumps(final.summary["settings"])
    assert (bare / "tables.md").read_text() == tables and not (bare / "figures").exists()

    # A changed config never mixes into an existing run folder.
    with pytest.raises(ConfigError):
        ctrlsim.run("promptshift", config=PromptShiftConfig(**{**cfg.__dict__, "k": 3}), options=options,
                    llms=llms, show_progress=False)
