"""Per-user chronological splits and identity slices from user attributes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ctrlsim.data.dataset import Dataset
from ctrlsim.errors import ConfigError, DataError


@dataclass(frozen=True)
class ChronologicalSplit:
    """Interactions split per user by time: `fit`, `valid`, `test` (each sorted by time)."""

    fit: pd.DataFrame
    valid: pd.DataFrame
    test: pd.DataFrame
    fractions: tuple[float, float, float]


def chronological_split(dataset: Dataset, fractions: tuple[float, float, float] = (0.72, 0.08, 0.20),
                        *, min_rating: float | None = None) -> ChronologicalSplit:
    """Split every user's history in time order (PromptShift: 72% fit / 8% valid / 20% test).

    For a user with n interactions the fit part is the first round(f1 * n), the
    valid part ends at round((f1 + f2) * n), the rest is test. `min_rating`
    keeps only positives (e.g. 4 for MovieLens) before splitting.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
        raise ConfigError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    inter = dataset.interactions
    if min_rating is not None:
        inter = inter[inter["rating"] >= min_rating]
    pos = inter.groupby("user_id", sort=False).cumcount().to_numpy()
    n = inter.groupby("user_id", sort=False)["item_id"].transform("size").to_numpy()
    fit_end = np.rint(fractions[0] * n)
    valid_end = np.rint((fractions[0] + fractions[1]) * n)
    part = np.where(pos < fit_end, 0, np.where(pos < valid_end, 1, 2))
    fit, valid, test = (inter[part == k].reset_index(drop=True) for k in range(3))
    return ChronologicalSplit(fit, valid, test, (fractions[0], fractions[1], fractions[2]))


# Age groups for identity cues ("young adult", "middle-aged", "older"; PromptShift
# section 5.2). The paper gives no cut-offs; these follow the MovieLens-1M age
# brackets (1, 18, 25 | 35, 45 | 50, 56), so ML-1M bracket codes and raw ages
# (ml-100k, Last.fm) fall into the same groups. Users under 18 count as young adult.
AGE_GROUPS: tuple[tuple[str, int, int], ...] = (
    ("young adult", 0, 35),   # age < 35
    ("middle-aged", 35, 50),  # 35 <= age < 50
    ("older", 50, 200),       # age >= 50
)
GENDER_NAMES = {"M": "male", "F": "female"}
SCENARIOS = ("gender", "age", "gender_age")


def age_group(age) -> str | None:
    """The age group of an age (or ML-1M bracket code); None when unknown."""
    if age is None or pd.isna(age):
        return None
    for label, low, high in AGE_GROUPS:
        if low <= age < high:
            return label
    return None


def _slug(label: str) -> str:
    return label.replace(" ", "_").replace("-", "_")


def identity_slices(dataset: Dataset, scenario: str) -> pd.Series:
    """Each user's identity slice for a cue scenario, as a Series user_id -> slice id.

    Slice ids: "gender_M" / "gender_F"; "age_young_adult" / "age_middle_aged" /
    "age_older"; crossed "cross_F_young_adult" etc. Users whose attribute is
    missing are left out.
    """
    if scenario not in SCENARIOS:
        raise ConfigError(f"unknown identity scenario {scenario!r}; choose from {SCENARIOS}")
    users = dataset.users
    if users.empty:
        raise DataError(f"dataset {dataset.name!r} has no user attributes; identity slices need a user table")
    gender = users["gender"].where(users["gender"].isin(list(GENDER_NAMES)))
    ages = users["age"].map(age_group)
    if scenario == "gender":
        label = "gender_" + gender
    elif scenario == "age":
        label = "age_" + ages.map(lambda a: _slug(a) if a else None)
    else:
        label = "cross_" + gender + "_" + ages.map(lambda a: _slug(a) if a else None)
    out = pd.Series(label.to_numpy(), index=users["user_id"].to_numpy(), name=scenario).dropna()
    return out


def slice_members(slices: pd.Series) -> dict[str, set[str]]:
    """Slice id -> set of user ids."""
    return {g: set(idx) for g, idx in slices.groupby(slices).groups.items()}
