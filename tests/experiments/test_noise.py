"""`ctrlsim noise`: the comparison's numbers by hand on two made-up score frames, a real rerun of a
scripted ctrlbench run on a dial box (identical, in another order, in its own folder), one LLM run
through the command line (slow), and the errors."""
from __future__ import annotations

import json
import statistics

import numpy as np
import pandas as pd
import pytest

import ctrlsim
from ctrlsim.backends.llamacpp.profile import DEFAULT_PROFILE, PROFILES
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.noise.command import NOISE_JSON, NOISE_MD, run_noise
from ctrlsim.experiments.noise.report import blocks, compare
from ctrlsim.experiments.scores import SCORE_COLUMNS
from ctrlsim.experiments.store import read_run_records
from ctrlsim.experiments.tables import render_markdown

DEFAULT_WIDTH = PROFILES[DEFAULT_PROFILE].n_parallel  # what a llama.cpp spec without settings decodes


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- by hand

def _frame(box: str, cells: dict[tuple[str, str, bool], dict[str, list[float]]]) -> pd.DataFrame:
    """Score rows: (metric, method, share) -> observation -> value, the key naming the box's spec."""
    rows = [{"key": f"{box}/{obs}", "method": method, "box": box, "observation": obs, "seed": 0,
             "metric": metric, "value": value, "share": share}
            for (metric, method, share), values in cells.items() for obs, value in values.items()]
    return pd.DataFrame(rows, columns=list(SCORE_COLUMNS))


def _mde_by_statsmodels(sd: float, n: int) -> float:
    from statsmodels.stats.power import TTestPower

    return TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8,
                                    alternative="two-sided") * sd


