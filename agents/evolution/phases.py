"""The bodies of the evolution loop's phases (CtrlBench-Rec §3.2 Phase I, Algorithm 1, Appendix C).

`EvolutionPhases` holds one method per phase: profiles, interact, embed, cluster, debate, merge
(or select, for KMeans-Fusion) and align. Each reads the previous phase's artefacts from the
loop's `ArtefactFolder`, writes its own, and returns the summary that goes into the ledger. The
order of the phases, the ledger and resuming are the driver's (`loop.EvolutionLoop`, which
inherits these methods; subclasses can override any `phase_*` method).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

from ctrlsim.backends import TokenMeter
from ctrlsim.errors import ConfigError
from ctrlsim.seeding import derive_seed

from ..persona import Persona
from .alignment import align_roster
from .artefacts import FINAL_ROSTER, ArtefactFolder, roster_from_json, roster_to_json
from .cluster_unit import FusionJob
from .cluster_unit import usage_delta as _usage_delta
from .clustering import Clustering, cluster_population
from .debate import GenerationSettings, Turn, run_debate
from .embedding import probe_vectors
from .merge import FusionOutcome, fuse_clusters, select_best
from .settings import EvolutionSettings


class EvolutionPhases:
    """The phase methods of `EvolutionLoop`; the attributes below are set by its `__init__`."""

    folder: ArtefactFolder
    dataset: Any
    recommender: Any
    task: Any
    llm: Any
    settings: EvolutionSettings
    decision_settings: Any
    seed: int
    slate_size: int
    fuse_elsewhere: Callable[[FusionJob], list[dict]] | None
    target_tags: tuple[str, ...]
    target_items: set[str]
    nouns: dict[str, str]
    _encoder: Any  # an `Encoder`, or a `load_encoder` spec until the first embed phase

    @property
    def encoder(self):
        from ctrlsim.backends import resolve_encoder

        self._encoder = resolve_encoder(self._encoder)
        return self._encoder

    def _generation_settings(self, g: int, phase: str, max_tokens: int) -> GenerationSettings:
        return GenerationSettings(
            max_tokens=max_tokens,
            temperature=self.settings.temperature,
            seed=derive_seed(self.seed, phase, g),
        )

    # ------------------------------------------------------------------ phases
    def phase_profiles(self, initial: Callable[[], tuple[list[Persona], int]]) -> dict:
        before = self.llm.meter.total if self.llm is not None else None
        personas, tokens = initial()
        per_persona = list(tokens) if isinstance(tokens, (list, tuple)) else [tokens]
        unknown = sum(t is None for t in per_persona)  # personas whose calls had no token counts
        tokens = sum(int(t) for t in per_persona if t is not None)
        if not personas:
            raise ConfigError("the initial population is empty")
        ids = [p.probe_id for p in personas]
        if len(set(ids)) != len(ids):
            raise ConfigError("initial personas must have unique probe ids")
        self.folder.write_json("roster_g0.json", roster_to_json(personas, generation=0))
        entry = {"probes": len(personas)}
        if before is not None:
            usage = _usage_delta(before, self.llm.meter.total)
            # Personas served from the profile store cost no call now; report what writing them cost.
            usage["total_tokens"] = max(usage["total_tokens"], tokens)
            if unknown > usage.get("unknown_calls", 0):  # at least one call per such persona
                usage["unknown_calls"] = unknown
            entry["tokens"] = usage
        return entry

    def phase_interact(self, g: int) -> dict:
        """E_i rounds of the LLM probes against the black box; likes grow the behaviour streams."""
        from ctrlsim.envs import PopulationEnv

        from ..methods import Population
        from ..population import play_population

        personas = roster_from_json(self.folder.read_json(f"roster_g{g}.json"))
        meter = TokenMeter()
        env = PopulationEnv(
            self.recommender,
            n_agents=len(personas),
            task=self.task,
            slate_size=self.slate_size,
            budget=self.settings.rounds_per_merge,
            token_meter=meter,
        )
        trace = play_population(
            env,
            Population(tuple(personas), "llm"),
            seed=derive_seed(self.seed, "interact", g),
            target=self.target_tags,
            llm=self.llm,
            settings=self.decision_settings,
            meter=meter,
        )
        grown = []
        for persona, probe in zip(personas, trace.probes):
            likes = [i for r in probe.likes_per_round for i in r]
            grown.append(
                Persona.from_dict({**persona.to_dict(), "behaviour": list(persona.behaviour) + likes})
            )
        self.folder.write_json(
            f"interaction_g{g}.json",
            {"generation": g, **trace.to_dict(), "metrics": env.population_metrics()},
        )
        self.folder.write_json(f"roster_g{g}_interacted.json", roster_to_json(grown, generation=g))
        likes = [sum(len(r) for r in p.likes_per_round) for p in trace.probes]
        found = {i for p in trace.probes for r in p.likes_per_round for i in r if i in self.target_items}
        return {
            "probes": len(personas),
            "likes": sum(likes),
            "target_items_found": len(found),
            "dropped": sum(p.dropped is not None for p in trace.probes),
        }

    def phase_embed(self, g: int) -> dict:
        personas = roster_from_json(self.folder.read_json(f"roster_g{g}_interacted.json"))
        vectors = probe_vectors(personas, self.dataset, self.encoder, alpha=self.settings.alpha)
        self.folder.write_array(f"embedding_g{g}.npy", vectors)
        return {
            "probes": len(personas),
            "dim": int(vectors.shape[1]),
            "encoder": self.encoder.identity,
            "alpha": self.settings.alpha,
        }

    def phase_cluster(self, g: int) -> dict:
        personas = roster_from_json(self.folder.read_json(f"roster_g{g}_interacted.json"))
        vectors = self.folder.read_array(f"embedding_g{g}.npy")
        clustering = cluster_population(
            vectors,
            seed=derive_seed(self.seed, "kmeans", g),
            k_rule=self.settings.k_rule,
            n_init=self.settings.kmeans_n_init,
        )
        self.folder.write_json(
            f"clusters_g{g}.json",
            {
                "generation": g,
                "probe_ids": [p.probe_id for p in personas],
                **clustering.to_dict(),
                "member_ids": [[personas[i].probe_id for i in m] for m in clustering.members],
            },
        )
        return {
            "k": clustering.k,
            "clusters": len(clustering.members),
            "silhouette": clustering.silhouette,
            "singletons": sum(len(m) == 1 for m in clustering.members),
        }

    def _groups(self, g: int) -> tuple[list[Persona], Clustering, list[list[Persona]]]:
        personas = roster_from_json(self.folder.read_json(f"roster_g{g}_interacted.json"))
        clustering = Clustering.from_dict(self.folder.read_json(f"clusters_g{g}.json"))
        return personas, clustering, [[personas[i] for i in m] for m in clustering.members]

    def _recent_likes(self, g: int) -> dict[str, list[str]]:
        trace = self.folder.read_json(f"interaction_g{g}.json")
        return {p["probe_id"]: [i for r in p["likes_per_round"] for i in r] for p in trace["probes"]}

    def fusion_job(self, g: int) -> FusionJob:
        _, _, groups = self._groups(g)
        return FusionJob(
            generation=g,
            groups=tuple(tuple(p.to_dict() for p in group) for group in groups),
            recent_likes=self._recent_likes(g),
            new_ids=tuple(self._new_ids(g, len(groups))),
            target_tags=self.target_tags,
            target_items=frozenset(self.target_items),
            debate=self._generation_settings(g, "debate", self.settings.debate_max_tokens),
            merge=self._generation_settings(g, "merge", self.settings.merge_max_tokens),
            behaviour_limit=self.settings.debate_behaviour_items,
            force_target_items=self.settings.force_target_items,
        )

    def _fused_elsewhere(self, g: int, half: str) -> tuple[list[dict], dict]:
        """The per-cluster records of generation g and the summed usage of their `half`."""
        records = self.fuse_elsewhere(self.fusion_job(g))
        fields = ("prompt_tokens", "completion_tokens", "calls", "cached_calls", "total_tokens")
        usage = {k: sum(r["tokens"][half][k] for r in records) for k in fields}
        unknown = sum(r["tokens"][half].get("unknown_calls", 0) for r in records)
        return records, ({**usage, "unknown_calls": unknown} if unknown else usage)

    def _write_transcript(self, g: int, groups, transcripts) -> None:
        self.folder.write_json(
            f"transcript_g{g}.json",
            {
                "generation": g,
                "clusters": [
                    {
                        "cluster": c,
                        "members": [p.probe_id for p in group],
                        "turns": [t.to_dict() for t in turns],
                    }
                    for c, (group, turns) in enumerate(zip(groups, transcripts))
                ],
            },
        )

    def phase_debate(self, g: int) -> dict:
        _, _, groups = self._groups(g)
        if self.fuse_elsewhere is not None:
            records, tokens = self._fused_elsewhere(g, "debate")
            transcripts = [[Turn(**t) for t in r["turns"]] for r in records]
            self._write_transcript(g, groups, transcripts)
            return {
                "debating_clusters": sum(len(gr) >= 2 for gr in groups),
                "turns": sum(map(len, transcripts)),
                "tokens": tokens,
            }
        transcripts = run_debate(
            self.llm,
            groups,
            self.dataset,
            self.nouns,
            self._generation_settings(g, "debate", self.settings.debate_max_tokens),
            behaviour_limit=self.settings.debate_behaviour_items,
            key_prefix=f"g{g}/debate",
        )
        self._write_transcript(g, groups, transcripts)
        return {"debating_clusters": sum(len(gr) >= 2 for gr in groups), "turns": sum(map(len, transcripts))}

    def _new_ids(self, g: int, n: int) -> list[str]:
        return [f"g{g + 1}-{c}" for c in range(n)]

    def phase_merge(self, g: int) -> dict:
        if self.fuse_elsewhere is not None:
            records, tokens = self._fused_elsewhere(g, "merge")
            return {**self._write_fusion(g, [FusionOutcome.from_dict(r["outcome"]) for r in records]),
                    "tokens": tokens}
        _, _, groups = self._groups(g)
        data = self.folder.read_json(f"transcript_g{g}.json")
        transcripts = [[Turn(**t) for t in c["turns"]] for c in data["clusters"]]
        outcomes = fuse_clusters(
            self.llm,
            groups,
            transcripts,
            self.dataset,
            target_tags=self.target_tags,
            target_items=self.target_items,
            recent_likes=self._recent_likes(g),
            new_ids=self._new_ids(g, len(groups)),
            nouns=self.nouns,
            settings=self._generation_settings(g, "merge", self.settings.merge_max_tokens),
            max_tokens=self.settings.merge_max_tokens,
            key_prefix=f"g{g}/merge",
            force_target_items=self.settings.force_target_items,
        )
        return self._write_fusion(g, outcomes)

    def phase_select(self, g: int) -> dict:
        _, _, groups = self._groups(g)
        outcomes = select_best(groups, target_items=self.target_items, recent_likes=self._recent_likes(g))
        return self._write_fusion(g, outcomes)

    def _write_fusion(self, g: int, outcomes: list[FusionOutcome]) -> dict:
        self.folder.write_json(
            f"merge_g{g}.json", {"generation": g, "outcomes": [o.to_dict() for o in outcomes]}
        )
        self.folder.write_json(
            f"roster_g{g + 1}.json", roster_to_json([o.persona for o in outcomes], generation=g + 1)
        )
        kinds = [o.kind for o in outcomes]
        return {
            "clusters": len(outcomes),
            "merged": kinds.count("merge"),
            "filtered": kinds.count("filter"),
            "selected": kinds.count("select"),
            "invalid": sum(not o.valid for o in outcomes),
            "retried": sum(o.retried for o in outcomes),
            "target_items_added": sum(len(o.added_target_items) for o in outcomes),
        }

    def phase_align(self) -> dict:
        g = self.settings.merges
        personas = roster_from_json(self.folder.read_json(f"roster_g{g}.json"))
        aligned, records = align_roster(
            personas, self.dataset, min_behaviour=self.settings.align_min_behaviour
        )
        self.folder.write_json(
            FINAL_ROSTER,
            roster_to_json(
                aligned,
                generation=g,
                dataset=self.dataset.name,
                target=list(self.target_tags),
                settings=asdict(self.settings),
                alignment=[r.to_dict() for r in records],
            ),
        )
        return {"probes": len(aligned), "search_filled": sum(bool(r.searched) for r in records)}
