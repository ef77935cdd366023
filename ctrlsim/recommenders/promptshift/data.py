"""PromptShift's data preparation (Gan & Dong, sections 4.2 and 5.1): split, slices, users.

Everything PromptShift derives from a dataset before any LLM runs: the
per-user chronological 72/8/20 split into fit / validation / test, the
positives of each part, the eligible users, the prompt histories H_u, the
identity slices of every cue scenario, the identity-slice-by-item table
built from fit positives, and the seeded user sample. Each user's part of it
is asked for once, as a `UserProfile` (`PromptShiftData.user`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ctrlsim.data.dataset import Dataset
from ctrlsim.data.matching import display_title, track_display
from ctrlsim.data.splits import SCENARIOS, chronological_split, identity_slices
from ctrlsim.errors import ConfigError, UnknownUserError
from ctrlsim.metrics.promptshift import SliceTable, mainstreamness, scenario_mainstreamness
from ctrlsim.recommenders.promptshift.defaults import (
    AUTO,
    FRACTIONS,
    HISTORY_LEN,
    MIN_FIT_POSITIVES,
    MOVIE_POSITIVE,
    PLAY_POSITIVE,
)
from ctrlsim.seeding import derive_rng

# Slice-id prefix -> the identity-cue scenario it belongs to ("cross_F_older" -> "gender_age").
SCENARIO_OF_PREFIX = {"gender": "gender", "age": "age", "cross": "gender_age"}
PARTS = ("valid", "test")


def scenario_of_slice(slice_id: str) -> str:
    """"gender_F" -> "gender", "age_older" -> "age", "cross_F_older" -> "gender_age"."""
    prefix = slice_id.partition("_")[0]
    if prefix not in SCENARIO_OF_PREFIX:
        raise ConfigError(f"slice id {slice_id!r} belongs to no identity scenario")
    return SCENARIO_OF_PREFIX[prefix]


def is_music(dataset: Dataset) -> bool:
    """Track catalogues (Last.fm) carry an `artist` column; movie catalogues do not."""
    return "artist" in dataset.items.columns


def default_positive_threshold(dataset: Dataset) -> float:
    """The positive threshold PromptShift uses on `dataset` unless told otherwise."""
    return PLAY_POSITIVE if is_music(dataset) else MOVIE_POSITIVE


def prompt_titles(dataset: Dataset, item_ids: Sequence[str]) -> list[str]:
    """How items are written in a prompt: "Title (Year)" for movies, "Artist - Title" for tracks."""
    items, rows = dataset.items, dataset.indices(item_ids)
    if is_music(dataset):
        return [track_display(t, a) for t, a in zip(items["title"].to_numpy()[rows],
                                                     items["artist"].to_numpy()[rows])]
    return [display_title(t, y) for t, y in zip(items["title"].to_numpy()[rows],
                                                 items["year"].to_numpy()[rows])]


@dataclass(frozen=True, eq=False)
class UserProfile:
    """Everything the protocol reads about one user, built once by `PromptShiftData.user`.

    `history` is H_u (item ids, oldest first) and `history_titles` how the
    prompt writes it; `slices` maps each scenario in which the user has an
    identity slice to its id, and `mainstreamness` to phi_bar_u, the mean
    phi(i, g_u) over H_u in that slice; `valid` and `test` are the held-out
    positives of the two parts.
    """

    user: str
    history: tuple[str, ...]
    history_titles: tuple[str, ...]
    slices: Mapping[str, str]
    mainstreamness: Mapping[str, float]
    valid: frozenset[str]
    test: frozenset[str]

    def slice_of(self, scenario: str) -> str:
        try:
            return self.slices[scenario]
        except KeyError:
            raise ConfigError(f"user {self.user!r} has no identity slice in scenario {scenario!r}") from None

    def positives(self, part: str = "test") -> set[str]:
        """The user's held-out positives of the validation or test part."""
        if part not in PARTS:
            raise ConfigError(f"part must be one of {PARTS}, got {part!r}")
        return set(self.test if part == "test" else self.valid)


