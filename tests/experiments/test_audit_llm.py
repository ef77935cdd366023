"""`ctrlsim audit` with the smallest bundled LLM at the tiniest sizes, summary.json against the records
and the report in a real browser. The fast one (default suite): LLM probes on the popularity box.
The slow one: the embedding box, which reads profile text, so SteerEval and its calibration run too."""
from __future__ import annotations

import json

import pytest
from audit_checks import (
    assert_estimate,
    assert_share_estimate,
    check_in_browser,
    pixel_variance,
    read_records,
)

from ctrlsim.experiments.audit.config import REPORT, SUMMARY
from ctrlsim.experiments.audit.runner import audit_main

pytestmark = pytest.mark.llm
LLM = "smollm2-135m"
PROBES = {"ctrlbench": {"rounds": 1, "seeds": [0, 1]},
          "calibrate-ctrlbench": {"methods": ["oracle", "random"], "dials": [0, 1]},
          "persistence": {"rounds": 1, "baseline_rounds": 1, "release_rounds": 1, "seeds": [0, 1]}}
# the slow audit plays the persistence episodes with the LLM probes too (the medium size's methods)
TINY = {**PROBES, "persistence": {**PROBES["persistence"], "methods": ["base-small", "oracle"],
                                  "agents": [1, 1]},
        "steereval": {"tags": ["Comedy"], "users": 1},
        "calibrate-steereval": {"users": 1, "dials": [0, 1]}}


def _audit(tmp_path_factory, box: str, overrides: dict):
    pytest.importorskip("llama_cpp", reason='the bundled LLMs need "ctrlsim[llm]"')
    out = tmp_path_factory.mktemp("audit-llm") / box
    config = out.parent / "audit-config.json"
    config.write_text(json.dumps(overrides))
    assert audit_main([box, "--out", str(out), "--llm", LLM, "--config", str(config)]) == 0
    return out


@pytest.fixture(scope="module")
def probes(tmp_path_factory, ml100k):
    return _audit(tmp_path_factory, "popularity", PROBES)


@pytest.fixture(scope="module")
def audited(tmp_path_factory, ml100k):
    return _audit(tmp_path_factory, "embedding", TINY)


def test_llm_probes_cost_and_scores_match_the_records(probes, tmp_path):
    summary = json.loads((probes / SUMMARY).read_text())
    assert list(summary["subruns"]) == ["ctrlbench", "calibrate-ctrlbench", "persistence", "responsiveness",
                                        "controls"]
    cb = summary["subruns"]["ctrlbench"]
    assert [m["model"] for m in cb["llms"]] == [LLM]
    records = read_records(probes / "ctrlbench")
    llm = [r for r in records if r["method"] == "base-small"]
    assert len(llm) == 2
    cost = cb["numbers"]["cost"]["popularity"]["base-small"]
    assert cost["tokens"] == sum(r["setup_tokens"] + sum(p["tokens"] for p in r["probes"]) for r in llm) > 0
    assert cost["decisions"] == sum(r["decisions"] for r in llm)
    assert cost["parse_failures"] == sum(r["parse_failures"] for r in llm)
    assert_share_estimate(cb["numbers"]["coverage"]["popularity"]["base-small"],
                          [r["curves"]["coverage"][-1] for r in llm], 100)
    assert summary["cost"]["tokens"]["ctrlbench"] == cost["tokens"]
    assert any(LLM in c for c in summary["caveats"])  # the small model is named among the caveats
    seen = check_in_browser(probes / REPORT, tmp_path / "shot.png")
    assert seen["blocked"] == [] and len(seen["images"]) == 2
    assert all(complete and width > 0 for complete, width in seen["images"])
    assert pixel_variance(tmp_path / "shot.png") > 0


@pytest.mark.slow
def test_llm_audit_runs_every_protocol_that_applies(audited):
    summary = json.loads((audited / SUMMARY).read_text())
    assert list(summary["subruns"]) == ["ctrlbench", "calibrate-ctrlbench", "persistence", "responsiveness",
                                        "controls", "steereval",
                                        "calibrate-steereval"]
    lasting = read_records(audited / "persistence")  # the LLM probes played the phases too
    llm_tokens = sum(p["tokens"] for r in lasting if r["method"] == "base-small" for p in r["probes"])
    assert summary["subruns"]["persistence"]["numbers"]["tokens"] >= llm_tokens > 0
    assert set(summary["subruns"]["persistence"]["numbers"]["cells"]["embedding"]) == {"base-small", "oracle"}
    cb = summary["subruns"]["ctrlbench"]
    records = read_records(audited / "ctrlbench")
    llm = [r for r in records if r["method"] == "base-small"]
    cost = cb["numbers"]["cost"]["embedding"]["base-small"]
    assert cost["tokens"] == sum(r["setup_tokens"] + sum(p["tokens"] for p in r["probes"]) for r in llm) > 0
    assert cost["decisions"] == sum(r["decisions"] for r in llm)
    assert_share_estimate(cb["numbers"]["coverage"]["embedding"]["base-small"],
                          [r["curves"]["coverage"][-1] for r in llm], 100)
    assert_estimate(cb["numbers"]["profile_accuracy"]["embedding"]["base-small"]["t"],
                    [r["profile_curves"]["accuracy"][-1] for r in llm])


@pytest.mark.slow
def test_llm_audit_steereval_matches_the_records(audited):
    summary = json.loads((audited / SUMMARY).read_text())
    se = summary["subruns"]["steereval"]["numbers"]["conditions"]["embedding"]
    records = read_records(audited / "steereval")
    assert se["scenarios"] == len(records) == 2
    # signed ΔAUC_t: the change in the asked direction (increase: +, decrease: -)
    signed = [r["delta_auc"] if r["direction"] == "increase" else -r["delta_auc"] for r in records]
    assert_estimate(se["signed"], signed)
    assert se["tokens"] == sum(sum(r["tokens"].values()) for r in records)
    lines = summary["headline_text"]
    assert any(line.startswith("SteerEval, embedding (embedding condition)") for line in lines)


@pytest.mark.slow
def test_llm_audit_report_in_headless_chromium(audited, tmp_path):
    seen = check_in_browser(audited / REPORT, tmp_path / "shot.png")
    assert seen["blocked"] == []
    assert len(seen["images"]) == 4  # coverage by round, two calibrations, SteerEval
    assert all(complete and width > 0 for complete, width in seen["images"])
    assert pixel_variance(tmp_path / "shot.png") > 0


@pytest.mark.slow
def test_rerun_resumes_every_subrun(audited):
    config = audited.parent / "audit-config.json"  # the file the first run read (TINY)
    assert audit_main(["embedding", "--out", str(audited), "--llm", LLM, "--config", str(config)]) == 0
    summary = json.loads((audited / SUMMARY).read_text())
    assert all(entry["ran_now"] == 0 for entry in summary["subruns"].values())
