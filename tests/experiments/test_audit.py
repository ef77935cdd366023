"""`ctrlsim audit` without an LLM: a tiny real audit (oracle and random probes, a popularity box
compared with a dial box), its summary.json against the sub-runs' records, the report in a real
browser, the failure policy, and the plan of what applies to which box."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from audit_checks import (
    assert_estimate,
    assert_share_estimate,
    check_in_browser,
    pixel_variance,
    read_records,
    t_interval,
)

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.audit.config import (
    AUDIT_FILE,
    REPORT,
    SUMMARY,
    AuditConfig,
    load_overrides,
    plan_subruns,
    subrun_config,
)
from ctrlsim.experiments.audit.runner import audit_main
from ctrlsim.experiments.audit.units import AuditFailedError, run_audit
from ctrlsim.experiments.config import RunOptions

TINY = {"ctrlbench": {"methods": ["oracle", "random"], "rounds": 3, "seeds": [0, 1, 2]},
        "calibrate-ctrlbench": {"dials": [0, 0.5, 1]},
        "persistence": {"rounds": 3, "release_rounds": 3, "seeds": [0, 1, 2]},
        "responsiveness": {"rounds": 2, "seeds": [0, 1, 2]}, "controls": {"users": 5, "points": 3}}


def config_file(folder: Path, overrides: dict) -> str:
    """An audit's `--config FILE` holding `overrides` (sub-run name -> its runner's fields)."""
    path = folder / "audit-config.json"
    path.write_text(json.dumps(overrides))
    return str(path)


@pytest.fixture(scope="module")
def audited(tmp_path_factory, ml100k):
    out = tmp_path_factory.mktemp("audit") / "popularity"
    tiny = config_file(out.parent, TINY)
    code = audit_main(["popularity", "--compare", "dial:0.75", "--out", str(out), "--config", tiny])
    assert code == 0
    return out


def test_audit_writes_subrun_folders_and_a_report(audited):
    assert sorted(p.name for p in audited.iterdir() if p.is_dir()) == [
        "calibrate-ctrlbench", "controls", "ctrlbench", "persistence", "responsiveness"]
    for name in ("ctrlbench", "calibrate-ctrlbench", "persistence", "responsiveness", "controls"):
        assert {"config.json", "records.jsonl", "tables.md"} <= {p.name for p in (audited / name).iterdir()}
    html = (audited / REPORT).read_text()
    assert '<section id="responsiveness">' in html and "Do the buttons work?" in html
    assert "popularity declares no user-settable control" in html
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert "http://" not in html.replace("http-equiv", "") and "https://" not in html
    assert "<script" not in html and "@media print" in html
    summary = json.loads((audited / SUMMARY).read_text())
    assert summary["audit"]["boxes"] == ["popularity", "dial:0.75"]
    assert summary["headline_text"] and summary["caveats"]


def test_subrun_tables_are_the_subruns_report_data(audited):
    """The audit copies each sub-run's tables from its report as data (tables.json holds the same
    data), never from parsed markdown: cells keep their text."""
    summary = json.loads((audited / SUMMARY).read_text())
    for name in ("ctrlbench", "calibrate-ctrlbench"):
        stored = json.loads((audited / name / "tables.json").read_text())
        expected = [{"title": t["title"], "header": t["header"],
                     "rows": [[str(c) for c in row] for row in t["rows"]]} for t in stored if t.get("rows")]
        assert expected and summary["subruns"][name]["tables"] == expected
        markdown = (audited / name / "tables.md").read_text()
        assert all(f"## {t['title']}" in markdown for t in expected)
    tables = {t["title"]: t for t in summary["subruns"]["ctrlbench"]["tables"]}
    subs = tables["Substitutions and failures per method"]
    dropped = [row[subs["header"].index("dropped probes (%)")] for row in subs["rows"]]
    assert dropped == ["0.0", "0.0"]  # oracle and random drop no probe; markdown parsing made it "0"


def test_summary_coverage_matches_the_records(audited):
    summary = json.loads((audited / SUMMARY).read_text())
    numbers = summary["subruns"]["ctrlbench"]["numbers"]
    records = read_records(audited / "ctrlbench")
    assert summary["subruns"]["ctrlbench"]["units"] == len(records) == 2 * 2 * 3
    for box in ("popularity", "dial:0.75"):
        for method in ("oracle", "random"):
            mine = sorted((r for r in records if r["recommender"] == box and r["method"] == method),
                          key=lambda r: r["seed"])
            assert_share_estimate(numbers["coverage"][box][method],
                                  [r["curves"]["coverage"][-1] for r in mine], 100)
            for t in range(3):
                assert_share_estimate(numbers["coverage_by_round"][box][method][t],
                                      [r["curves"]["coverage"][t] for r in mine], 100)
            # pooled efficiency: total target likes over total distinct targets found
            likes = sum(r["efficiency_counts"]["target_likes"][-1] for r in mine)
            found = sum(r["efficiency_counts"]["found"][-1] for r in mine)
            got = numbers["efficiency"][box][method]["value"]
            assert got == (pytest.approx(likes / found) if found else None)
            assert numbers["cost"][box][method]["episodes"] == 3


def test_summary_box_comparison_matches_the_records(audited):
    from scipy.stats import wilcoxon

    rows = json.loads((audited / SUMMARY).read_text())["subruns"]["ctrlbench"]["numbers"]["box_comparison"]
    records = read_records(audited / "ctrlbench")
    assert {(r["box"], r["reference"], r["method"]) for r in rows} == {
        ("dial:0.75", "popularity", "oracle"), ("dial:0.75", "popularity", "random")}
    for row in rows:
        cov = {(r["recommender"], r["seed"]): 100 * r["curves"]["coverage"][-1] for r in records
               if r["method"] == row["method"]}
        diffs = np.array([cov[("dial:0.75", s)] - cov[("popularity", s)] for s in (0, 1, 2)])
        assert_estimate(row["difference"], list(diffs))
        nonzero = diffs[diffs != 0]
        expected = float(wilcoxon(nonzero).pvalue) if nonzero.size else None
        assert row["p_wilcoxon"] == (pytest.approx(expected) if expected is not None else None)
        # the smallest difference three pairs could show 80% of the time (statsmodels' power solver)
        from statsmodels.stats.power import TTestPower

        spread = float(diffs.std(ddof=1))
        if spread == 0:
            assert row["mde"] == 0.0
        else:
            effect = TTestPower().solve_power(nobs=3, alpha=0.05, power=0.8)
            assert row["mde"] == pytest.approx(spread * effect, rel=1e-4)


def test_summary_calibration_matches_the_records(audited):
    cal = json.loads((audited / SUMMARY).read_text())["subruns"]["calibrate-ctrlbench"]["numbers"]
    records = read_records(audited / "calibrate-ctrlbench")
    assert cal["grid"] == [0.0, 0.5, 1.0] and set(cal["compare"]) == {"popularity", "dial:0.75"}
    for method in ("oracle", "random"):
        for metric in ("coverage", "exposure"):
            curve = cal["curves"][method][metric]
            for lam, estimate in zip(curve["lambda"], curve["estimates"]):
                values = [v for r in records if r["method"] == method and r["lambda"] == lam
                          for v in r["values"][metric].values()]
                assert_share_estimate(estimate, values)  # shares: bounded bootstrap intervals
        for box in ("popularity", "dial:0.75"):
            place = cal["placement"][box][method]
            values = [v for r in records if r["method"] == method and r["box"] == box
                      for v in r["values"]["coverage"].values()]
            assert place["box"]["value"] == pytest.approx(t_interval(values)[0])
    # Known answer: popularity is the dial's base ranking, so its Exposure equals the dial at lambda = 0.
    at_zero = {k: v for r in records if r["method"] == "oracle" and r["lambda"] == 0.0
               for k, v in r["values"]["exposure"].items()}
    popularity = {k: v for r in records if r["method"] == "oracle" and r["box"] == "popularity"
                  for k, v in r["values"]["exposure"].items()}
    assert at_zero == pytest.approx(popularity)


def test_report_in_headless_chromium(audited, tmp_path):
    seen = check_in_browser(audited / REPORT, tmp_path / "shot.png")
    assert seen["blocked"] == [], f"the report asked other hosts: {seen['blocked']}"
    assert all(url == seen["page_url"] or url.startswith("data:") for url in seen["seen"])
    figures = json.loads((audited / SUMMARY).read_text())
    assert len(seen["images"]) >= 2  # coverage by round, calibration, box comparison
    assert all(complete and width > 0 for complete, width in seen["images"]), seen["images"]
    assert all(src.startswith("data:image/png;base64") for src in seen["sources"])
    assert seen["printable"] == "always"
    assert pixel_variance(tmp_path / "shot.png") > 0
    assert figures["cost"]["wall_s"] > 0 and figures["cost"]["total_wall_s"] >= figures["cost"]["wall_s"]
    assert [c["finished"] for c in figures["cost"]["invocations"]] == [True]


def test_a_failed_unit_stops_the_audit_without_a_report(tmp_path, ml100k, monkeypatch):
    from ctrlsim.recommenders import registry

    class Broken:
        def __init__(self, dataset, **options):
            pass

        def recommend(self, states, k, **kwargs):
            raise RuntimeError("the box is down")

    monkeypatch.setitem(registry.RECOMMENDERS, "audit-broken", Broken)
    out = tmp_path / "broken"
    out.mkdir()
    (out / AUDIT_FILE).write_text("{}")  # an earlier audit's folder (a folder of other files is refused)
    (out / REPORT).write_text("an old report")  # from an earlier audit: must not survive a failure
    config = AuditConfig(boxes=("audit-broken",), overrides=load_overrides(config_file(
        tmp_path, {"ctrlbench": {"methods": ["oracle"], "rounds": 1, "seeds": [0, 1]}})))
    with pytest.raises(AuditFailedError, match="ctrlbench"):
        run_audit(config, RunOptions(out=str(out)), show_progress=False)
    assert not (out / REPORT).exists() and not (out / SUMMARY).exists()
    assert read_records(out / "ctrlbench") == []  # a failed unit is never stored
    costs = [json.loads(line) for line in (out / "cost.jsonl").read_text().splitlines()]
    assert len(costs) == 1 and costs[0]["finished"] is False and costs[0]["units_ran"] == 0


def test_placement_words():
    from ctrlsim.experiments.audit.words import placement_words

    words = placement_words("ctrlbench", "narm", "oracle", "0.37 [0.25, 0.50]", 0.37)
    assert "narm" in words and "about 37% of its slate positions" in words and "says little" not in words
    below = placement_words("ctrlbench", "narm", "oracle", "below lambda = 0 [0.00, 1.00]", None)
    assert "says little" in below and "less than a reference box that ignores the user" in below
    assert "cannot place" in placement_words("steereval", "embedding", "template",
                                             "no scale: the method does not resolve the dial", None)


def test_placement_words_say_whether_the_interval_is_as_narrow_as_the_audit_aims_for():
    from ctrlsim.experiments.audit.words import placement_words

    oracle = placement_words("ctrlbench", "narm", "oracle", "0.37 [0.25, 0.50]", 0.37, seeds=3)
    assert "interval width 0.25 <= 0.25, as precise as the audit aims for" in oracle
    # an LLM probe aims for 0.5; 0.8 wide at 3 seeds: 3 * (0.8 / 0.5)^2 = 7.68 -> about 8 seeds
    llm = placement_words("ctrlbench", "narm", "base-small", "0.40 [0.10, 0.90]", 0.40, seeds=3)
    assert "interval width 0.80 > 0.5 wanted: not reachable at this size" in llm
    assert "about 8 seeds instead of 3" in llm
    apart = placement_words("ctrlbench", "narm", "base-small", "below lambda = 0 [no overlap]", None, seeds=3)
    assert "the intervals do not overlap, so the placement is resolved" in apart


def test_plan_applies_protocols_by_box():
    names = lambda boxes: [s.name for s in plan_subruns(AuditConfig(boxes=boxes))]  # noqa: E731
    boxes = ["ctrlbench", "calibrate-ctrlbench", "persistence", "responsiveness", "controls"]
    assert names(("popularity",)) == boxes
    assert names(("embedding",)) == [*boxes, "steereval", "calibrate-steereval"]
    assert names(("llm:qwen2.5-0.5b",)) == ["steereval", "calibrate-steereval", "promptshift",
                                            "calibrate-promptshift"]
    overrides = {"ctrlbench": {"rounds": 6, "seeds": [0, 1, 2, 3]}}
    plan = {s.name: s for s in plan_subruns(AuditConfig(boxes=("narm", "embedding"), overrides=overrides))}
    cb, cal = plan["ctrlbench"].fields, plan["calibrate-ctrlbench"].fields
    assert cb["recommenders"] == ("narm", "embedding") and cb["rounds"] == 6 and cb["seeds"] == [0, 1, 2, 3]
    # the calibration uses the same probes, seeds and sizes as the ctrlbench sub-run
    assert (cal["rounds"], cal["seeds"], cal["methods"], cal["compare"]) == (
        6, (0, 1, 2, 3), cb["methods"], ("narm", "embedding"))
    assert plan["steereval"].fields["conditions"] == ("embedding",)
    assert plan["calibrate-steereval"].fields["pool_size"] == plan["steereval"].fields["pool_size"]
    # an LLM box's sub-runs are valid configs of their runners (nothing loads)
    for subrun in plan_subruns(AuditConfig(boxes=("llm:qwen2.5-0.5b",))):
        config = subrun_config(subrun)
        assert "qwen2.5-0.5b" in (getattr(config, "llms", None) or (config.llm,))


@pytest.mark.parametrize("argv, overrides, message", [
    (["no-such-box"], None, "unknown recommender"),
    (["popularity"], {"nothing": {"rounds": 2}}, "unknown sub-run 'nothing'"),
    (["popularity"], {"ctrlbench": {"no_such_field": 1}}, "unknown field(s) no_such_field"),
    (["popularity"], {"ctrlbench": {"recommenders": ["narm"]}}, "recommenders is the audit's own"),
    (["popularity"], {"calibrate-ctrlbench": {"compare": ["narm"]}}, "compare is the audit's own"),
    (["popularity"], {"ctrlbench": {"rounds": 0}}, "rounds must be in [1, 10000], got 0"),
    (["popularity"], [1, 2], "must hold an object"),
    (["popularity", "--compare", "popularity"], None, "more than once"),
])
def test_bad_values_are_refused_before_anything_runs(argv, overrides, message, tmp_path, capsys):
    from ctrlsim.experiments.cli import main

    if overrides is not None:
        argv = [*argv, "--config", config_file(tmp_path, overrides)]
    assert main(["audit", *argv, "--out", str(tmp_path / "a")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_audit_config_rejects_an_unknown_size():
    with pytest.raises(ConfigError, match="size"):
        AuditConfig(boxes=("popularity",), size="huge")


def test_template_is_package_data():
    from importlib.resources import files

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"ctrlsim.experiments.audit" = ["templates/*.j2"]' in pyproject

    assert (files("ctrlsim.experiments.audit") / "templates" / "audit.html.j2").is_file()


def test_the_first_screen_leads_with_probes_that_pass_their_card(audited):
    """The oracle (adherence 1) passes its validity card and leads; the coin flip fails it and is named,
    with the reason, and its coverage is marked as not evidence about the box."""
    summary = json.loads((audited / SUMMARY).read_text())
    cards = summary["subruns"]["ctrlbench"]["numbers"]["validity"]
    records = read_records(audited / "ctrlbench")
    check = [d for r in records if r["method"] == "oracle" for d in r["validity"]["check"]]
    assert all(d["liked"] == d["target"] for d in check)  # the oracle's rule, from the stored decisions
    assert cards["oracle"]["passes"] and cards["oracle"]["adherence"]["value"] == 1.0
    assert not cards["random"]["passes"]
    assert cards["random"]["adherence"]["low"] <= 0 <= cards["random"]["adherence"]["high"]
    lines = summary["headline_text"]
    validity = next(line for line in lines if line.startswith("Probe validity (ctrlbench)"))
    assert "the oracle probe (upper bound) passed" in validity
    assert "the coin-flip probe (floor) failed" in validity
    coverage = next(line for line in lines if line.startswith("CtrlBench-Rec, popularity"))
    assert coverage.index("oracle") < coverage.index("coin-flip")
    assert "coin-flip probe (floor)" in coverage.split("failed its validity card")[0]
    assert "failed its validity card" not in coverage.split("coin-flip")[0]


def test_the_summary_holds_pass_k_of_control_by_hand(audited):
    """pass^k per box and method from the ctrlbench sub-run's records: C(c, k) / C(n, k) per target,
    averaged over targets (one target here), with ctrlbench's default success threshold."""
    from math import comb

    summary = json.loads((audited / SUMMARY).read_text())
    numbers = summary["subruns"]["ctrlbench"]["numbers"]["pass_k"]
    records = read_records(audited / "ctrlbench")
    for box, by_method in numbers.items():
        for method, cell in by_method.items():
            flags = [r["curves"]["coverage"][-1] >= 0.05 for r in records
                     if r["recommender"] == box and r["method"] == method]
            n, c = len(flags), sum(flags)
            assert cell["tries"] == n == 3 and cell["threshold"] == 0.05
            for k in range(1, n + 1):
                assert cell["values"][str(k)] == pytest.approx(comb(c, k) / comb(n, k))
            assert cell["cliff"] == pytest.approx(c / n - comb(c, n) / comb(n, n))
