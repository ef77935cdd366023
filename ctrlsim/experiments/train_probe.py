"""`ctrlsim train-probe`: train a learned probe (Stable-Baselines3) against one black box and target.

The run folder holds, besides the driver's files:

    policy.zip, policy.json   the trained policy and what it was trained on (`ctrlsim.agents.rl`)
    learning_curve.csv        one row per training episode: timesteps, return, Coverage
    figures/learning_curve.png

The folder is then a ctrlbench method: `ctrlsim ctrlbench --methods random,oracle,rl:<out>`.
Training is one unit ("policy"), run by the driver: a rerun of a finished folder trains nothing,
an interrupted one trains again from the start (training takes minutes). Needs the `rl` extra.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctrlsim.agents.rl import CURVE_FILE, META_FILE, POLICY_FILE, TrainProbeConfig
from ctrlsim.experiments.runner import RunContext, Runner

DEFAULT_OUT = "results/train-probe"
POLICY_KEY = "policy"
ROLLING = 50  # episodes in the learning curve's moving average


def _check(ctx: RunContext) -> None:
    from ctrlsim.agents.rl import import_sb3
    from ctrlsim.errors import ConfigError
    from ctrlsim.experiments.units import cached_dataset
    from ctrlsim.recommenders.registry import check_recommender_name

    config = ctx.config
    check_recommender_name(config.recommender)
    dataset = cached_dataset(config.dataset)
    unknown = [t for t in config.target if t not in dataset.tags]
    if unknown:
        raise ConfigError(
            f"unknown target tag(s) {unknown} in {dataset.name!r}; known: {', '.join(dataset.tags)}"
        )
    import_sb3()  # a missing extra fails now, naming the pip command (after the cheap checks)


def _prepare(ctx: RunContext) -> None:
    """Train unless the folder already holds the finished policy (its record and its files)."""
    from ctrlsim.agents.rl import train_probe
    from ctrlsim.experiments.driver import UnitsFailed
    from ctrlsim.experiments.executor import failure_record

    folder = ctx.folder
    assert folder is not None
    have = all(folder.file(name).exists() for name in (POLICY_FILE, META_FILE, CURVE_FILE))
    if POLICY_KEY in folder.store and have:
        return
    try:
        meta = train_probe(ctx.config, folder.path, show_progress=ctx.show_progress)
    except Exception as exc:  # noqa: BLE001 - a failed training is the run's failed unit, never a result
        raise UnitsFailed({POLICY_KEY: failure_record(exc)["error"]}) from exc
    if POLICY_KEY not in folder.store:
        folder.store.add(POLICY_KEY, meta)


def _plan(ctx: RunContext, finished: Mapping[str, dict]) -> list[str]:
    return [POLICY_KEY]  # `prepare` trains it in the driver, before the first wave


def _unit(config: TrainProbeConfig, key: str) -> dict:
    # Reached only if `prepare` stored no record: a failure of the unit, never a result.
    raise RuntimeError("the policy was not trained in the driver (train-probe trains in `prepare`)")


def _curve(ctx: RunContext) -> list[dict[str, float]]:
    from ctrlsim.agents.rl import read_curve

    assert ctx.folder is not None
    path = ctx.folder.file(CURVE_FILE)
    return read_curve(path) if path.exists() else []


def _report(ctx: RunContext, records: Mapping[str, dict]) -> str:
    import numpy as np

    from ctrlsim.experiments.tables import github_table

    meta = records.get(POLICY_KEY)
    if meta is None:
        return "# Learned probe\n\n(not trained yet)\n"
    config = meta["config"]
    rows = _curve(ctx)
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
    return (
        "# Learned probe\n\n" + github_table(summary, ["", ""]) + "\n\n"
        "Training-episode Coverage is measured on the training episodes themselves (users drawn by "
        "the training seed). It shows that the policy learned, not how well it controls the box: "
        f"evaluate it with `ctrlsim ctrlbench --methods random,oracle,rl:{where}"
        f" --recommenders {config['recommender']} --targets {'+'.join(config['target'])}"
        f" --slate-size {config['slate_size']}`.\n"
    )


def _figures(ctx: RunContext, records: Mapping[str, dict]) -> None:
    import numpy as np

    from ctrlsim.experiments.runfolder import new_figure

    rows = _curve(ctx)
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


RUNNER = Runner(
    name="train-probe",
    config_cls=TrainProbeConfig,
    description=__doc__,
    unit_fn=_unit,
    plan=_plan,
    check=_check,
    prepare=_prepare,
    report=_report,
    figures=_figures,
    encoder_fields=("embedding",),
    record_fields=("config", "features", "timesteps"),
    default_out=DEFAULT_OUT,
    unit_name="policies",
)


def run_train_probe(config: TrainProbeConfig, options=None, *, show_progress: bool = True) -> dict[str, Any]:
    from ctrlsim.experiments.driver import drive

    result = drive(RUNNER, config, options, show_progress=show_progress)
    return {"out": str(result.out), "meta": result.records_by_key.get(POLICY_KEY), "failed": result.failed}
