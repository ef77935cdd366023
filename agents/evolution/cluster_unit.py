"""One cluster's debate and merge on its own: the evolution loop's unit of work on a cluster.

The loop normally debates and merges every cluster of a generation together, one batched chat
call per debate round. `fuse_cluster` does the same work for ONE cluster, so the clusters can run
on different workers. It asks the LLM exactly what the batched path asks (same conversations,
same seeds, same meter keys, and a reply schema built from the whole generation), so with a
runtime whose seeded replies do not depend on the rest of the batch (llama.cpp evaluates every
prompt from a fresh KV cache) the transcript and the merged persona are the batched path's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..persona import Persona
from ..prompts import domain_nouns
from .debate import GenerationSettings, run_debate
from .merge import fuse_clusters


@dataclass(frozen=True)
class FusionJob:
    """One generation's debate-and-merge work, picklable: groups are persona dicts per cluster."""

    generation: int
    groups: tuple[tuple[dict, ...], ...]
    recent_likes: dict[str, list[str]]
    new_ids: tuple[str, ...]
    target_tags: tuple[str, ...]
    target_items: frozenset[str]
    debate: GenerationSettings
    merge: GenerationSettings
    behaviour_limit: int
    force_target_items: bool = False  # EvolutionSettings.force_target_items

    def unit_keys(self) -> list[str]:
        return [f"fusion/g{self.generation}/cluster-{c}" for c in range(len(self.groups))]

    @staticmethod
    def cluster_of(key: str) -> int:
        return int(key.rsplit("cluster-", 1)[1])


def usage_delta(before, after) -> dict:
    """LLM usage between two `TokenMeter` totals (`unknown_calls` only when some calls had no counts)."""
    out = {k: getattr(after, k) - getattr(before, k)
           for k in ("prompt_tokens", "completion_tokens", "calls", "cached_calls")}
    unknown = getattr(after, "unknown_calls", 0) - getattr(before, "unknown_calls", 0)
    if unknown:
        out["unknown_calls"] = unknown
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def fuse_cluster(llm, dataset, job: FusionJob, cluster: int) -> dict:
    """Debate then merge (or filter, for a single member) cluster `cluster` of `job`.

    Returns {"cluster", "turns", "outcome", "tokens": {"debate", "merge"}}: the cluster's transcript
    turns, its `FusionOutcome` as a dict, and the LLM usage of each half (this `llm`'s meter delta).
    """
    groups = [[Persona.from_dict(p) for p in group] for group in job.groups]
    group = groups[cluster]
    nouns = domain_nouns(dataset.name)
    start = llm.meter.total
    turns = run_debate(llm, [group], dataset, nouns, job.debate, behaviour_limit=job.behaviour_limit,
                       key_prefix=f"g{job.generation}/debate")[0]
    debated = llm.meter.total
    outcome = fuse_clusters(
        llm,
        [group],
        [turns],
        dataset,
        target_tags=job.target_tags,
        target_items=set(job.target_items),
        recent_likes=job.recent_likes,
        new_ids=[job.new_ids[cluster]],
        nouns=nouns,
        settings=job.merge,
        max_tokens=job.merge.max_tokens,
        key_prefix=f"g{job.generation}/merge",
        schema_groups=groups,
        force_target_items=job.force_target_items,
    )[0]
    return {
        "cluster": cluster,
        "turns": [t.to_dict() for t in turns],
        "outcome": outcome.to_dict(),
        "tokens": {"debate": usage_delta(start, debated), "merge": usage_delta(debated, llm.meter.total)},
    }
