"""ctrlbench's reliability cells, checked by hand: pass^k per box x method, Coverage as a share
whose interval stays in [0, 100]%, and the paired table's minimum detectable effect."""
import pytest

from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig
from ctrlsim.experiments.ctrlbench.reliability import outcomes, pass_k_table
from ctrlsim.experiments.ctrlbench.tables import coverage_cell, curve_estimate, mde_cell
from ctrlsim.metrics.stats import paired_comparison


def _record(method, target, seed, final):
    return {"method": method, "recommender": "popularity", "target": target, "seed": seed,
            "curves": {"coverage": [0.0, final]}}


CONFIG = CtrlBenchConfig(methods=("random", "oracle"), recommenders=("popularity",), targets=("War", "Drama"),
                         seeds=(0, 1, 2), rounds=2, success_threshold=0.05)
# oracle: War 3/3, Drama 1/3; random: 0/3 and 0/3 (0.049 is below the 5% bar, 0.05 reaches it)
FINALS = {("oracle", "War"): [0.2, 0.06, 0.05], ("oracle", "Drama"): [0.0, 0.049, 0.3],
          ("random", "War"): [0.0, 0.01, 0.0], ("random", "Drama"): [0.0, 0.0, 0.02]}
RECORDS = {f"{m}|{t}|{s}": _record(m, t, s, v)
           for (m, t), finals in FINALS.items() for s, v in enumerate(finals)}


def test_successes_per_task_and_seed():
    found = outcomes(CONFIG, RECORDS)
    assert found[("popularity", "oracle")] == {"War": [True, True, True], "Drama": [False, False, True]}
    assert found[("popularity", "random")] == {"War": [False] * 3, "Drama": [False] * 3}


def test_the_pass_k_table_by_hand():
    table = pass_k_table(CONFIG, RECORDS)
    assert table.header == ["Black-Box", "Method", "tasks", "tries", "pass^1", "pass^2", "pass^3",
                            "cliff pass^1 - pass^n"]
    rows = {row[1]: row for row in table.rows}
    # oracle: War 1, 1, 1 and Drama 1/3, 0, 0 -> means 2/3, 1/2, 1/2; cliff 1/6
    assert rows["oracle"][4].startswith("0.67 [") and rows["oracle"][5].startswith("0.50 [")
    assert rows["oracle"][6].startswith("0.50 [") and rows["oracle"][7] == "+0.17"
    assert rows["random"][4:] == ["0.00 [0.00, 0.00]"] * 3 + ["+0.00"]
    assert "Coverage >= 5%" in table.title


def test_a_coverage_share_near_zero_keeps_its_interval_in_range():
    recs = [_record("random", "War", s, v) for s, v in enumerate([0.014, 0.0, 0.028])]
    estimate = curve_estimate(recs, "coverage", 2)
    assert estimate.method.startswith("bootstrap") and 0.0 <= estimate.low <= estimate.high <= 0.028
    assert coverage_cell(estimate) == f"1.40 [{100 * estimate.low:.2f}, {100 * estimate.high:.2f}]"


def test_the_minimum_detectable_effect_cell():
    from statsmodels.stats.power import TTestPower

    mine, theirs = [0.10, 0.30, 0.20, 0.25], [0.05, 0.10, 0.15, 0.05]
    diffs = [a - b for a, b in zip(mine, theirs)]
    mean = sum(diffs) / 4
    sd = (sum((d - mean) ** 2 for d in diffs) / 3) ** 0.5
    d = TTestPower().solve_power(nobs=4, alpha=0.05, power=0.8)
    assert float(mde_cell(paired_comparison(mine, theirs))) == pytest.approx(100 * sd * d, abs=0.006)
    assert mde_cell(paired_comparison([0.1], [0.0])) == "n/a (one pair)"
