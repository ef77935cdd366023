"""`ctrlsim audit BOX --llms A,B`: the words on whether a placement depends on the probe model (on
hand-made placements), and a small audit with two stand-in probe models, its summary.json against
the sub-runs' records and its report's page rules."""
from __future__ import annotations

import json

import pytest
from stand_in_llm import StandInLLM

from ctrlsim.experiments.audit.config import REPORT, SUMMARY, AuditConfig
from ctrlsim.experiments.audit.words import placement_agreement, placement_interval, sensitivity_lines
from ctrlsim.experiments.config import RunOptions
from ctrlsim.metrics.stats import paired_comparison


def test_placement_intervals_are_read_from_the_placement_text():
    assert placement_interval("0.37 [0.25, 0.50]") == (0.25, 0.5)
    assert placement_interval("below lambda = 0 [0.00, 0.20]") == (0.0, 0.2)
    for text in ("no scale: the method does not resolve the dial", "0.40 [no overlap]", "-", ""):
        assert placement_interval(text) is None


def test_overlapping_intervals_agree_and_apart_ones_depend_on_the_model():
    agree = placement_agreement("narm", "base-small", {"a": {"text": "0.30 [0.20, 0.45]", "lambda": 0.3},
                                                       "b": {"text": "0.50 [0.40, 0.60]", "lambda": 0.5}})
    assert agree["verdict"] == "agree" and "agree within their intervals" in agree["words"]
    assert "no proof" in agree["words"] and agree["words"].startswith("Placement of narm by the LLM probes")
    apart = placement_agreement("narm", "base-small", {"a": {"text": "0.20 [0.10, 0.30]", "lambda": 0.2},
                                                       "b": {"text": "0.50 [0.40, 0.60]", "lambda": 0.5},
                                                       "c": {"text": "0.25 [0.15, 0.45]", "lambda": 0.25}})
    assert apart["verdict"] == "depends" and "depends on which model played the user" in apart["words"]
    assert "intervals of a and b do not overlap" in apart["words"] and "c and" not in apart["words"]
    # touching intervals overlap
    touching = {"a": {"text": "0.20 [0.10, 0.40]"}, "b": {"text": "0.50 [0.40, 0.60]"}}
    assert placement_agreement("narm", "oracle", touching)["verdict"] == "agree"


def test_a_model_without_a_scale_is_said_so():
    none = placement_agreement("narm", "oracle", {"a": {"text": "no scale: the method does not resolve"},
                                                  "b": {"text": "0.50 [0.40, 0.60]"}})
    assert none["verdict"] == "unknown" and "cannot be said" in none["words"]
    partial = placement_agreement("narm", "oracle", {"a": {"text": "no scale: the method does not resolve"},
                                                     "b": {"text": "0.50 [0.40, 0.60]"},
                                                     "c": {"text": "0.55 [0.45, 0.70]"}})
    assert partial["verdict"] == "agree" and "a placed it nowhere" in partial["words"]


def test_sensitivity_lines_name_the_ranking_figures_and_the_scripted_methods():
    analysis = {"share": True, "methods": {
        "base-small": {"g_coefficient": 0.8, "kendalls_w": 0.75, "flips": [{}], "components": {},
                       "shares": {"box": 0.7, "probe model": 0.2, "box x probe model": 0.05,
                                  "residual": 0.05}},
        "llm-one-box": {"paired": [{"box": "narm", "model": "b", "reference": "a", "n": 4,
                                    "p_wilcoxon": 0.125,
                                    "difference": {"value": 0.02, "low": -0.01, "high": 0.05, "n": 4}}]}},
        "scripted": {"oracle": {}}}
    lines = sensitivity_lines("ctrlbench", analysis)
    assert "E rho^2 = 0.80, Kendall's W across probe models = 0.75, 1 box pair(s) flip" in lines[0]
    assert "hold 25% of the score variance" in lines[0]
    assert lines[1] == ("ctrlbench, llm-one-box on narm: b minus a: 2.00 points (95% CI -1.00 to 5.00 "
                        "points), Wilcoxon p = 0.125 over 4 paired observation(s).")
    assert lines[2].startswith("ctrlbench: the oracle probe (upper bound) gave identical scores")


