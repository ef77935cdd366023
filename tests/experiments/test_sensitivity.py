"""Probe-model sensitivity (`--llms`): the analysis on hand-made scores (ANOVA mean squares from
statsmodels, Kendall's W by hand), the scripted-methods and balanced-observations rules, a fast
end-to-end calibrate run with two stand-in probe models that play the user differently (its
sub-runs equal plain runs, its numbers equal `model_sensitivity` on their records), the failure
policy, and the CLI's checks before anything runs."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from stand_in_llm import StandInLLM

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.scores import SCORE_COLUMNS
from ctrlsim.experiments.sensitivity import SensitivityFailedError, run_across_llms
from ctrlsim.experiments.sensitivity.report import SENSITIVITY_JSON, SENSITIVITY_MD, analyse, blocks
from ctrlsim.experiments.sensitivity.run import check_llm_list, llm_slug, model_folder
from ctrlsim.experiments.tables import Table, render_markdown
from ctrlsim.metrics.generalizability import model_sensitivity
from ctrlsim.metrics.stats import paired_comparison


def frame(cells: dict, metric: str = "coverage", share: bool = True) -> pd.DataFrame:
    """A score frame from method -> box -> observation -> value."""
    rows = [{"key": f"{method}|{box}|{obs}", "method": method, "box": box, "observation": obs, "seed": 0,
             "metric": metric, "value": value, "share": share}
            for method, boxes in cells.items() for box, obs_values in boxes.items()
            for obs, value in obs_values.items()]
    return pd.DataFrame(rows, columns=list(SCORE_COLUMNS))


# Three boxes, two models, two observations; box B's order against A flips under m2.
M1 = {"A": {"o1": 0.10, "o2": 0.14}, "B": {"o1": 0.30, "o2": 0.34}, "C": {"o1": 0.50, "o2": 0.56}}
M2 = {"A": {"o1": 0.30, "o2": 0.32}, "B": {"o1": 0.28, "o2": 0.30}, "C": {"o1": 0.80, "o2": 0.76}}
ORACLE = {"A": {"o1": 0.5, "o2": 0.6}, "B": {"o1": 0.4, "o2": 0.4}, "C": {"o1": 0.9, "o2": 0.8}}


def _rss(y: np.ndarray, *columns: np.ndarray) -> float:
    """Residual sum of squares of the least-squares fit of y on an intercept and these columns."""
    x = np.column_stack([np.ones(len(y)), *columns])
    fitted = x @ np.linalg.lstsq(x, y, rcond=None)[0]
    return float(((y - fitted) ** 2).sum())


def anova_mean_squares(long: pd.DataFrame) -> list[float]:
    """Box, model, interaction and error mean squares of a balanced two-way layout, from nested
    least-squares fits (sequential sums of squares, as an ANOVA table has them)."""
    y = long["value"].to_numpy(float)
    box = pd.get_dummies(long["box"], drop_first=True).to_numpy(float)
    model = pd.get_dummies(long["model"], drop_first=True).to_numpy(float)
    inter = np.column_stack([box[:, i] * model[:, j] for i in range(box.shape[1])
                             for j in range(model.shape[1])])
    rss = [_rss(y), _rss(y, box), _rss(y, box, model), _rss(y, box, model, inter)]
    dfs = [box.shape[1], model.shape[1], inter.shape[1]]
    dfs.append(len(y) - 1 - sum(dfs))
    sums = [rss[0] - rss[1], rss[1] - rss[2], rss[2] - rss[3], rss[3]]
    return [ss / df for ss, df in zip(sums, dfs)]


def test_the_analysis_by_hand_against_an_anova_table():
    found = analyse({"m1": frame({"llm": M1}), "m2": frame({"llm": M2})}, "coverage")
    e = found["methods"]["llm"]
    long = pd.DataFrame([{"box": b, "model": m, "value": v} for m, cells in (("m1", M1), ("m2", M2))
                         for b, obs in cells.items() for v in obs.values()])
    ms_box, ms_model, ms_inter, ms_error = anova_mean_squares(long)
    a, b, n = 3, 2, 2
    expected = {"box": max(0.0, (ms_box - ms_inter) / (b * n)),
                "probe model": max(0.0, (ms_model - ms_inter) / (a * n)),
                "box x probe model": max(0.0, (ms_inter - ms_error) / n), "residual": ms_error}
    assert e["components"] == pytest.approx(expected) and min(expected.values()) > 0
    total = sum(expected.values())
    assert e["shares"] == pytest.approx({k: v / total for k, v in expected.items()})
    g = expected["box"] / (expected["box"] + expected["box x probe model"] / b + ms_error / (b * n))
    assert e["g_coefficient"] == pytest.approx(g)
    # Kendall's W by hand: m1 ranks A 1, B 2, C 3; m2 ranks B 1, A 2, C 3. Rank sums 3, 3, 6 around 4:
    # S = 1 + 1 + 4 = 6, W = 12 S / (m^2 (n^3 - n)) = 72 / (4 * 24).
    assert e["kendalls_w"] == pytest.approx(0.75)
    assert e["flipped_pairs"] == pytest.approx(1 / 3)
    assert e["flips"] == [{"boxes": ["A", "B"], "order": {"m1": "A < B", "m2": "A > B"}}]
    assert e["means"]["C"]["m2"]["value"] == pytest.approx(0.78)
    assert e["observations"] == ["o1", "o2"] and e["left_out"] == {}
    assert any("1 degree(s) of freedom" in line for line in e["limits"])


def test_a_method_with_identical_scores_under_every_model_is_reported_apart():
    found = analyse({"m1": frame({"llm": M1, "oracle": ORACLE}), "m2": frame({"llm": M2, "oracle": ORACLE})},
                    "coverage")
    assert list(found["methods"]) == ["llm"] and list(found["scripted"]) == ["oracle"]
    assert found["scripted"]["oracle"]["shared_scores"] == 6
    text = render_markdown(blocks(found, protocol="ctrlbench", field="llm"))
    assert "oracle: identical coverage under every probe model" in text and "no evidence" in text
    tables = [b for b in blocks(found, protocol="ctrlbench", field="llm") if isinstance(b, Table)]
    assert all("oracle" not in row for t in tables for row in t.rows)
    # One differing score is enough: the method depends on the model.
    nearly = {box: dict(obs) for box, obs in ORACLE.items()}
    nearly["C"]["o2"] = 0.81
    found = analyse({"m1": frame({"oracle": ORACLE}), "m2": frame({"oracle": nearly})}, "coverage")
    assert list(found["methods"]) == ["oracle"] and not found["scripted"]


def test_only_observations_every_cell_holds_and_boxes_every_model_ran_enter():
    m2 = {box: dict(obs) for box, obs in M2.items()}
    del m2["B"]["o2"]  # m2 lost one observation on B: o2 leaves every cell
    m1 = {**M1, "D": {"o1": 0.9, "o2": 0.9}}  # only m1 ran box D: D leaves the design
    found = analyse({"m1": frame({"llm": m1}), "m2": frame({"llm": m2})}, "coverage")
    e = found["methods"]["llm"]
    assert e["boxes"] == ["A", "B", "C"] and e["observations"] == ["o1"]
    assert e["left_out"] == {"m1": {"A": 1, "B": 1, "C": 1, "D": 2}, "m2": {"A": 1, "C": 1}}
    by_hand = model_sensitivity({b: {"m1": [m1[b]["o1"]], "m2": [m2[b]["o1"]]} for b in ("A", "B", "C")})
    assert e["g_coefficient"] == pytest.approx(by_hand["g_coefficient"])
    assert e["components"]["residual"] is None  # one observation per cell
    assert e["means"]["B"]["m1"]["value"] == pytest.approx(0.30)
    text = render_markdown(blocks(found, protocol="ctrlbench", field="llm"))
    assert "llm, m2: observations left out to balance the design: A 1, C 1." in text


def test_one_box_gets_paired_model_comparisons_and_no_ranking_figures():
    one = {"A": {"o1": 0.1, "o2": 0.3, "o3": 0.2}}
    other = {"A": {"o1": 0.2, "o2": 0.3, "o3": 0.5}}
    found = analyse({"m1": frame({"llm": one}), "m2": frame({"llm": other})}, "coverage")
    e = found["methods"]["llm"]
    assert "components" not in e and "g_coefficient" not in e
    comp = paired_comparison([0.2, 0.3, 0.5], [0.1, 0.3, 0.2])
    [paired] = e["paired"]
    assert (paired["model"], paired["reference"], paired["n"]) == ("m2", "m1", 3)
    assert paired["difference"]["value"] == pytest.approx(comp.difference.value)
    assert paired["p_wilcoxon"] == pytest.approx(comp.p_wilcoxon)
    assert any(line.startswith("One box:") for line in e["limits"])


def test_model_specs_are_checked_and_get_their_own_folders():
    assert check_llm_list("a, b") == ("a", "b")
    for bad, message in (("a", "two models or more"), ("a,a", "more than once"), ("a,,b", "empty")):
        with pytest.raises(ConfigError, match=message):
            check_llm_list(bad)
    assert llm_slug("qwen2.5-0.5b") == "qwen2.5-0.5b"
    paths = {llm_slug("/models/x.gguf"), llm_slug("models/x.gguf"), llm_slug("models_x.gguf")}
    assert len(paths) == 3 and all("/" not in p for p in paths)
    assert model_folder("out", "smollm2-135m").as_posix() == "out/llm=smollm2-135m"


# ----------------------------------------------------------------------------- end to end, no model loaded

SMALL = {"protocol": "ctrlbench", "methods": ("base-small", "oracle"), "dials": (0.0, 1.0), "seeds": (0, 1),
         "targets": ("War",), "agents": (1, 1), "rounds": 2, "decision": "yesno"}
MODELS = ("stand-in-war", "stand-in-none")


def stand_ins() -> dict:
    """Two probe models: one likes War films, one likes nothing."""
    return {"stand-in-war": StandInLLM("stand-in-war", 0.9, 0.1),
            "stand-in-none": StandInLLM("stand-in-none", 0.1, 0.1)}


def _plain(records: dict) -> dict:
    return {k: {f: v for f, v in r.items() if f != "timing"} for k, r in records.items()}


def test_each_models_subrun_is_the_plain_run_and_the_numbers_are_model_sensitivitys(tmp_path, ml100k):
    import ctrlsim

    llms = stand_ins()
    found = run_across_llms("calibrate", MODELS, out=tmp_path / "across", loaded=llms, show_progress=False,
                            **SMALL)
    assert sorted(p.name for p in (tmp_path / "across").iterdir()) == sorted(
        ["llm=stand-in-war", "llm=stand-in-none", SENSITIVITY_JSON, SENSITIVITY_MD])
    for spec in MODELS:
        plain = ctrlsim.run("calibrate", out=tmp_path / f"plain-{spec}", llms={spec: stand_ins()[spec]},
                            llm=spec, show_progress=False, **SMALL)
        sub = found.runs[spec]
        assert sub.config == plain.config and sub.out == tmp_path / "across" / f"llm={spec}"
        assert _plain(sub.records_by_key) == _plain(plain.records_by_key)
    # sensitivity.json against the records by hand: calibrate stores Coverage in % per observation id
    stored = json.loads((tmp_path / "across" / SENSITIVITY_JSON).read_text())
    scores: dict = {}
    for spec in MODELS:
        for record in found.runs[spec].records_by_key.values():
            if record["method"] == "base-small":
                cell = record["values"]["coverage"]
                scores.setdefault(record["box"], {}).setdefault(spec, []).extend(
                    cell[o] / 100 for o in sorted(cell))
    by_hand = model_sensitivity({box: {m: scores[box][m] for m in MODELS} for box in sorted(scores)})
    e = stored["analysis"]["methods"]["base-small"]
    assert e["boxes"] == ["dial:0", "dial:1"] and len(e["observations"]) == 2
    assert e["g_coefficient"] == pytest.approx(by_hand["g_coefficient"])
    assert e["kendalls_w"] == pytest.approx(by_hand["kendalls_w"])
    assert e["flipped_pairs"] == pytest.approx(by_hand["flipped_pairs"])
    comp = by_hand["components"]
    assert [e["components"][k] for k in ("box", "probe model", "box x probe model", "residual")] == \
        pytest.approx([comp.box, comp.model, comp.box_x_model, comp.residual])
    assert comp.model > 0  # the two stand-ins really played the user differently
    assert list(stored["analysis"]["scripted"]) == ["oracle"]  # the oracle uses no LLM
    assert stored["folders"] == {m: str(found.runs[m].out) for m in MODELS}
    assert (tmp_path / "across" / SENSITIVITY_MD).read_text() == found.markdown
    again = run_across_llms("calibrate", MODELS, out=tmp_path / "across", loaded=llms, show_progress=False,
                            **SMALL)
    assert all(r.ran == 0 for r in again.runs.values()) and again.analysis == found.analysis


def test_a_failed_subrun_is_loud_leaves_no_analysis_and_a_rerun_resumes(tmp_path, ml100k):
    llms = stand_ins()
    out = tmp_path / "across"
    out.mkdir()
    (out / SENSITIVITY_JSON).write_text("{}")  # an earlier analysis must not survive a failed rerun
    llms["stand-in-none"].broken = True
    with pytest.raises(SensitivityFailedError, match="stand-in-none") as caught:
        run_across_llms("calibrate", MODELS, out=out, loaded=llms, show_progress=False, **SMALL)
    result = caught.value.result
    assert list(result.failed) == ["stand-in-none"] and result.runs["stand-in-war"].ok
    assert not (out / SENSITIVITY_JSON).exists() and not (out / SENSITIVITY_MD).exists()
    llms["stand-in-none"].broken = False
    done = run_across_llms("calibrate", MODELS, out=out, loaded=llms, show_progress=False, **SMALL)
    assert done.runs["stand-in-war"].ran == 0 and done.runs["stand-in-none"].ran > 0
    assert (out / SENSITIVITY_JSON).is_file()


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--preset", "smoke", "--llms", "smollm2-135m"], "two models or more"),
    (["calibrate", "--preset", "smoke", "--llms", "smollm2-135m,smollm2-135m"], "more than once"),
    (["calibrate", "--preset", "smoke", "--llms", "smollm2-135m,no-such-model-here"], "no-such-model-here"),
    (["calibrate", "--llm", "smollm2-135m", "--llms", "smollm2-135m,qwen2.5-0.5b"], "give one of the two"),
    (["probe", "--llms", "smollm2-135m,qwen2.5-0.5b"], "declares no probe-LLM field"),
])
def test_bad_llms_are_refused_before_anything_runs(argv, message, tmp_path, capsys):
    from ctrlsim.experiments.cli import main

    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_plain_run_folder_is_not_reused_for_llms(tmp_path, ml100k):
    import ctrlsim

    fields = {k: v for k, v in SMALL.items() if k != "methods"}
    ctrlsim.run("calibrate", out=tmp_path / "run", methods=("oracle",), show_progress=False, **fields)
    with pytest.raises(ConfigError, match="holds a run of its own"):
        run_across_llms("calibrate", MODELS, out=tmp_path / "run", loaded=stand_ins(), show_progress=False,
                        methods=("oracle",), **fields)
    assert np.all([not p.name.startswith("llm=") for p in (tmp_path / "run").iterdir()])