@dataclass(eq=False)
class PromptShiftData:
    """Everything PromptShift derives from the dataset, built once (no LLM involved).

    Interactions are split per user in time order into fit / valid / test
    (`FRACTIONS`, 72/8/20); positives are interactions whose `rating` (a
    rating, or a play count for implicit feedback) is >= `positive_threshold`
    within each part (`AUTO`, the default: `default_positive_threshold`; None:
    every interaction is positive). Eligible users have >= `min_fit_positives`
    fit positives, >= 1 test positive and an identity slice in every scenario
    (section 5.1). The prompt history H_u is the user's last `history_len`
    fit positives, oldest first. The slice table is built from all users' fit
    positives over the slices of every scenario. A user's share of all this is
    asked for in one call, `user(user_id)`.
    """

    dataset: Dataset
    scenarios: tuple[str, ...]
    positive_threshold: float | None
    history_len: int
    min_fit_positives: int
    fractions: tuple[float, float, float]
    slices: dict[str, pd.Series]
    table: SliceTable
    fit_positives: dict[str, list[str]]
    valid_positives: dict[str, set[str]]
    test_positives: dict[str, set[str]]
    eligible: list[str]

    @classmethod
    def build(cls, dataset: Dataset, *, scenarios: Sequence[str] = SCENARIOS,
              positive_threshold: float | str | None = AUTO, history_len: int = HISTORY_LEN,
              min_fit_positives: int = MIN_FIT_POSITIVES,
              fractions: tuple[float, float, float] = FRACTIONS) -> "PromptShiftData":
        scenarios = tuple(scenarios)
        if positive_threshold == AUTO:
            positive_threshold = default_positive_threshold(dataset)
        elif isinstance(positive_threshold, str):
            raise ConfigError(f"positive_threshold must be a number, None or {AUTO!r}, "
                              f"got {positive_threshold!r}")
        if len(fractions) != 3:
            raise ConfigError(f"fractions must be three numbers (fit, valid, test), got {fractions}")
        fractions = (float(fractions[0]), float(fractions[1]), float(fractions[2]))
        if not scenarios or any(s not in SCENARIOS for s in scenarios):
            raise ConfigError(f"scenarios must be a non-empty subset of {SCENARIOS}, got {scenarios}")
        if history_len < 1:
            raise ConfigError(f"history_len must be >= 1, got {history_len}")
        split = chronological_split(dataset, fractions)

        def positives(frame: pd.DataFrame) -> pd.DataFrame:
            return frame if positive_threshold is None else frame[frame["rating"] >= positive_threshold]

        fit, valid, test = positives(split.fit), positives(split.valid), positives(split.test)
        fit_pos = {u: g["item_id"].tolist() for u, g in fit.groupby("user_id", sort=False)}
        valid_pos = {u: set(g["item_id"]) for u, g in valid.groupby("user_id", sort=False)}
        test_pos = {u: set(g["item_id"]) for u, g in test.groupby("user_id", sort=False)}
        slices = {s: identity_slices(dataset, s) for s in scenarios}
        memberships: dict[str, list[str]] = {}
        for s in scenarios:
            for g, users in slices[s].groupby(slices[s]).groups.items():
                memberships[str(g)] = [str(u) for u in users]
        all_users = set(dataset.users["user_id"]) | set(dataset.user_ids)
        table = SliceTable.build(fit["user_id"].to_numpy(), fit["item_id"].to_numpy(),
                                 dict(sorted(memberships.items())), list(dataset.item_ids),
                                 all_users=all_users)
        in_all = set.intersection(*(set(slices[s].index) for s in scenarios))
        need = max(min_fit_positives, 1)
        eligible = [u for u in dataset.user_ids
                    if len(fit_pos.get(u, ())) >= need and test_pos.get(u) and u in in_all]
        return cls(dataset, scenarios, positive_threshold, int(history_len), int(min_fit_positives),
                   fractions, slices, table, fit_pos, valid_pos, test_pos, eligible)

    @property
    def config(self) -> dict:
        return {"dataset": self.dataset.name, "scenarios": list(self.scenarios),
                "positive_threshold": self.positive_threshold, "history_len": self.history_len,
                "min_fit_positives": self.min_fit_positives, "fractions": list(self.fractions)}

    @property
    def domain(self) -> str:
        """"music" for track catalogues, else "movies" (picks the prompts and the title format)."""
        return "music" if is_music(self.dataset) else "movies"

    @property
    def slice_names(self) -> tuple[str, ...]:
        """Slice ids in the order of the observation's `slice` index (the table's columns, "*" excluded)."""
        return self.table.slice_ids[:-1]

    def check_eligible(self, users: Iterable[str]) -> list[str]:
        """`users` as strings; any user who is not eligible raises `ConfigError` naming it."""
        wanted = [str(u) for u in users]
        eligible = set(self.eligible)
        bad = [u for u in wanted if u not in eligible]
        if bad:
            raise ConfigError(f"users not eligible for PromptShift: {bad[:5]}")
        return wanted

    def user(self, user: str) -> UserProfile:
        """The user's `UserProfile`; a user without fit positives raises `UnknownUserError`."""
        user = str(user)
        if user not in self.fit_positives:
            raise UnknownUserError(f"user {user!r} has no fit positives in {self.dataset.name!r}")
        history = tuple(self.fit_positives[user][-self.history_len:])
        slices = {s: str(self.slices[s][user]) for s in self.scenarios if user in self.slices[s].index}
        return UserProfile(
            user, history, tuple(prompt_titles(self.dataset, history)), slices,
            {s: mainstreamness(self.table, history, g) for s, g in slices.items()},
            frozenset(self.valid_positives.get(user, ())), frozenset(self.test_positives.get(user, ())))

    def scenario_means(self, profiles: Iterable[UserProfile]) -> dict[str, float]:
        """phi_bar_s per scenario: the mean of phi_bar_u over the users U_s who run it (section 4.4)."""
        profiles = list(profiles)
        return {s: scenario_mainstreamness(p.mainstreamness[s] for p in profiles) for s in self.scenarios}

    def slice_means(self, scenario_means: Mapping[str, float]) -> dict[str, float]:
        """Slice id -> phi_bar_s of its scenario (what B3 compares phi_bar_u with)."""
        return {g: scenario_means[scenario_of_slice(g)] for g in self.slice_names
                if scenario_of_slice(g) in scenario_means}


