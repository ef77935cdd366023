"""`ctrlsim evolve` on an executor: each cluster's debate and merge as one unit of work.

With `--executor ray` the driver runs the loop's other phases and writes every artefact; the
clusters of a generation go to the workers (`fuse_cluster_unit`) and come back as records.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.context import UnitContext, UnitPayload, UnitSettings, call_unit

if TYPE_CHECKING:  # the executor module is imported lazily at run time
    from ctrlsim.experiments.executor import Executor


@dataclass(frozen=True)
class FusionUnitConfig:
    """What a worker needs to debate and merge one cluster: models by spec, the generation's job."""

    llm: str
    dataset: str
    job: object  # ctrlsim.agents.evolution.cluster_unit.FusionJob


def fuse_cluster_unit(config: FusionUnitConfig, unit: UnitContext) -> dict:
    """Unit of work: one evolution cluster's debate and merge (key "fusion/g<g>/cluster-<c>").

    The LLM and the dataset come from the unit context (once per worker process). The response
    cache is SQLite, which takes concurrent readers and writers on one machine, so workers that see
    the run folder share the driver's cache file; a worker on a node without it runs uncached
    (seeded replies are the same, only paid again).
    """
    from ctrlsim.agents.evolution.cluster_unit import FusionJob, fuse_cluster

    llm, dataset = unit.llm(config.llm), unit.dataset(config.dataset)
    return fuse_cluster(llm, dataset, config.job, FusionJob.cluster_of(unit.key))


class ExecutorFusion:
    """`EvolutionLoop.fuse_elsewhere` on an executor: cluster units run there, the driver stores
    their records (a rerun skips the clusters already stored) and the loop writes the artefacts."""

    def __init__(self, config, options: RunOptions, folder, settings: UnitSettings, *, show_progress: bool):
        self.config, self.options, self.folder, self.show_progress = config, options, folder, show_progress
        self.settings = settings  # the run's unit settings: its response caches travel with each unit
        self.executor: Executor | None = None

    def __call__(self, job) -> list[dict]:
        from ctrlsim.experiments.driver import UnitsFailed
        from ctrlsim.experiments.executor import executor_from_options, is_failure

        store, keys = self.folder.store, job.unit_keys()
        todo = [k for k in keys if k not in store]
        failed: dict[str, str] = {}

        def on_record(key: str, record: dict) -> None:
            if is_failure(record):  # not stored: a rerun retries the cluster
                failed[key] = record["error"]
            else:
                store.add(key, record)

        if todo:
            if self.executor is None:
                self.executor = executor_from_options(self.options)
            unit_config = FusionUnitConfig(self.config.llm, self.config.dataset, job)
            self.executor.run(partial(call_unit, fuse_cluster_unit), UnitPayload(unit_config, self.settings),
                              todo, on_record,
                              progress=self.show_progress, desc=f"clusters g{job.generation}")
        if failed:  # the next phases need every cluster: the run stops here, a rerun retries these
            raise UnitsFailed(failed)
        return [store.get(k) for k in keys]

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None