MODELS = ("stand-in-war", "stand-in-none")
TINY = {"ctrlbench": {"methods": ("base-small", "oracle"), "rounds": 2, "seeds": (0, 1)},
        "calibrate-ctrlbench": {"dials": (0.0, 1.0)},
        "persistence": {"rounds": 2, "release_rounds": 2, "seeds": (0, 1)}}


@pytest.fixture(scope="module")
def audited(tmp_path_factory, ml100k):
    from ctrlsim.experiments.audit.sensitivity import run_audit_across_llms

    out = tmp_path_factory.mktemp("audit-llms") / "popularity"
    llms = {"stand-in-war": StandInLLM("stand-in-war", 0.9, 0.1),
            "stand-in-none": StandInLLM("stand-in-none", 0.1, 0.1)}
    summary = run_audit_across_llms(AuditConfig(boxes=("popularity",), overrides=TINY), MODELS,
                                    RunOptions(out=str(out)), show_progress=False,
                                    resources={"llms": llms, **llms})
    return out, summary


def test_each_model_gets_a_whole_audit_and_the_top_level_compares_them(audited):
    from ctrlsim.experiments.report import read_run

    out, summary = audited
    assert json.loads((out / SUMMARY).read_text()) == json.loads(json.dumps(summary))
    for model in MODELS:
        found = {p.name for p in (out / f"llm={model}").iterdir()}
        assert {SUMMARY, REPORT, "ctrlbench", "calibrate-ctrlbench"} <= found
    assert summary["audit"]["llms"] == list(MODELS)
    assert set(summary["sensitivity"]) == {"ctrlbench", "calibrate-ctrlbench"}
    # the persistence sub-run's half-lives are no per-episode score: left out, and said so
    assert any(c.startswith("persistence is not compared across probe models") for c in summary["caveats"])
    ctrlbench = summary["sensitivity"]["ctrlbench"]["analysis"]
    assert list(ctrlbench["scripted"]) == ["oracle"]  # the oracle uses no LLM
    # one box: the models compared paired over the same (target, seed), by hand from the records
    final = {}
    for model in MODELS:
        _, _, records = read_run(out / f"llm={model}" / "ctrlbench")
        final[model] = {(r["target"], r["seed"]): r["curves"]["coverage"][-1] for r in records.values()
                        if r["method"] == "base-small"}
    keys = sorted(final[MODELS[0]])
    by_hand = paired_comparison([final[MODELS[1]][k] for k in keys], [final[MODELS[0]][k] for k in keys])
    [paired] = ctrlbench["methods"]["base-small"]["paired"]
    assert paired["difference"]["value"] == pytest.approx(by_hand.difference.value)
    assert by_hand.difference.value < 0  # the stand-in that likes nothing finds less of the target
    places = {(p["box"], p["method"]): p for p in summary["placements"]}
    assert places[("popularity", "oracle")]["verdict"] == "scripted"
    assert set(places[("popularity", "base-small")]["by_model"]) == set(MODELS)
    assert all(p["words"] + "." in summary["headline_text"] for p in summary["placements"])


def test_the_report_follows_the_page_rules(audited):
    out, summary = audited
    html = (out / REPORT).read_text()
    assert html.lstrip().lower().startswith("<!doctype html>") and "<script" not in html
    assert "http://" not in html.replace("http-equiv", "") and "https://" not in html
    assert "llm=stand-in-war/report.html" in html and "Kendall" in html


@pytest.mark.parametrize("argv, message", [
    (["--llms", "smollm2-135m"], "two models or more"),
    (["--llms", "smollm2-135m,no-such-model-here"], "no-such-model-here"),
    (["--llm", "smollm2-135m", "--llms", "smollm2-135m,qwen2.5-0.5b"], "give one of the two"),
])
def test_bad_llms_are_refused_before_anything_runs(argv, message, tmp_path, capsys):
    from ctrlsim.experiments.cli import main

    assert main(["audit", "popularity", *argv, "--out", str(tmp_path / "a")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
