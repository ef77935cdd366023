"""The evolutionary training loop (CtrlBench-Rec §3.2 Phase I, Algorithm 1, Appendix C).

    profiles -> [interact E_i rounds -> embed -> cluster -> debate -> merge] x E_m -> align

Each phase is a method (`phases.EvolutionPhases`, which `EvolutionLoop` inherits) that reads the
previous phase's artefacts and writes its own before the next starts; the ledger entry written
last marks it finished (see `artefacts`). This module is the driver: the schedule
(`EvolutionSettings`), the order of the phases, the ledger and resuming. A killed run resumes at
the first unfinished phase, and a phase cut short mid-way replays its LLM calls from the
response cache of the LLM it is given (`load_llm(spec, cache=...)`), so no call is paid twice.
Artefacts per generation g (g = 0 is the initial population):

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

from ctrlsim.errors import ConfigError

from ..persona import Persona
from ..prompts import domain_nouns
from .artefacts import FINAL_ROSTER, ArtefactFolder, roster_from_json, roster_to_json
from .cluster_unit import FusionJob
from .cluster_unit import usage_delta as _usage_delta
from .phases import EvolutionPhases
from .settings import FUSIONS, EvolutionSettings


def decision_identity(settings) -> dict:
    """The decision settings as an evolution's identity holds them: `negative_feedback` only when on
    (an evolution plays like-only; identities from before the option stay as they were)."""
    data = asdict(settings)
    if not data.get("negative_feedback"):
        data.pop("negative_feedback", None)
    return data

DEFAULT_SETTINGS = EvolutionSettings()  # frozen: one shared default is safe

__all__ = [
    "FINAL_ROSTER",
    "FUSIONS",
    "EvolutionLoop",
    "EvolutionResult",
    "EvolutionSettings",
    "roster_from_json",
    "roster_to_json",
]

@dataclass
class EvolutionResult:
    final: list[Persona]
    generations: list[dict]  # per generation: sizes, k, silhouette, fusion counts
    phases: dict[str, dict] = field(default_factory=dict)
    stopped_after: str | None = None

    @property
    def tokens(self) -> int:
        return sum(int(p.get("tokens", {}).get("total_tokens", 0)) for p in self.phases.values())

    @property
    def unknown_calls(self) -> int:
        """Calls of the phases without reported token counts (`tokens` is then a lower bound)."""
        return sum(int(p.get("tokens", {}).get("unknown_calls", 0)) for p in self.phases.values())


class EvolutionLoop(EvolutionPhases):
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
        settings: EvolutionSettings = DEFAULT_SETTINGS,
        decision_settings=None,
        seed: int = 0,
        slate_size: int = 3,
        show_progress: bool = False,
        fuse_elsewhere: Callable[[FusionJob], list[dict]] | None = None,
        identity: dict | None = None,
    ):
        """`fuse_elsewhere(job)`: runs one generation's debate and merge cluster by cluster
        (`cluster_unit.fuse_cluster` records, in cluster order), e.g. on an executor's workers;
        by default the clusters debate and merge together here, one batched call per round.
        `identity`: what else the phases depend on (the caller's config: the initial roster's size,
        the box, the LLM); with the loop's own settings it binds the folder's ledger, so phases of
        another run are never reused."""
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
        self.folder.bind({
            "settings": asdict(settings), "decisions": decision_identity(self.decision_settings),
            "seed": seed,
            "slate_size": slate_size, "target_tags": sorted(self.target_tags),
            "dataset": getattr(dataset, "name", None), **(identity or {})})

    # ------------------------------------------------------------------ plumbing
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

    # ------------------------------------------------------------------ summaries
    def generation_summary(self, g: int) -> dict:
        """Sizes, k and silhouette of generation g's clustering, and what fusion made of it:
        `invalid_merges` (outcomes not valid, filters included), `merge_fallbacks` (merges whose
        retry failed too, so the cluster is its best member, flagged `FLAG_MERGE_FALLBACK`) and
        `target_items_added` (target items the merge added back; 0 unless `force_target_items`)."""
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
            # Counted from the outcomes, not the persona flags: a flag is inherited by the next
            # generation's fallback from the same persona, so flags would count it twice.
            "merges": sum(o["kind"] == "merge" for o in fusion),
            "merge_fallbacks": sum(o["kind"] == "merge" and not o["valid"] for o in fusion),
            "target_items_added": sum(len(o.get("added_target_items", ())) for o in fusion),
        }
