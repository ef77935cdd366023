"""`ctrlsim calibrate --preset smoke --llms smollm2-135m,qwen2.5-0.5b` with the two smallest bundled
LLMs: each model's sub-folder holds the records a plain run with that `--llm` writes, and
sensitivity.json holds `model_sensitivity` of those records' scores."""
from __future__ import annotations

import json

import pytest

from ctrlsim.experiments.cli import main
from ctrlsim.experiments.report import read_run
from ctrlsim.experiments.sensitivity.report import SENSITIVITY_JSON
from ctrlsim.metrics.generalizability import model_sensitivity

pytestmark = [pytest.mark.llm, pytest.mark.slow]
MODELS = ("smollm2-135m", "qwen2.5-0.5b")
SMOKE = ["calibrate", "--preset", "smoke", "--figures", "false"]


def _without_timing(records: dict) -> dict:
    return {k: {f: v for f, v in r.items() if f != "timing"} for k, r in records.items()}


def test_llms_subruns_are_plain_runs_and_the_analysis_is_model_sensitivity(tmp_path, ml100k):
    across = tmp_path / "across"
    assert main([*SMOKE, "--llms", ",".join(MODELS), "--out", str(across)]) == 0
    assert main([*SMOKE, "--llm", MODELS[0], "--out", str(tmp_path / "plain")]) == 0
    _, plain_config, plain = read_run(tmp_path / "plain")
    _, sub_config, sub = read_run(across / f"llm={MODELS[0]}")
    assert sub_config == plain_config and _without_timing(sub) == _without_timing(plain)

    scores: dict = {}
    for model in MODELS:
        _, config, records = read_run(across / f"llm={model}")
        assert config.llm == model
        for record in records.values():
            cell = record["values"]["coverage"]
            scores.setdefault(record["box"], {}).setdefault(model, []).extend(
                cell[o] / 100 for o in sorted(cell))
    stored = json.loads((across / SENSITIVITY_JSON).read_text())["analysis"]
    assert stored["models"] == list(MODELS) and stored["metric"] == "coverage"
    # measured: smollm2-135m's probe finds 1.41% of War on both dial boxes, qwen2.5-0.5b's 2.82%
    assert not stored["scripted"] and scores["dial:0"][MODELS[0]] != scores["dial:0"][MODELS[1]]
    by_hand = model_sensitivity({box: {m: scores[box][m] for m in MODELS} for box in sorted(scores)})
    e = stored["methods"]["base-small"]
    comp = by_hand["components"]
    assert [e["components"][k] for k in ("box", "probe model", "box x probe model")] == \
        pytest.approx([comp.box, comp.model, comp.box_x_model])
    assert e["components"]["residual"] is None  # the smoke preset has one observation per cell
    for name in ("g_coefficient", "kendalls_w", "flipped_pairs"):
        assert (e[name] is None and by_hand[name] != by_hand[name]) or e[name] == pytest.approx(by_hand[name])
