"""The evolution loop's methods for `ctrlsim ctrlbench` (§4.1 baselines 3-4, Appendix D.8).

  kmeans-fusion    K_large LLM persona probes, the same schedule, clusters of behaviour
                   trajectories (α = 0: liked items only), each cluster keeps its best member
                   by target likes; no debate, no merge
  ctrlbench        the full loop: interact, embed, cluster, debate, merge; then align
  ctrlbench-logic  the same super probes, evaluated with the long-tail decision prompt (D.8)

Options (`method_options[name]` in the ctrlbench config): merges, rounds_per_merge, k_rule,
alpha, encoder, temperature (default: the run's decision temperature, so a greedy run debates and
merges greedily too), and any other `EvolutionSettings` field. The loop's artefacts go
to a folder under $CTRLSIM_CACHE/ctrlbench/evolution named by everything that determines them,
so a rerun resumes there and ctrlbench-logic reuses ctrlbench's evolution instead of paying for
it again. The name also covers the code: a digest of every prompt text the probes and the loop
use (`prompt_texts`) and the code version (`ctrlsim.__version__`, `EVOLUTION_FORMAT`), so editing
a prompt never reuses old super probes. A run holds the folder's lock while it writes there
(`artefacts.locked_folder`); a second run on the same folder gets `RunLockedError`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path

from ctrlsim.atomic import atomic_write_text
from ctrlsim.errors import ConfigError

from .. import prompts as probe_prompts
from ..methods import MethodContext, MethodSpec, Population, register_method
from . import prompts as loop_prompts
from .artefacts import EVOLUTION_FORMAT, locked_folder
from .loop import EvolutionLoop, EvolutionSettings, decision_identity

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


PROMPT_MODULES = (probe_prompts, loop_prompts)


def prompt_texts() -> dict[str, str]:
    """Every module-level str constant (dunders aside) of the probes' and the loop's prompt modules,
    by "module.NAME", sorted by that name: what the evolution cache key hashes."""
    texts = {
        f"{module.__name__}.{name}": value
        for module in PROMPT_MODULES
        for name, value in vars(module).items()
        if isinstance(value, str) and not (name.startswith("__") and name.endswith("__"))
        and name not in getattr(module, "NOT_IN_EVOLUTION", ())
    }
    return dict(sorted(texts.items()))



def prompt_digest() -> str:
    """sha256 over `prompt_texts` (names and values)."""
    return hashlib.sha256(json.dumps(prompt_texts(), ensure_ascii=False).encode()).hexdigest()


def code_version() -> dict:
    import ctrlsim

    return {"ctrlsim": ctrlsim.__version__, "evolution_format": EVOLUTION_FORMAT}


def evolution_identity(context: MethodContext, settings: EvolutionSettings, encoder: str) -> dict:
    """Everything that determines an evolution's artefacts (what its folder name hashes)."""
    llm = context.llm()
    return {
        "dataset": context.dataset.name,
        "box": getattr(context.recommender, "identity", None),
        "target": list(context.target_tags),
        "seed": context.seed,
        "k": context.k_large,
        "slate": context.slate_size,
        "llm": llm.cache_identity(),
        "encoder": encoder,
        "settings": asdict(settings),
        "decisions": decision_identity(context.decision_settings),
        "profiles": asdict(context.profile_settings),
        "prompts": prompt_digest(),
        "code": code_version(),
    }


def evolution_folder(context: MethodContext, settings: EvolutionSettings, encoder: str) -> Path:
    """Where this (box, target, seed, K, LLM, settings, prompts, code) evolution keeps its artefacts;
    the folder's `identity.json` records what its name hashes."""
    from ctrlsim.backends.bundled import cache_dir

    identity = evolution_identity(context, settings, encoder)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    base = Path(context.work_dir) if context.work_dir is not None else cache_dir("ctrlbench", "evolution")
    folder = base / f"{settings.fusion}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "identity.json", json.dumps(identity, indent=2, default=str) + "\n")
    return folder


def evolve(context: MethodContext, *, fusion: str, prompt_variant: str = "default", **defaults) -> Population:
    """Run (or resume) the loop on the context's black box; the aligned super probes are the population."""
    from ctrlsim.envs import make_task

    # Debates and merges sample at the run's temperature (ctrlbench's --temperature: greedy by
    # default, 1.0 in the paper preset) unless the method's options name their own.
    defaults.setdefault("temperature", context.decision_settings.temperature)
    settings, encoder = settings_from_options(context.options, fusion=fusion, **defaults)
    task = make_task("target-discovery", context.recommender.dataset, target=list(context.target_tags))
    folder = evolution_folder(context, settings, encoder)
    with locked_folder(folder):  # one writer: a second run on this folder gets RunLockedError
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
        setup_unknown_calls=result.unknown_calls,
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
