"""`ctrlsim controls`: do the controls a box declares do what they claim?

A box (in-process, or an HTTP service through `GET /controls`) may declare user-settable controls,
each with the property it claims to move ("diversity: 0-1, more diverse slates"), and a mode not
based on profiling. This runner checks every claim against the box's own slates, the way an
auditor preparing evidence for a regulator would (Digital Services Act Art. 27: options to modify
the main parameters; Art. 38: a recommender option not based on profiling):

  units    `<box>|control=<name>|value=<v>|seed=<N>`: the same personas (`users` sampled users, each with
           their first `history` liked items) get slates with the control at v and every other
           setting at its default; the claimed property is measured on each slate.
           `<box>|non-profiled|seed=<N>`: the same personas in the non-profiled mode and in the default
           mode; for each persona, the slate distance (1 - Jaccard) to the most different persona
           of the sample (tag profiles, cosine) and to a random one.
  tables   per control: the property at each value, Spearman's rho between value and property with
           a bootstrap interval over personas, the adjacent steps told apart, and the verdict:
           PASS where the interval excludes 0 on the claimed side. Non-profiled: the extreme-pair
           minus random-pair distance in both modes; PASS where the non-profiled mode shows no
           excess (its interval reaches 0) while the profiled mode does (the check has power).

Docs: docs/controls.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import MAX_ITEMS, MAX_SEED, MAX_SLATE, MAX_USERS, check_fields, option

DEFAULT_OUT = "results/controls"
NON_PROFILED = "non-profiled"
SMOKE_PRESET: dict = {"boxes": ("reference-controls",), "users": 6, "points": 3, "seeds": (0,)}
PRESETS = {"smoke": SMOKE_PRESET}


@dataclass(frozen=True)
class ControlsConfig:
    """One check of a box's declared controls (config.json)."""

    boxes: tuple[str, ...] = option(("reference-controls",), "the boxes whose declared controls are checked: "
                                    "make_recommender names, dial specs or http(s):// services speaking "
                                    "contract 2 (GET /controls)")
    users: int = option(20, "personas per seed (sampled users with enough liked items)", low=3,
                        high=MAX_USERS)
    history: int = option(10, "liked items in each persona's history (the user's first ones)", low=1,
                          high=MAX_ITEMS)
    points: int = option(5, "values tried over a numeric control's range (every choice of a choice control)",
                         low=2, high=21)
    seeds: tuple[int, ...] = option((0, 1), "seeds (which users are sampled)", low=0, high=MAX_SEED)
    slate_size: int = option(10, "items per slate", low=1, high=MAX_SLATE)
    dataset: str = option("ml-100k", "dataset name or path")

    def __post_init__(self):
        check_fields(self)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")
        from ctrlsim.experiments.config import check_choices
        from ctrlsim.recommenders.registry import check_recommender_name

        check_choices("boxes", self.boxes, self.boxes)  # at least one, none twice
        for box in self.boxes:
            if not isinstance(box, str) or not box.strip() or "|" in box:
                raise ConfigError(f"boxes: {box!r} is empty or contains '|'")
            check_recommender_name(box)


@dataclass(frozen=True)
class ControlUnit:
    """One unit: a box's control at one value (`control` None: the non-profiled check) for one seed."""

    box: str
    control: str | None
    value: object
    seed: int

    @property
    def key(self) -> str:
        if self.control is None:
            return f"{self.box}|{NON_PROFILED}|seed={self.seed}"
        return f"{self.box}|control={self.control}|value={self.value}|seed={self.seed}"
