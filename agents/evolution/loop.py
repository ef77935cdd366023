"""The evolutionary training loop (CtrlBench-Rec §3.2 Phase I, Algorithm 1, Appendix C).

    profiles -> [interact E_i rounds -> embed -> cluster -> debate -> merge] x E_m -> align

Each phase is a method that reads the previous phase's artefacts and writes its own before the
next starts; the ledger entry written last marks it finished (see `artefacts`). A killed run
resumes at the first unfinished phase, and a phase cut short mid-way replays its LLM calls from
the response cache of the LLM it is given (`load_llm(spec, cache=...)`), so no call is paid
twice. Artefacts per generation g (g = 0 is the initial population):

    roster_g{g}.json            personas entering generation g
    interaction_g{g}.json       per-probe likes per round, decision stats, tokens
    roster_g{g}_interacted.json personas with their grown behaviour streams
    embedding_g{g}.npy          the probe vectors V (rows in roster order)
    clusters_g{g}.json          k, k rule, silhouette, membership (probe ids)
    transcript_g{g}.json        debate turns per cluster (fusion "debate-merge" only)
    merge_g{g}.json             fusion outcomes: raw replies, validity, retries, flags, lineage
    final_roster.json           aligned super probes (evaluate with `ctrlsim ctrlbench --roster`)
    phases.json                 finished phases with wall time and token use

Extending: `fusion="select-best"` is the KMeans-Fusion baseline (keep each cluster's best
member, no debate or merge); subclasses can override any `phase_*` method.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from ctrlsim.backends import TokenMeter
from ctrlsim.errors import ConfigError
from ctrlsim.seeding import derive_seed

from ..persona import Persona
from ..prompts import domain_nouns
from .alignment import align_roster
from .artefacts import ArtefactFolder
from .cluster_unit import FusionJob
from .cluster_unit import usage_delta as _usage_delta
from .clustering import K_RULES, Clustering, cluster_population
from .debate import GenerationSettings, Turn, run_debate
from .embedding import DEFAULT_ALPHA, probe_vectors
from .merge import FusionOutcome, fuse_clusters, select_best

FUSIONS = ("debate-merge", "select-best")
FINAL_ROSTER = "final_roster.json"


@dataclass(frozen=True)
class EvolutionSettings:
    """The schedule and every knob of the loop (Appendix C defaults).

    merges (E_m), rounds_per_merge (E_i): fuse every E_i interaction rounds, E_m times.
    k_rule: "halve" (k = ceil(N/2)) or "silhouette" (best k in [N/2, 3N/4]).
    alpha: weight of the bio in V = α·enc(bio) + (1−α)·mean(enc(liked items)).
    fusion: "debate-merge" (CtrlBench-Rec) or "select-best" (KMeans-Fusion).
    """

    merges: int = 2
    rounds_per_merge: int = 2
    k_rule: str = "halve"
    alpha: float = DEFAULT_ALPHA
    fusion: str = "debate-merge"
    kmeans_n_init: int = 5
    debate_max_tokens: int = 160
    merge_max_tokens: int = 384
    temperature: float = 0.7
    debate_behaviour_items: int = 8
    align_min_behaviour: int = 4

    def __post_init__(self):
        for name in (
            "merges",
            "rounds_per_merge",
            "kmeans_n_init",
            "debate_max_tokens",
            "merge_max_tokens",
            "debate_behaviour_items",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.align_min_behaviour < 0:
            raise ConfigError(f"align_min_behaviour must be >= 0, got {self.align_min_behaviour}")
        if self.k_rule not in K_RULES:
            raise ConfigError(f"k_rule must be one of {K_RULES}, got {self.k_rule!r}")
        if self.fusion not in FUSIONS:
            raise ConfigError(f"fusion must be one of {FUSIONS}, got {self.fusion!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")


@dataclass
class EvolutionResult:
    final: list[Persona]
    generations: list[dict]  # per generation: sizes, k, silhouette, fusion counts
    phases: dict[str, dict] = field(default_factory=dict)
    stopped_after: str | None = None

    @property
    def tokens(self) -> int:
        return sum(int(p.get("tokens", {}).get("total_tokens", 0)) for p in self.phases.values())


def roster_to_json(personas: Sequence[Persona], **extra) -> dict:
    return {**extra, "personas": [p.to_dict() for p in personas]}


def roster_from_json(data: dict) -> list[Persona]:
    return [Persona.from_dict(d) for d in data["personas"]]




class EvolutionLoop:
    """Runs (or resumes) the loop in `folder` for one black box and target.

    dataset, recommender, task: the black box and the task the probes interact under (the task's
        `target`/`tags` are the merge agent's anchor and the best-member criterion).
    llm: the shared LLM (give it a response cache for free resumes). encoder: an `Encoder` or a
        `load_encoder` spec, loaded only when an embed phase runs.
    decision_settings: how probes decide in interaction phases (`DecisionSettings`).
    """

    def __init__(
        self,
        folder: ArtefactFolder | str,
        *,
        dataset,
        recommender,
        task,
        llm,
        encoder="minilm",
        settings: EvolutionSettings = EvolutionSettings(),
        decision_settings=None,
        seed: int = 0,
        slate_size: int = 3,
        show_progress: bool = False,
        fuse_elsewhere: Callable[[FusionJob], list[dict]] | None = None,
    ):
        """`fuse_elsewhere(job)`: runs one generation's debate and merge cluster by cluster
        (`cluster_unit.fuse_cluster` records, in cluster order), e.g. on an executor's workers;
        by default the clusters debate and merge together here, one batched call per round."""
        from ..llm_probe import DecisionSettings

        self.folder = folder if isinstance(folder, ArtefactFolder) else ArtefactFolder(folder)
        self.dataset, self.recommender, self.task, self.llm = dataset, recommender, task, llm
        self._encoder = encoder
        self.settings, self.seed, self.slate_size = settings, seed, slate_size
        self.decision_settings = decision_settings if decision_settings is not None else DecisionSettings()
        self.show_progress = show_progress
        self.fuse_elsewhere = fuse_elsewhere
        self.target_tags = tuple(getattr(task, "tags", ()) or ())
        self.target_items = set(getattr(task, "target", set()) or set())
        self.nouns = domain_nouns(dataset.name)

    # ------------------------------------------------------------------ plumbing
    @property
    def encoder(self):
        if isinstance(self._encoder, str):
            from ctrlsim.backends import load_encoder

            self._encoder = load_encoder(self._encoder)
        return self._encoder

    def plan(self, initial) -> list[tuple[str, Callable[[], dict]]]:
        """The phases in order, each a (name, body) pair."""
        steps: list[tuple[str, Callable[[], dict]]] = [("profiles", lambda: self.phase_profiles(initial))]
        for g in range(self.settings.merges):
            steps += [
                (f"interact_g{g}", lambda g=g: self.phase_interact(g)),
                (f"embed_g{g}", lambda g=g: self.phase_embed(g)),
                (f"cluster_g{g}", lambda g=g: self.phase_cluster(g)),
            ]
            if self.settings.fusion == "debate-merge":
                steps += [
                    (f"debate_g{g}", lambda g=g: self.phase_debate(g)),
                    (f"merge_g{g}", lambda g=g: self.phase_merge(g)),
                ]
            else:
                steps.append((f"select_g{g}", lambda g=g: self.phase_select(g)))
        return steps + [("align", self.phase_align)]

    def _run_phase(self, name: str, body: Callable[[], dict]) -> dict:
        """Run `body` unless the ledger says `name` is finished; record wall time, this process's CPU
        time (what the phase would take alone on one core: a shared machine inflates wall time) and tokens."""
        if self.folder.done(name):
            return self.folder.entry(name)
        before = self.llm.meter.total if self.llm is not None else None
        start, cpu_start = time.perf_counter(), time.process_time()
        summary = body() or {}
        entry = {
            "seconds": round(time.perf_counter() - start, 3),
            "cpu_seconds": round(time.process_time() - cpu_start, 3),
            **summary,
        }
        if before is not None and "tokens" not in entry:
            entry["tokens"] = _usage_delta(before, self.llm.meter.total)
        self.folder.finish(name, entry)
        return entry

    def _generation_settings(self, g: int, phase: str, max_tokens: int) -> GenerationSettings:
        return GenerationSettings(
            max_tokens=max_tokens,
            temperature=self.settings.temperature,
            seed=derive_seed(self.seed, phase, g),
        )

    # ------------------------------------------------------------------ run
    def run(
        self,
        initial: Callable[[], tuple[Sequence[Persona], int | Sequence[int]]],
        *,
        stop_after: str | None = None,
    ) -> EvolutionResult:
        """Run every unfinished phase; `initial()` -> (K_init personas, tokens spent writing them, in
        all or per persona) is called only while the profiles phase is unfinished. `stop_after` ends
        the run once that phase is finished (the result then has `stopped_after` set and no final roster)."""
        from tqdm import tqdm

        steps = self.plan(initial)
        if stop_after is not None and stop_after not in [name for name, _ in steps]:
            raise ConfigError(
                f"stop_after {stop_after!r} is not a phase of this loop: {[n for n, _ in steps]}"
            )
        with tqdm(total=len(steps), desc="evolution", unit="phase", disable=not self.show_progress) as bar:
            for name, body in steps:
                bar.set_postfix(phase=name)
                self._run_phase(name, body)
                bar.update(1)
                if name == stop_after:
                    return EvolutionResult([], [], self.folder.ledger(), stopped_after=name)
        generations = [self.generation_summary(g) for g in range(self.settings.merges)]
        final = roster_from_json(self.folder.read_json(FINAL_ROSTER))
        return EvolutionResult(final, generations, self.folder.ledger())

    # ------------------------------------------------------------------ phases
    def phase_profiles(self, initial: Callable[[], tuple[list[Persona], int]]) -> dict:
        before = self.llm.meter.total if self.llm is not None else None
        personas, tokens = initial()
        tokens = sum(tokens) if isinstance(tokens, (list, tuple)) else int(tokens)
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
        )

    def _fused_elsewhere(self, g: int, half: str) -> tuple[list[dict], dict]:
        """The per-cluster records of generation g and the summed usage of their `half`."""
        records = self.fuse_elsewhere(self.fusion_job(g))
        fields = ("prompt_tokens", "completion_tokens", "calls", "cached_calls", "total_tokens")
        return records, {k: sum(r["tokens"][half][k] for r in records) for k in fields}

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

    # ------------------------------------------------------------------ summaries
    def generation_summary(self, g: int) -> dict:
        clusters = self.folder.read_json(f"clusters_g{g}.json")
        fusion = self.folder.read_json(f"merge_g{g}.json")["outcomes"]
        return {
            "generation": g,
            "probes": len(clusters["probe_ids"]),
            "k": clusters["k"],
            "silhouette": clusters["silhouette"],
            "sizes": [len(m) for m in clusters["members"]],
            "next_probes": len(fusion),
            "invalid_merges": sum(not o["valid"] for o in fusion),
        }