def test_the_comparison_by_hand():
    obs = [f"o{i}" for i in range(1, 7)]
    ref = [0.10, 0.20, 0.30, 0.40, 0.50, 0.60]
    gain = [0.20, 0.30, 0.10, 0.40, 0.25, 0.35]  # m - ref in the run: all positive
    lift = [0.31, 0.32, 0.33, 0.34, 0.35, 0.36]  # same - ref: all positive, in both runs
    ref_run = dict(zip(obs, ref)) | {"o7": 0.70}  # o7: a row the rerun lacks
    m_run = {o: r + g for o, r, g in zip(obs, ref, gain)}
    same = {o: r + d for o, r, d in zip(obs, ref, lift)}
    # The rerun moves two rows of o1: the reference 0.10 -> 0.15 and m 0.30 -> 0.00.
    ref_rerun = {**dict(zip(obs, ref)), "o1": 0.15}
    m_rerun = {**m_run, "o1": 0.0}
    small = {"o1": 1.0, "o2": 2.0, "o3": 3.0}
    run = _frame("smol", {("coverage", "ref", True): ref_run, ("coverage", "m", True): m_run,
                          ("coverage", "same", True): same, ("slice_shift", "ref", False): small,
                          ("slice_shift", "m", False): {"o1": 1.1, "o2": 1.9, "o3": 3.05}})
    # The rerun's spec carries its llama.cpp width; its keys and box are mapped back to the run's.
    rerun = _frame("smol@n_parallel=1", {
        ("coverage", "ref", True): ref_rerun, ("coverage", "m", True): m_rerun,
        ("coverage", "same", True): same, ("slice_shift", "ref", False): small,
        ("slice_shift", "m", False): {"o1": 1.1, "o2": 1.8, "o3": 3.05}})
    result = compare(run, rerun, reference="ref", renames={"smol@n_parallel=1": "smol"})

    cov = result["metrics"]["coverage"]
    # 18 matched rows (3 methods x 6 observations), o7 only in the run; two moved: 0.05 and 0.30.
    assert (cov["rows"], cov["only_in_run"], cov["only_in_rerun"], cov["undefined"]) == (18, 1, 0, 0)
    assert cov["equal_share"] == pytest.approx(16 / 18)
    assert cov["mean"] == pytest.approx(0.35 / 18)
    assert cov["median"] == 0
    # numpy's linear 90th percentile of 16 zeros, 0.05, 0.30: position 0.9 * 17 = 15.3, i.e. 0.3 of the
    # way from 0 to 0.05
    assert cov["p90"] == pytest.approx(0.3 * 0.05)
    assert cov["max"] == pytest.approx(0.30)
    shift = result["metrics"]["slice_shift"]
    assert shift["rows"] == 6 and shift["equal_share"] == pytest.approx(5 / 6)
    assert shift["max"] == pytest.approx(0.1)

    tests = {(t["metric"], t["method"]): t for t in result["comparisons"]}
    assert set(tests) == {("coverage", "m"), ("coverage", "same"), ("slice_shift", "m")}
    flip = tests[("coverage", "m")]
    # Run: six positive differences, exact two-sided Wilcoxon p = 2 / 2^6. Rerun: o1's difference is
    # -0.15, the second smallest |d| of six: W- = 2, p = 2 * 3 / 64 (rank sums 0, 1 and 2).
    assert flip["run"]["p_wilcoxon"] == pytest.approx(2 / 64)
    assert flip["rerun"]["p_wilcoxon"] == pytest.approx(6 / 64)
    assert flip["run"]["verdict"] == {"significant": True, "sign": 1}
    assert flip["rerun"]["verdict"] == {"significant": False, "sign": 1}
    assert flip["flipped"] and flip["flip"] == "significance" and flip["pairs"] == 6
    # The noise spread pools run - rerun over the method's and the reference's values on the pairs.
    noise = [0.3, 0, 0, 0, 0, 0, -0.05, 0, 0, 0, 0, 0]
    assert flip["noise_sd"] == pytest.approx(statistics.stdev(noise))
    assert flip["noise_mde"] == pytest.approx(_mde_by_statsmodels(statistics.stdev(noise), 6), rel=1e-4)
    assert flip["run"]["mde"] == pytest.approx(_mde_by_statsmodels(statistics.stdev(gain), 6), rel=1e-4)
    kept = tests[("coverage", "same")]
    assert not kept["flipped"] and kept["run"]["verdict"] == kept["rerun"]["verdict"] == \
        {"significant": True, "sign": 1}
    sign = tests[("slice_shift", "m")]  # mean +0.05/3 -> -0.05/3, never significant at n = 3
    assert sign["flip"] == "sign" and sign["noise_mde"] == pytest.approx(
        _mde_by_statsmodels(statistics.stdev([0, 0.1, 0, 0, 0, 0]), 3), rel=1e-4)
    assert (cov["tests"], cov["flipped"], shift["tests"], shift["flipped"]) == (2, 1, 1, 1)
    assert (result["tests"], result["flipped"]) == (3, 2)
    assert result["flipped_share"] == pytest.approx(2 / 3)
    # Without a declared reference each box's first method is the reference: the same comparisons.
    assert compare(run, rerun, renames={"smol@n_parallel=1": "smol"})["comparisons"] == result["comparisons"]

    about = {"runner": "ctrlbench", "run": "a", "rerun": "b", "run_records": 7, "rerun_records": 6,
             "changed": {"unit_order_seed": 1, "parallel": 1, "executor": "local", "specs": [
                 {"field": "llm", "before": "smol", "after": "smol@n_parallel=1", "changed": True,
                  "why": "llama.cpp: n_parallel 16 -> 1"}]},
             "caches": {"llm_replies": "own", "personas": "own", "shared_by_every_run": "dataset"},
             "provenance_differences": []}
    text = render_markdown(blocks(about, result))
    assert "2 of 3 paired verdicts flipped (66.7%)" in text
    assert "`smol` -> `smol@n_parallel=1`" in text and "MDE noise" in text
    assert "coverage: 1 row(s) only in the run" in text


# ----------------------------------------------------------------------------- real runs

DIAL_RUN = dict(methods=("oracle", "random"), recommenders=("dial:0.5",), targets=("War",), agents=(1, 1),
                rounds=2, seeds=(0, 1), show_progress=False)


@pytest.fixture
def dial_run(tmp_path):
    """A scripted ctrlbench run on a dial box (no model): 4 episodes."""
    return ctrlsim.run("ctrlbench", out=tmp_path / "run", **DIAL_RUN)


