"""`EvolutionSettings`: the loop's schedule and knobs (the loop and its phases both read them)."""
from __future__ import annotations

from dataclasses import dataclass

from ctrlsim.errors import ConfigError

from .clustering import K_RULES
from .embedding import DEFAULT_ALPHA

FUSIONS = ("debate-merge", "select-best")


@dataclass(frozen=True)
class EvolutionSettings:
    """The schedule and every knob of the loop (Appendix C defaults).

    merges (E_m), rounds_per_merge (E_i): fuse every E_i interaction rounds, E_m times.
    k_rule: "halve" (k = ceil(N/2)) or "silhouette" (best k in [N/2, 3N/4]).
    alpha: weight of the bio in V = α·enc(bio) + (1−α)·mean(enc(liked items)).
    fusion: "debate-merge" (CtrlBench-Rec) or "select-best" (KMeans-Fusion).
    force_target_items: False (default, the paper's public code): the merge prompt asks the model
        to keep target-tag items as much as possible and the behaviour is what it kept. True: every
        member target item the model dropped is added back (the rule this loop applied before;
        each generation's summary counts the items added, `target_items_added`).
    """

    merges: int = 2
    rounds_per_merge: int = 2
    k_rule: str = "halve"
    alpha: float = DEFAULT_ALPHA
    fusion: str = "debate-merge"
    kmeans_n_init: int = 5
    debate_max_tokens: int = 96  # a turn states preferences and a few items; small models ramble on
    merge_max_tokens: int = 384
    temperature: float = 0.7
    debate_behaviour_items: int = 8
    align_min_behaviour: int = 4
    force_target_items: bool = False

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
        if not isinstance(self.force_target_items, bool):
            raise ConfigError(f"force_target_items must be true or false, got {self.force_target_items!r}")
