"""Task 2's three level presets (Table 6, Appendix D.7): initial history, seed interests, target.

  Level-1  simple shaping       L_init = 3,  Romance 0.67, Thriller 0.67      -> target Action
  Level-2  multi-interest mix   L_init = 21, Action 0.52, Adventure 0.52      -> target Mixture
  Level-3  interest shift       L_init = 12, Romance 0.58, Thriller 0.33      -> target Action

(Mixture = Action, Adventure, Romance, War, Film-Noir, Thriller.) A fraction is the share of
the L_init seed items carrying that tag, so Level-1 needs 2 of 3 items with Romance and 2 of 3
with Thriller. The paper picks such probes among its super probes; here `level_history`
builds the seed history directly: round(fraction * L_init) items per tag, using items with
several of the tags only where the counts cannot fit otherwise (Level-1: one Romance-Thriller
item, one of each alone), no item with a target tag unless the target includes the seed tags
(Level-2), and filler items without any of these tags for the remaining slots. Items are drawn
from `rng` among the catalogue's candidates, so a seed fixes the history.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError

from ..persona import Persona

MIXTURE = ("Action", "Adventure", "Romance", "War", "Film-Noir", "Thriller")


@dataclass(frozen=True)
class LevelPreset:
    name: str
    l_init: int
    interests: Mapping[str, float]  # seed tag -> share of seed items with it
    target: tuple[str, ...]
    description: str = ""

    def counts(self) -> dict[str, int]:
        return {tag: int(round(share * self.l_init)) for tag, share in self.interests.items()}

    @property
    def excluded_tags(self) -> set[str]:
        """Target tags that are not seed tags: the seed history must not already hold them."""
        return set(self.target) - set(self.interests)


LEVELS: dict[str, LevelPreset] = {
    p.name: p
    for p in (
        LevelPreset(
            "level-1", 3, {"Romance": 0.67, "Thriller": 0.67}, ("Action",), "simple interest shaping"
        ),
        LevelPreset("level-2", 21, {"Action": 0.52, "Adventure": 0.52}, MIXTURE, "multi-interest balancing"),
        LevelPreset("level-3", 12, {"Romance": 0.58, "Thriller": 0.33}, ("Action",), "interest shift"),
    )
}


def get_level(name: str) -> LevelPreset:
    if name not in LEVELS:
        raise ConfigError(f"unknown level {name!r}; known: {', '.join(LEVELS)}")
    return LEVELS[name]


def level_history(dataset: Dataset, preset: LevelPreset, rng: np.random.Generator) -> list[str]:
    """A seed history of `preset.l_init` items matching the preset's tag counts (see module docstring)."""
    need = preset.counts()
    seed_tags = set(need)
    missing = sorted(seed_tags - set(dataset.tags))
    if missing:
        raise ConfigError(f"{preset.name}: tags {missing} are not in dataset {dataset.name!r}")
    tags = dataset.items["tags"].tolist()
    ids = dataset.item_ids
    excluded = preset.excluded_tags
    chosen: list[str] = []
    for slot in range(preset.l_init):
        left = preset.l_init - slot
        wanted = sorted((t for t in need if need[t] > 0), key=lambda t: (-need[t], t))
        if sum(need.values()) > left and len(wanted) >= 2:
            subset = set(wanted[:2])  # counts do not fit one tag per item: share an item
        elif wanted:
            subset = {wanted[0]}
        else:
            subset = set()  # filler: none of the seed tags
        candidates = [
            n
            for n, item_tags in enumerate(tags)
            if set(item_tags) & seed_tags == subset
            and not set(item_tags) & excluded
            and str(ids[n]) not in chosen
        ]
        if not candidates:
            raise ConfigError(
                f"{preset.name}: dataset {dataset.name!r} has no item with exactly the tags "
                f"{sorted(subset) or 'none of ' + str(sorted(seed_tags))} left to choose"
            )
        chosen.append(str(ids[candidates[int(rng.integers(len(candidates)))]]))
        for t in subset:
            need[t] -= 1
    return chosen


def level_persona(
    persona: Persona, dataset: Dataset, preset: LevelPreset, rng: np.random.Generator
) -> Persona:
    """`persona` with its behaviour replaced by a level's seed history (flagged with the level)."""
    return replace(
        persona,
        behaviour=tuple(level_history(dataset, preset, rng)),
        flags=persona.flags + (f"task2_{preset.name}",),
    )
