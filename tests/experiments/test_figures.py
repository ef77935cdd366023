"""Run-folder figures are built without pyplot (no global figure registry, no backend switch)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import matplotlib.image as mpimg
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ctrlsim.experiments.runfolder import RunFolder, new_figure


def test_new_figure_has_the_asked_size_and_axes_grid():
    fig, ax = new_figure((4, 3))
    assert isinstance(fig, Figure) and tuple(fig.get_size_inches()) == (4.0, 3.0) and fig.axes == [ax]
    fig, axes = new_figure((9, 3.2), 1, 2)
    assert axes.shape == (2,) and list(fig.axes) == list(axes)
    fig, axes = new_figure((8, 3.2), 1, 2, squeeze=False)
    assert axes.shape == (1, 2)


def test_saved_figure_is_a_png_of_the_figure(tmp_path):
    fig, ax = new_figure((4, 3))
    ax.set_position((0, 0, 1, 1))  # the axes fill the figure: the tight box is the whole 4 x 3 inches
    ax.set_axis_off()
    ax.add_patch(Rectangle((0, 0), 1, 1, color="red"))
    with RunFolder(tmp_path / "run", {"seed": 1}) as run:
        path = run.save_figure(fig, "red")
    assert path == tmp_path / "run" / "figures" / "red.png"
    image = mpimg.imread(path)
    # 120 dpi: 480 x 360 pixels, plus bbox_inches="tight"'s 0.1 inch (12 pixel) pad on every side
    assert image.shape == (360 + 24, 480 + 24, 4)
    assert np.array_equal(image[192, 252], [1.0, 0.0, 0.0, 1.0])  # centre: the red patch
    assert np.array_equal(image[0, 0], [1.0, 1.0, 1.0, 1.0])  # the pad: white background


def _run(code: str) -> str:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_runner_figure_functions_do_not_import_pyplot(tmp_path):
    code = f"""
import itertools, json, sys
from pathlib import Path
from ctrlsim.experiments.evolve import report as evolve
from ctrlsim.experiments.promptshift import report as promptshift_report
from ctrlsim.experiments.steereval import report as steereval_tables
from ctrlsim.experiments.runfolder import RunFolder

folder = RunFolder(Path({str(tmp_path / "run")!r}), {{"seed": 1}})
cells = itertools.product(("default", "embedding"), ("Action", "Drama"), ("increase", "decrease"), range(3))
records = [{{"condition": c, "tag": t, "direction": d, "delta_auc": 0.01 * n}}
           for n, (c, t, d, _) in enumerate(cells)]
steereval_tables.write_figures(folder, records)
evolve.save_level_figure(folder, {{"easy": {{"accuracy": [0.1, 0.4], "old_interest": [0.6, 0.5]}}}})
evolve.save_figures(folder, [{{"probes": 4, "next_probes": 2}}],
                    {{"rounds": 2, "curves": {{"coverage": [0.1, 0.2]}}, "new_discoveries": [1, 0]}})
setting = {{"dataset": "ml-100k", "model": "m", "table4": {{"paraphrase_drift": 0.1}},
           "per_scenario": {{"s": {{"B0/drift": 0.2, "B0/drift/se": 0.01, "B0/slice_shift": 0.1,
                                   "B0/slice_shift/se": 0.01}}}},
           "variants": {{v: {{"drift": 0.1, "slice_shift": 0.0}} for v in ("B0", "B1", "B2", "B3")}}}}
for name, fig in promptshift_report.figures({{"settings": [setting]}}).items():
    folder.save_figure(fig, name)
folder.close()
print(json.dumps(["matplotlib.pyplot" in sys.modules, sorted(p.name for p in folder.path.glob("figures/*"))]))
"""
    pyplot_loaded, names = json.loads(_run(code))
    assert pyplot_loaded is False
    assert names == sorted(["delta_auc_per_condition.png", "delta_auc_per_tag.png", "task2_levels.png",
                            "population.png", "evaluation.png", "scenarios_m.png", "variants.png"])
    for name in names:
        image = mpimg.imread(tmp_path / "run" / "figures" / name)
        assert image.ndim == 3 and image.shape[2] == 4 and min(image.shape[:2]) > 100


def test_a_pyplot_figure_is_still_closed_after_saving(tmp_path):
    code = f"""
import matplotlib.pyplot as plt
from ctrlsim.experiments.runfolder import RunFolder

fig, ax = plt.subplots()
ax.plot([0, 1], [0, 1])
with RunFolder({str(tmp_path / "run")!r}, {{"seed": 1}}) as run:
    run.save_figure(fig, "line")
print(plt.get_fignums())
"""
    assert _run(code) == "[]"
    assert (tmp_path / "run" / "figures" / "line.png").stat().st_size > 0