def test_scripted_methods_rerun_identically_in_their_own_folder(dial_run, tmp_path):
    out = tmp_path / "noise"
    result = run_noise(dial_run.out, out, show_progress=False)
    cov = result.analysis["metrics"]["coverage"]
    assert (cov["rows"], cov["equal_share"], cov["max"]) == (4, 1.0, 0.0)
    # one paired test, random vs oracle on the dial box, and it did not flip
    assert (result.analysis["tests"], result.analysis["flipped"]) == (1, 0)
    assert result.analysis["comparisons"][0]["noise_mde"] == 0.0  # no noise: nothing below 0 is hidden
    # The rerun is an ordinary run folder with the same units, run in another order, with the llama.cpp
    # spec (the probes' LLM, unused by scripted probes) at another width.
    config, records = read_run_records(out / "records.jsonl")
    assert set(records) == set(dial_run.records_by_key)
    assert config["llm"] == f"{dial_run.config['llm']}@n_parallel=1"
    order = [json.loads(line)["key"] for line in (out / "records.jsonl").read_text().splitlines()[1:]]
    assert order != list(dial_run.records_by_key)
    about = json.loads((out / NOISE_JSON).read_text())
    assert about["run"] == str(dial_run.out.resolve()) and about["caches"]["shared_response_cache"] is False
    assert about["changed"]["unit_order_seed"] == 1 and about["changed"]["parallel"] == 1
    assert about["changed"]["specs"][0] == {"field": "llm", "before": dial_run.config["llm"],
                                            "after": config["llm"], "changed": True,
                                            "why": f"llama.cpp: n_parallel {DEFAULT_WIDTH} -> 1"}
    assert about["provenance_differences"] == []
    assert (out / NOISE_MD).read_text() == result.markdown
    # The same command resumes the rerun: nothing runs again, the report is rewritten.
    again = run_noise(dial_run.out, out, show_progress=False)
    assert again.rerun.result.ran == 0 and again.analysis == result.analysis


def test_errors_are_typed_and_exit_2_before_anything_runs(dial_run, tmp_path, capsys):
    def fails(argv: list[str], message: str) -> None:
        assert main(["noise", *map(str, argv)]) == 2
        assert message in capsys.readouterr().err

    fails([tmp_path / "nothing", "--out", tmp_path / "n1"], "is not a run folder")
    fails([dial_run.out, "--out", dial_run.out], "is the run itself")
    fails([dial_run.out, "--out", tmp_path / "n2", "--parallel", str(DEFAULT_WIDTH)],
          f"already decodes {DEFAULT_WIDTH} sequences")
    empty = ctrlsim.run("ctrlbench", out=tmp_path / "empty", max_units=0, **DIAL_RUN)
    fails([empty.out, "--out", tmp_path / "n3"], "holds no finished episodes")
    assert main(["probe", "--preset", "smoke", "--out", str(tmp_path / "probe"), "--figures", "false"]) == 0
    fails([tmp_path / "probe", "--out", tmp_path / "n4"], "declares no per-observation scores")
    assert not any((tmp_path / f"n{i}").exists() for i in range(1, 5))


def test_failed_units_of_the_rerun_exit_1_without_a_report(dial_run, tmp_path, capsys, monkeypatch):
    def broken_box(*args, **kwargs):
        raise MemoryError("no memory left")

    monkeypatch.setattr("ctrlsim.experiments.ctrlbench.units.run_box", broken_box)
    out = tmp_path / "noise"
    assert main(["noise", str(dial_run.out), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "4 of 4 ctrlbench unit(s) failed" in err and "MemoryError: no memory left" in err
    assert not (out / NOISE_MD).exists()
    monkeypatch.undo()
    assert main(["noise", str(dial_run.out), "--out", str(out)]) == 0  # the same command retries them
    assert (out / NOISE_MD).exists()


@pytest.mark.llm
@pytest.mark.slow
def test_an_llm_run_through_the_command_line(tmp_path, capsys):
    """SteerEval's smoke run (the smallest bundled LLM scores and writes), then its noise run: every
    reply is generated again in the rerun's own cache at llama.cpp width 1; the run's cache is untouched."""
    from ctrlsim.backends.bundled import SMALLEST_LLM
    from ctrlsim.experiments.context import RESPONSE_CACHE_FILE

    run, out = tmp_path / "run", tmp_path / "noise"
    assert main(["steereval", "--preset", "smoke", "--out", str(run), "--figures", "false"]) == 0
    cache = (run / RESPONSE_CACHE_FILE).read_bytes()
    assert main(["noise", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Rerun |difference| per observation" in printed and (out / NOISE_MD).read_text() in printed
    assert (run / RESPONSE_CACHE_FILE).read_bytes() == cache
    assert (out / RESPONSE_CACHE_FILE).stat().st_size > 0
    config, records = read_run_records(out / "records.jsonl")
    assert config["llm"] == f"{SMALLEST_LLM}@n_parallel=1" and len(records) == 2
    analysis = json.loads((out / NOISE_JSON).read_text())["analysis"]
    delta = analysis["metrics"]["delta_auc"]
    assert delta["rows"] == 2 and np.isfinite(delta["mean"])
