"""SteerEval metric hook, table cells, filters and tie order against hand-computed values."""
import math

import numpy as np
import pytest
from ctrlsim.envs.steereval_env import rank_pool

from ctrlsim.experiments.steereval.config import SteerEvalConfig
from ctrlsim.experiments.steereval.report import (
    format_tables,
    kept_trigger_tags,
    per_tag_summary,
    table8,
    token_totals,
)
from ctrlsim.experiments.tables import render_markdown
from ctrlsim.metrics import direction_cell, paired_t_test, rejected_tags, steereval_figures
from ctrlsim.metrics.stats import format_test, mean_ci


def rec(direction, before, after, tag="Horror", kind="genre", condition="default", **extra):
    return {"condition": condition, "direction": direction, "auc_before": before, "auc_after": after,
            "delta_auc": after - before, "tag": tag, "tag_kind": kind, "next_item_relevant": False,
            "rank_set_before": 1, "rank_set_after": 1, **extra}


def test_figures_of_one_episode_by_hand():
    # pool a..f, relevant {a, b, c}; next item b (relevant)
    before = ["a", "d", "b", "e", "c", "f"]  # relevant above irrelevant in 3+2+1 = 6 of 9 pairs
    after = ["d", "e", "a", "f", "b", "c"]   # 1+0+0 = 1 of 9 pairs
    f = steereval_figures(before, after, {"a", "b", "c"}, "b", k=2)
    assert f["auc_before"] == pytest.approx(6 / 9) and f["auc_after"] == pytest.approx(1 / 9)
    assert f["delta_auc"] == pytest.approx(-5 / 9)
    assert f["next_item_relevant"] is True
    assert f["rank_set_before"] == 2 and f["rank_set_after"] == 2  # b is 2nd of the relevant items in both
    assert f["coverage@2_before"] == 0.5 and f["coverage@2_after"] == 0.0
    # NDCG@2 before: gains (1, 0) -> 1 / (1 + 1/log2(3))
    assert f["ndcg@2_before"] == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_table_cell_mean_and_one_tailed_test_by_hand():
    records = [rec("increase", 0.5, 0.6), rec("increase", 0.5, 0.7), rec("increase", 0.5, 0.8),
               rec("decrease", 0.5, 0.5)]
    cell = direction_cell(records, "increase")
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t = 0.2 / (0.1 / sqrt 3); df 2 has the closed form
    # P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2
    t = 0.2 / (0.1 / math.sqrt(3))
    assert cell.n == 3 and cell.mean == pytest.approx(0.2) and cell.test.t == pytest.approx(t)
    assert cell.test.p == pytest.approx((1 - t / math.sqrt(t * t + 2)) / 2)
    assert cell.steered and cell.significant
    assert format_test(cell.test) == "+0.2000 (*)"
    assert direction_cell(records, "decrease").test.defined is False  # one scenario: undefined
    assert direction_cell([], "increase") is None


def test_zero_variance_is_undefined_exactly():
    same = paired_t_test([0.3, 0.3, 0.3], [0.2, 0.2, 0.2])  # differences exactly equal
    assert not same.defined and math.isnan(same.p) and not same.significant()
    assert format_test(same) == "+0.1000 (undefined)"
    # differences that only almost agree are a real (defined) test, not p = 0 as np.allclose made them
    near = paired_t_test(np.array([1e-9, 1e-9 + 1e-18, 1e-9 + 2e-18]), alternative="greater")
    assert near.defined and 0.0 < near.p < 1.0


def test_ties_follow_the_given_random_order_and_scores_otherwise():
    pool = ["a", "b", "c", "d"]
    scores = np.array([1.0, 3.0, 1.0, 1.0])
    assert rank_pool(pool, scores, np.array([2, 0, 1, 0])) == ["b", "d", "c", "a"]  # ties: d(0) c(1) a(2)
    assert rank_pool(pool, scores, np.array([0, 0, 1, 2])) == ["b", "a", "c", "d"]


def test_refusal_filter_drops_tags_above_a_quarter():
    def edit(tag, direction, condition, problems):
        return rec(direction, 0.5, 0.5, tag=tag, kind="trigger", condition=condition, edit_problems=problems)

    written = ([edit("ghosts", "increase", "llm-rewrite", ["refusal"])] +
               [edit("ghosts", "increase", "llm-rewrite", []) for _ in range(2)] +  # 1 of 3 > 25%: dropped
               [edit("gore", "decrease", "llm-append", ["refusal"])] +
               [edit("gore", "decrease", "llm-append", []) for _ in range(3)])  # 1 of 4 = 25%: kept
    assert rejected_tags(written) == {"ghosts"}
    default = [rec("increase", 0.5, 0.6, tag=t, kind="trigger") for t in ("ghosts", "gore")]
    assert kept_trigger_tags(written + default, 0.25) == ({"gore"}, {"ghosts"})
    assert kept_trigger_tags(default, 0.25) is None  # no LLM-written edit: the filter cannot be applied


def test_per_tag_counts_and_table5_rows():
    records = [rec("increase", 0.5, 0.6, tag="A"), rec("increase", 0.5, 0.7, tag="A"),
               rec("increase", 0.5, 0.4, tag="B"), rec("decrease", 0.5, 0.3, tag="A"),
               rec("decrease", 0.5, 0.6, tag="B")]
    summary = per_tag_summary(records)
    assert summary["increase"]["A"][0] == pytest.approx(0.15) and summary["increase"]["A"][1]
    assert summary["increase"]["B"][1] is False and summary["decrease"]["A"][1] is True
    result = {"records": records, "llm": "test", "short_tags": {}, "tokens": token_totals(records)}
    text = render_markdown(format_tables(result, SteerEvalConfig(users=1)))
    assert "| Genre (2)" in text and "1/2 in the right direction" in text
    # increases 0.1, 0.2, -0.1: mean 0.0667, not significant; decreases -0.2, +0.1: mean -0.05
    assert "| LLM scoring | +0.0667 n=3" in text and "-0.0500 n=2" in text
    assert "Table 8" in text and "digit probabilities" in text


def test_table8_samples_at_most_the_requested_number():
    records = [{**rec("increase", 0.5, 0.6), "next_item_relevant": i % 2 == 0, "rank_set_before": i,
                "rank_set_after": i + 1} for i in range(10)]
    rows = [row for row in table8(records, samples=3, seed=0).rows if row[0] == "Increase"]
    assert [r[4] for r in rows] == [3, 3]  # n per cell
    assert [r[3] for r in rows] == ["+1.00", "+1.00"]  # every sampled scenario moved down one place


def test_confidence_interval_by_hand():
    est = mean_ci([1.0, 2.0, 3.0])
    mean, half = est.value, est.half_width
    # sd 1, n 3, t(0.975, 2) = 4.302652729911275
    assert mean == 2.0 and half == pytest.approx(4.302652729911275 / math.sqrt(3))
    assert token_totals([{"tokens": {"prompt": 3, "completion": 1}}, {}]) == \
        {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
