"""train-probe's report: the training summary and the learning curve."""
from __future__ import annotations

from typing import Mapping

from ctrlsim.agents.rl import CURVE_FILE
from ctrlsim.experiments.runner import RunContext
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.experiments.train_probe.config import POLICY_KEY, ROLLING


def learning_curve(ctx: RunContext) -> list[dict[str, float]]:
    from ctrlsim.agents.rl import read_curve

    assert ctx.folder is not None
    path = ctx.folder.file(CURVE_FILE)
    return read_curve(path) if path.exists() else []


def report(ctx: RunContext, records: Mapping[str, dict]) -> list[Block]:
    import numpy as np

    meta = records.get(POLICY_KEY)
    if meta is None:
        return [Text("# Learned probe\n\n(not trained yet)")]
    config = meta["config"]
    rows = learning_curve(ctx)
    first, last = rows[:ROLLING], rows[-ROLLING:]

    def mean(part: list[dict[str, float]], key: str) -> str:
        values = [r[key] for r in part if r[key] == r[key]]
        return f"{np.mean(values):.3f}" if values else "-"

    summary = [
        ["black box", config["recommender"]],
        ["target", ", ".join(config["target"])],
        ["algorithm", f"{meta['algorithm']} (Stable-Baselines3 {meta['versions']['stable_baselines3']})"],
        [
            "actions",
            "likes + search menu (catalogue tags)" if meta["search_menu"] else "likes only (no search)",
        ],
        [
            "observation",
            ", ".join(k for k in ("tags", "popularity") if meta["features"][k])
            + (f", {meta['features']['embedding']} embedding" if meta["features"].get("embedding") else ""),
        ],
        ["slate size, budget", f"{config['slate_size']}, {config['budget']} rounds"],
        ["timesteps, episodes", f"{meta['timesteps']:,}, {meta['episodes']:,}"],
        ["training time", f"{meta['seconds']:.0f} s wall, {meta['cpu_seconds']:.0f} s CPU"],
        [f"Coverage, first {ROLLING} episodes", mean(first, "coverage")],
        [f"Coverage, last {ROLLING} episodes", mean(last, "coverage")],
        [f"return, first / last {ROLLING} episodes", f"{mean(first, 'return')} / {mean(last, 'return')}"],
    ]
    where = ctx.folder.path if ctx.folder else "<out>"
    return [Table.of("Learned probe", summary, ["", ""], level=1, after=(
        "Training-episode Coverage is measured on the training episodes themselves (users drawn by "
        "the training seed). It shows that the policy learned, not how well it controls the box: "
        f"evaluate it with `ctrlsim ctrlbench --methods random,oracle,rl:{where}"
        f" --recommenders {config['recommender']} --targets {'+'.join(config['target'])}"
        f" --slate-size {config['slate_size']}`."))]


def figures(ctx: RunContext, records: Mapping[str, dict]) -> None:
    import numpy as np

    from ctrlsim.experiments.runfolder import new_figure

    rows = learning_curve(ctx)
    if not rows or ctx.folder is None:
        return
    steps = np.array([r["timesteps"] for r in rows])
    fig, axes = new_figure((9, 3.4), 1, 2)
    for ax, key, label in ((axes[0], "coverage", "Coverage at episode end"), (axes[1], "return", "return")):
        values = np.array([r[key] for r in rows])
        window = min(ROLLING, len(values))
        smooth = np.convolve(values, np.ones(window) / window, mode="valid")
        ax.plot(steps, values, ".", alpha=0.15, markersize=3, label="episodes")
        ax.plot(steps[window - 1 :], smooth, label=f"mean of {window}")
        ax.set_xlabel("training timesteps")
        ax.set_ylabel(label)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_title("learning curve (training episodes)")
    fig.tight_layout()
    ctx.folder.save_figure(fig, "learning_curve")
