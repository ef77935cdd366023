"""train-probe's one unit, "policy": trained in the driver (`prepare`), after the up-front checks."""
from __future__ import annotations

from typing import Mapping

from ctrlsim.agents.rl import CURVE_FILE, META_FILE, POLICY_FILE, TrainProbeConfig
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.runner import RunContext
from ctrlsim.experiments.train_probe.config import POLICY_KEY


def check(ctx: RunContext) -> None:
    from ctrlsim.agents.rl import import_sb3
    from ctrlsim.errors import ConfigError
    from ctrlsim.recommenders.registry import check_recommender_name

    config = ctx.config
    check_recommender_name(config.recommender)
    dataset = ctx.unit.dataset(config.dataset)
    unknown = [t for t in config.target if t not in dataset.tags]
    if unknown:
        raise ConfigError(
            f"unknown target tag(s) {unknown} in {dataset.name!r}; known: {', '.join(dataset.tags)}"
        )
    import_sb3()  # a missing extra fails now, naming the pip command (after the cheap checks)


def prepare(ctx: RunContext) -> None:
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


def plan(ctx: RunContext, finished: Mapping[str, dict]) -> list[str]:
    return [POLICY_KEY]  # `prepare` trains it in the driver, before the first wave


def unit(config: TrainProbeConfig, unit: UnitContext) -> dict:
    # Reached only if `prepare` stored no record: a failure of the unit, never a result.
    raise RuntimeError("the policy was not trained in the driver (train-probe trains in `prepare`)")


DECISION = "one environment step of PPO training (a timestep: one choice on one slate)"


def decisions(config, key: str, record: dict) -> int:
    return int(record.get("timesteps") or 0)
