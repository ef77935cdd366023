"""CtrlBench-Rec's evolutionary loop: interact, embed, cluster, debate, merge, align (one module a phase).

`EvolutionLoop(folder, ...).run(initial)` runs or resumes the loop; `EvolutionSettings` holds the
schedule (E_m merges, E_i rounds per merge, k rule, α, fusion). See docs/evolution.md.
"""

from .clustering import Clustering, cluster_population
from .embedding import probe_vectors
from .loop import FINAL_ROSTER, EvolutionLoop, EvolutionResult, EvolutionSettings, roster_from_json

__all__ = [
    "FINAL_ROSTER",
    "Clustering",
    "EvolutionLoop",
    "EvolutionResult",
    "EvolutionSettings",
    "cluster_population",
    "probe_vectors",
    "roster_from_json",
]
