"""The `Dataset`: items, interactions and users as validated pandas tables.

Item and user ids are strings everywhere in the public API. `Dataset` is built
by the loaders through `Dataset.build`, which normalises column types, sorts
interactions by time, computes popularity and item text, and checks ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ctrlsim.data._io import AGE_RANGE, TIMESTAMP_RANGE, YEAR_RANGE, first_bad_number
from ctrlsim.errors import (
    DataError,
    EmptyHistoryError,
    UnknownItemError,
    UnknownUserError,
)

ITEM_COLUMNS = ("item_id", "title", "year", "text", "tags", "popularity")
INTERACTION_COLUMNS = ("user_id", "item_id", "rating", "timestamp")
USER_COLUMNS = ("user_id", "age", "gender", "occupation")


def item_text(title: str, year, tags: Sequence[str], description: str = "") -> str:
    """The text that text-based recommenders read: "Title (Year), (Tag1, Tag2)".

    This is CtrlBench-Rec's item text ("title, (genres)") with the year added,
    followed by the description where one is known.
    """
    head = str(title)
    if year is not None and not pd.isna(year) and str(year) != "":
        head += f" ({int(year)})"
    if tags:
        head += f", ({', '.join(tags)})"
    if description:
        head += f". {description}"
    return head


def _numbers(name: str, table: pd.DataFrame, column: str, key: str, *, words_are_missing: bool = False,
             **limits) -> pd.Series:
    """`table[column]` as checked numbers (see `first_bad_number`); `DataError` names the row's `key`.

    With `words_are_missing` a value that is not a number counts as missing (e.g. year "unknown").
    """
    raw = table[column]
    values = pd.to_numeric(raw, errors="coerce")
    if words_are_missing:
        raw = raw.where(values.notna())
    bad = first_bad_number(raw, values, missing_ok=words_are_missing, **limits)
    if bad is not None:
        row, reason = bad
        raise DataError(f"dataset {name!r}: {column}={raw.iloc[row]!r} ({key} {table[key].iloc[row]!r}) "
                        f"{reason}")
    return values


def _item_texts(items: pd.DataFrame) -> list[str]:
    desc = items["description"].fillna("") if "description" in items else [""] * len(items)
    return [item_text(t, y, g, d) for t, y, g, d in zip(items["title"], items["year"], items["tags"], desc)]


@dataclass(eq=False)
class Dataset:
    """A recommendation dataset.

    Attributes:
        name: a short name ("ml-100k", or the folder/file stem).
        items: `item_id` (str), `title`, `year` (Int64, may be missing), `text`,
            `tags` (tuple of str), `popularity` (distinct users who interacted),
            plus `description` where a description table was attached.
        interactions: `user_id`, `item_id` (str), `rating` (float), `timestamp`
            (int seconds), sorted by time (stable within equal timestamps).
        users: `user_id` (str), `age` (Int64), `gender` ("M"/"F" or missing),
            `occupation`; empty when the source has no user table.
        item_tags: long table `item_id`, `tag`, `kind` ("genre", "trigger", ...)
            behind `items.tags`, so side tables can add tags of another kind.
        source: where the data came from (paths), recorded with every result.
    """

    name: str
    items: pd.DataFrame
    interactions: pd.DataFrame
    users: pd.DataFrame
    item_tags: pd.DataFrame
    source: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ build
    @classmethod
    def build(
        cls,
        name: str,
        items: pd.DataFrame,
        interactions: pd.DataFrame,
        users: pd.DataFrame | None = None,
        *,
        source: dict | None = None,
        tag_kind: str = "genre",
    ) -> "Dataset":
        """Normalise and validate raw tables (columns as in the class docstring).

        `items` needs `item_id`, `title`, optional `year`, `tags` (iterables),
        `description`. Raises `DataError` for duplicate or unknown ids.
        """
        items = items.copy()
        items["item_id"] = items["item_id"].astype(str)
        dup = items["item_id"][items["item_id"].duplicated()]
        if len(dup):
            raise DataError(f"{name}: duplicate item ids: {list(dup.unique()[:5])}")
        if "year" not in items:
            items["year"] = pd.NA
        items["year"] = _numbers(name, items, "year", "item_id", words_are_missing=True, integer=True,
                                 low=YEAR_RANGE[0], high=YEAR_RANGE[1]).astype("Int64")
        if "tags" not in items:
            items["tags"] = [()] * len(items)
        items["tags"] = [tuple(str(t) for t in tags) if tags is not None else () for tags in items["tags"]]
        items["title"] = items["title"].fillna("").astype(str)

        inter = interactions.copy()
        inter["user_id"] = inter["user_id"].astype(str)
        inter["item_id"] = inter["item_id"].astype(str)
        if "rating" not in inter:
            inter["rating"] = 1.0
        inter["rating"] = _numbers(name, inter, "rating", "item_id").astype(float)
        inter["timestamp"] = _numbers(name, inter, "timestamp", "item_id", low=TIMESTAMP_RANGE[0],
                                      high=TIMESTAMP_RANGE[1]).astype("int64")
        unknown = ~inter["item_id"].isin(items["item_id"])
        if unknown.any():
            raise UnknownItemError(inter.loc[unknown, "item_id"].unique()[:5], name)
        inter = inter.sort_values("timestamp", kind="stable").reset_index(drop=True)
        inter = inter[list(INTERACTION_COLUMNS)]

        pop = inter.groupby("item_id")["user_id"].nunique()
        items["popularity"] = items["item_id"].map(pop).fillna(0).astype(int)
        items["text"] = _item_texts(items)
        extra = [c for c in items.columns if c not in ITEM_COLUMNS]
        items = items[list(ITEM_COLUMNS) + extra].reset_index(drop=True)

        if users is None:
            users = pd.DataFrame({c: pd.Series(dtype=object) for c in USER_COLUMNS})
        users = users.copy()
        users["user_id"] = users["user_id"].astype(str)
        dup_u = users["user_id"][users["user_id"].duplicated()]
        if len(dup_u):
            raise DataError(f"{name}: duplicate user ids: {list(dup_u.unique()[:5])}")
        for col in USER_COLUMNS:
            if col not in users:
                users[col] = pd.NA
        users["age"] = _numbers(name, users, "age", "user_id", words_are_missing=True, integer=True,
                                low=AGE_RANGE[0], high=AGE_RANGE[1]).astype("Int64")
        users = users.reset_index(drop=True)

        item_tags = pd.DataFrame(
            [(i, t, tag_kind) for i, tags in zip(items["item_id"], items["tags"]) for t in tags],
            columns=["item_id", "tag", "kind"],
        )
        return cls(name, items, inter, users, item_tags, dict(source or {}))

    # --------------------------------------------------------------- lookups
    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}: {len(self.items)} items, {len(self.interactions)} interactions, "
            f"{self.interactions['user_id'].nunique()} users with interactions, {len(self.tags)} tags)"
        )

    @cached_property
    def item_index(self) -> dict[str, int]:
        """Item id -> row position in `items` (the catalogue index used by envs)."""
        return {iid: n for n, iid in enumerate(self.items["item_id"])}

    @cached_property
    def item_ids(self) -> np.ndarray:
        """Item ids in catalogue order (read-only view; `items` is not meant to be mutated)."""
        ids = self.items["item_id"].to_numpy().copy()
        ids.flags.writeable = False
        return ids

    @cached_property
    def tags(self) -> list[str]:
        """All tags, sorted."""
        return sorted(self.item_tags["tag"].unique())

    @cached_property
    def user_ids(self) -> list[str]:
        """Users that have at least one interaction, in order of first appearance."""
        return list(pd.unique(self.interactions["user_id"]))

    @cached_property
    def _histories(self) -> dict[str, pd.DataFrame]:
        return {u: g for u, g in self.interactions.groupby("user_id", sort=False)}

    def indices(self, item_ids: Iterable[str]) -> np.ndarray:
        """Catalogue indices of `item_ids`; raises `UnknownItemError` for unknown ids."""
        ids = list(item_ids)
        index = self.item_index
        missing = [i for i in ids if i not in index]
        if missing:
            raise UnknownItemError(missing, self.name)
        return np.fromiter((index[i] for i in ids), dtype=np.int64, count=len(ids))

    def check_items(self, item_ids: Iterable[str]) -> None:
        """Raise `UnknownItemError` if any id is not in the catalogue."""
        self.indices(item_ids)

    def history(self, user_id: str, *, min_rating: float | None = None) -> pd.DataFrame:
        """The user's interactions in chronological order (optionally only ratings >= min_rating)."""
        user_id = str(user_id)
        if user_id not in self._histories:
            raise UnknownUserError(f"unknown user id {user_id!r} in dataset {self.name!r}")
        hist = self._histories[user_id]
        if min_rating is not None:
            hist = hist[hist["rating"] >= min_rating]
        return hist.reset_index(drop=True)

    def history_ids(self, user_id: str, *, min_rating: float | None = None,
                    require: bool = False) -> list[str]:
        """Item ids of `history(user_id)`; `require=True` raises `EmptyHistoryError` when empty."""
        ids = self.history(user_id, min_rating=min_rating)["item_id"].tolist()
        if require and not ids:
            raise EmptyHistoryError(f"user {user_id!r} has no interactions (min_rating={min_rating})")
        return ids

    def items_with_tag(self, tag: str, kind: str | None = None) -> list[str]:
        """Ids of items carrying `tag` (optionally of one tag kind), in catalogue order."""
        rows = self.item_tags[self.item_tags["tag"] == tag]
        if kind is not None:
            rows = rows[rows["kind"] == kind]
        if rows.empty and tag not in self.tags:
            raise DataError(f"unknown tag {tag!r} in dataset {self.name!r}; known tags: {self.tags[:25]}")
        wanted = set(rows["item_id"])
        return [i for i in self.items["item_id"] if i in wanted]

    def item(self, item_id: str) -> pd.Series:
        """One item row."""
        return self.items.iloc[self.indices([item_id])[0]]

    def add_item_tags(self, tags: pd.DataFrame, kind: str) -> "Dataset":
        """A copy with extra (item_id, tag) rows of `kind` merged into `items.tags` and `item_tags`."""
        tags = tags[["item_id", "tag"]].astype(str).drop_duplicates()
        unknown = ~tags["item_id"].isin(self.item_index)
        tags = tags[~unknown]
        new = pd.concat([self.item_tags, tags.assign(kind=kind)], ignore_index=True).drop_duplicates(
            ["item_id", "tag", "kind"]
        )
        per_item = new.groupby("item_id", sort=False)["tag"].agg(lambda s: tuple(dict.fromkeys(s)))
        items = self.items.copy()
        items["tags"] = items["item_id"].map(per_item).apply(lambda t: t if isinstance(t, tuple) else ())
        return _rebuilt(self, items, item_tags=new)

    def with_descriptions(self, descriptions: pd.Series) -> "Dataset":
        """A copy whose items carry `description` (Series indexed by item id) in their text."""
        items = self.items.copy()
        items["description"] = items["item_id"].map(descriptions).fillna("").astype(str)
        return _rebuilt(self, items)

    def summary(self) -> dict:
        """Counts for reports and `ctrlsim info`."""
        return {
            "name": self.name,
            "items": len(self.items),
            "interactions": len(self.interactions),
            "users": int(self.interactions["user_id"].nunique()),
            "users_with_attributes": len(self.users),
            "tags": len(self.tags),
            "source": self.source,
        }


def _rebuilt(ds: Dataset, items: pd.DataFrame, item_tags: pd.DataFrame | None = None) -> Dataset:
    """Recompute item text after items changed; interactions and users are shared."""
    items = items.copy()
    items["text"] = _item_texts(items)
    return Dataset(
        ds.name, items, ds.interactions, ds.users,
        ds.item_tags if item_tags is None else item_tags.reset_index(drop=True), dict(ds.source),
    )
