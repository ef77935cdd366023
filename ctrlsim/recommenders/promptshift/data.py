"""PromptShift's data preparation (Gan & Dong, sections 4.2 and 5.1): split, slices, slice table.

Everything PromptShift derives from a dataset before any LLM runs: the
per-user chronological 72/8/20 split into fit / validation / test, the
positives of each part, the eligible users, the prompt histories H_u, the
identity slices of every cue scenario and the identity-slice-by-item table
built from fit positives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import pandas as pd

from ctrlsim.data.dataset import Dataset
from ctrlsim.data.matching import display_title, track_display
from ctrlsim.data.splits import SCENARIOS, chronological_split, identity_slices
from ctrlsim.errors import ConfigError, UnknownUserError
from ctrlsim.metrics.promptshift import SliceTable, mainstreamness, scenario_mainstreamness

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


# The one definition of PromptShift's positives: a rating >= 4 on explicit feedback, >= 2 plays on
# listening data (Last.fm). `AUTO` picks between them from the dataset; None counts every interaction.
MOVIE_POSITIVE, PLAY_POSITIVE = 4.0, 2.0
AUTO = "auto"


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


@dataclass(eq=False)
class PromptShiftData:
    """Everything PromptShift derives from the dataset, built once (no LLM involved).

    Interactions are split per user in time order into fit / valid / test
    (72/8/20); positives are interactions whose `rating` (a rating, or a play
    count for implicit feedback) is >= `positive_threshold` within each part
    (`AUTO`, the default: `default_positive_threshold`; None: every
    interaction is positive). Eligible users have >= `min_fit_positives` fit
    positives, >= 1 test positive and an identity slice in every scenario
    (section 5.1). The prompt history H_u is the user's last `history_len`
    fit positives, oldest first. The slice table is built from all users' fit
    positives over the slices of every scenario.
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
              positive_threshold: float | str | None = AUTO, history_len: int = 25,
              min_fit_positives: int = 25,
              fractions: tuple[float, float, float] = (0.72, 0.08, 0.20)) -> "PromptShiftData":
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

    def check_user(self, user: str) -> str:
        user = str(user)
        if user not in self.fit_positives:
            raise UnknownUserError(f"user {user!r} has no fit positives in {self.dataset.name!r}")
        return user

    def check_eligible(self, users: Iterable[str]) -> list[str]:
        """`users` as strings; any user who is not eligible raises `ConfigError` naming it."""
        wanted = [str(u) for u in users]
        eligible = set(self.eligible)
        bad = [u for u in wanted if u not in eligible]
        if bad:
            raise ConfigError(f"users not eligible for PromptShift: {bad[:5]}")
        return wanted

    def history(self, user: str) -> list[str]:
        """H_u: the last `history_len` fit positives, oldest first."""
        return self.fit_positives[self.check_user(user)][-self.history_len:]

    def history_titles(self, user: str) -> list[str]:
        return prompt_titles(self.dataset, self.history(user))

    def slice_of(self, user: str, scenario: str) -> str:
        try:
            return str(self.slices[scenario][str(user)])
        except KeyError:
            raise ConfigError(f"user {user!r} has no identity slice in scenario {scenario!r}") from None

    def mainstreamness(self, user: str, scenario: str) -> float:
        """phi_bar_u over H_u in the user's slice of `scenario`."""
        return mainstreamness(self.table, self.history(user), self.slice_of(user, scenario))

    def scenario_means(self, users: Iterable[str]) -> dict[str, float]:
        """phi_bar_s per scenario: the mean of phi_bar_u over the users U_s who run it (section 4.4)."""
        users = list(users)
        return {s: scenario_mainstreamness(self.mainstreamness(u, s) for u in users) for s in self.scenarios}

    def slice_means(self, users: Iterable[str]) -> dict[str, float]:
        """Slice id -> phi_bar_s of its scenario over `users` (what B3 compares phi_bar_u with)."""
        means = self.scenario_means(users)
        return {g: means[scenario_of_slice(g)] for g in self.slice_names if scenario_of_slice(g) in means}

    def positives(self, user: str, part: str = "test") -> set[str]:
        """The user's held-out positives of the validation or test part."""
        if part not in PARTS:
            raise ConfigError(f"part must be one of {PARTS}, got {part!r}")
        source = self.test_positives if part == "test" else self.valid_positives
        return set(source.get(str(user), set()))


__all__ = ["PARTS", "PromptShiftData", "SCENARIO_OF_PREFIX", "is_music", "prompt_titles", "scenario_of_slice"]
