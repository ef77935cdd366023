"""The audit's "Do the buttons work?" and "Declared controls" sections, from real sub-run results."""
import pytest

import ctrlsim
from ctrlsim.experiments.audit.buttons import button_lines, controls_section, responsiveness_section
from ctrlsim.experiments.config import RunOptions


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def test_sections_read_the_sub_runs_numbers(tmp_path):
    buttons = ctrlsim.run("ctrlbench", task="responsiveness", methods=("random",),
                          recommenders=("dial:0:neg=1", "popularity"), targets=("War",), agents=(3, 3),
                          rounds=2, seeds=(0, 1), feedback_actions=("not_interested",),
                          options=RunOptions(out=str(tmp_path / "buttons")), show_progress=False)
    controls = ctrlsim.run("controls", boxes=("reference-controls", "popularity"), users=6, points=3,
                           seeds=(0,), options=RunOptions(out=str(tmp_path / "controls")),
                           show_progress=False)
    rs, cs = responsiveness_section(buttons), controls_section(controls)
    full = rs["cells"]["dial:0:neg=1"]["random"]["actions"]["not_interested"]
    none = rs["cells"]["popularity"]["random"]["actions"]["not_interested"]
    assert full["feedback"] == 0 < full["skip"] and full["responsiveness"]["value"] == 1.0
    assert none["feedback"] == none["skip"] > 0 and none["responsiveness"]["value"] == 0.0
    assert any(line.startswith("dial:0:neg=1, \"not interested\"") and "responsiveness 100%" in line
               for line in rs["reading"])
    lines = cs["reading"]
    assert any("control 'diversity'" in line and ": PASS," in line and "Art. 27" in line for line in lines)
    assert any("control 'freshness'" in line and ": FAIL," in line for line in lines)
    assert any("non-profiled mode" in line and ": PASS (" in line and "Art. 38" in line for line in lines)
    assert any(line.startswith("popularity declares no user-settable control") for line in lines)
    summary = {"subruns": {"responsiveness": {"numbers": rs}, "controls": {"numbers": cs}}}
    screen = button_lines(summary)
    assert "Do the buttons work on popularity? Similar items prevented (random probes): not_interested 0%" \
        in " ".join(screen)
    assert any("Declared controls of reference-controls" in line and "diversity PASS" in line
               and "freshness FAIL" in line for line in screen)
