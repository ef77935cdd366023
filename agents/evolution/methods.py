"""The evolution loop's methods for `ctrlsim ctrlbench` (§4.1 baselines 3-4, Appendix D.8).

  kmeans-fusion    K_large LLM persona probes, the same schedule, clusters of behaviour
                   trajectories (α = 0: liked items only), each cluster keeps its best member
                   by target likes; no debate, no merge
  ctrlbench        the full loop: interact, embed, cluster, debate, merge; then align
  ctrlbench-logic  the same super probes, evaluated with the long-tail decision prompt (D.8)

Options (`method_options[name]` in the ctrlbench config): merges, rounds_per_merge, k_rule,
alpha, encoder, temperature, and any other `EvolutionSettings` field. The loop's artefacts go
to a folder under $CTRLSIM_CACHE/ctrlbench/evolution named by everything that determines them,
so a rerun resumes there and ctrlbench-logic reuses ctrlbench's evolution instead of paying for
it again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path

from ctrlsim.errors import ConfigError

from ..methods import MethodContext, MethodSpec, Population, register_method
from .loop import EvolutionLoop, EvolutionSettings

SETTING_NAMES = {f.name for f in fields(EvolutionSettings)}


def settings_from_options(options: dict, **defaults) -> tuple[EvolutionSettings, str]:
    """(EvolutionSettings, encoder spec) from a method's options; unknown keys are an error."""
    options = dict(options)
    encoder = options.pop("encoder", "minilm")
    unknown = sorted(set(options) - SETTING_NAMES)
    if unknown:
        raise ConfigError(
            f"unknown evolution option(s) {unknown}; known: encoder, {', '.join(sorted(SETTING_NAMES))}"
        )
    return EvolutionSettings(**{**defaults, **options}), encoder


def evolution_folder(context: MethodContext, settings: EvolutionSettings, encoder: str) -> Path:
    """Where this (box, target, seed, K, LLM, settings) evolution keeps its artefacts."""
    from ctrlsim.backends.bundled import cache_dir

    llm = context.llm()
    identity = {
        "dataset": context.dataset.name,
        "box": getattr(context.recommender, "identity", None),
        "target": list(context.target_tags),
        "seed": context.seed,
        "k": context.k_large,
        "slate": context.slate_size,
        "llm": llm.cache_identity(),
        "encoder": encoder,
        "settings": asdict(settings),
        "decisions": asdict(context.decision_settings),
        "profiles": asdict(context.profile_settings),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    base = Path(context.work_dir) if context.work_dir is not None else cache_dir("ctrlbench", "evolution")
    folder = base / f"{settings.fusion}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "identity.json").write_text(json.dumps(identity, indent=2, default=str) + "\n")
    return folder


def evolve(context: MethodContext, *, fusion: str, prompt_variant: str = "default", **defaults) -> Population:
    """Run (or resume) the loop on the context's black box; the aligned super probes are the population."""
    from ctrlsim.envs import make_task

    settings, encoder = settings_from_options(context.options, fusion=fusion, **defaults)
    task = make_task("target-discovery", context.recommender.dataset, target=list(context.target_tags))
    folder = evolution_folder(context, settings, encoder)
    loop = EvolutionLoop(
        folder,
        dataset=context.dataset,
        recommender=context.recommender,
        task=task,
        llm=context.llm(),
        encoder=encoder,
        settings=settings,
        decision_settings=context.decision_settings,
        seed=context.seed,
        slate_size=context.slate_size,
        show_progress=context.show_progress,
    )
    result = loop.run(lambda: context.base_personas(context.k_large))
    return Population(
        tuple(result.final),
        "llm",
        prompt_variant=prompt_variant,
        setup_tokens=result.tokens,
        artefacts={
            "evolution_folder": str(folder),
            "generations": result.generations,
            "phase_seconds": {k: v.get("seconds") for k, v in result.phases.items()},
        },
    )


def build_kmeans_fusion(context: MethodContext) -> Population:
    return evolve(context, fusion="select-best", alpha=0.0)


def build_ctrlbench(context: MethodContext) -> Population:
    return evolve(context, fusion="debate-merge")


def build_ctrlbench_logic(context: MethodContext) -> Population:
    return evolve(context, fusion="debate-merge", prompt_variant="logic")


register_method(
    MethodSpec(
        "kmeans-fusion",
        "KMeans-Fusion",
        build_kmeans_fusion,
        True,
        "K_large probes, same schedule, K-means on behaviour, best member per cluster kept",
    )
)
register_method(
    MethodSpec(
        "ctrlbench",
        "CtrlBench-Rec",
        build_ctrlbench,
        True,
        "K_large probes evolved by E_m cluster-debate-merge fusions, then aligned",
    )
)
register_method(
    MethodSpec(
        "ctrlbench-logic",
        "CtrlBench-Rec (Logic)",
        build_ctrlbench_logic,
        True,
        "CtrlBench-Rec's super probes with the long-tail decision prompt (Appendix D.8)",
    )
)