# ------------------------------------------------------------------- sample
def sample_users(data: PromptShiftData, n_users: int, seed: int) -> list[str]:
    """Scenario-stratified sample (strata: gender-age slices) of eligible users, fixed by `seed`.

    One user from every stratum first (when `n_users` allows), the rest in
    proportion to stratum size; the processing order is seeded too.
    """
    cross = identity_slices(data.dataset, "gender_age")
    strata: dict[str, list[str]] = {}
    for u in data.eligible:
        strata.setdefault(str(cross.get(u, "none")), []).append(u)
    names = sorted(strata)
    n = min(n_users, len(data.eligible))
    sizes = np.array([len(strata[g]) for g in names], dtype=float)
    alloc = np.zeros(len(names), dtype=int)
    if n >= len(names):
        alloc += 1
    rest = n - alloc.sum()
    if rest > 0:
        share = sizes / sizes.sum() * rest
        alloc += np.floor(share).astype(int)
        left = n - alloc.sum()
        for j in np.argsort(-(share - np.floor(share)), kind="stable")[:left]:
            alloc[j] += 1
    rng = derive_rng(seed, "promptshift-users")
    chosen = []
    for g, a in zip(names, alloc):
        members = strata[g]
        a = min(int(a), len(members))
        chosen += [members[i] for i in sorted(rng.choice(len(members), size=a, replace=False))]
    # Top up (only when a stratum was too small) and fix a seeded processing order.
    spare = [u for u in data.eligible if u not in set(chosen)]
    if len(chosen) < n:
        chosen += [spare[i] for i in rng.choice(len(spare), size=n - len(chosen), replace=False)]
    return [chosen[i] for i in rng.permutation(len(chosen))]


__all__ = ["PARTS", "PromptShiftData", "SCENARIO_OF_PREFIX", "UserProfile", "default_positive_threshold",
           "is_music", "prompt_titles", "sample_users", "scenario_of_slice"]
