"""Default probe rosters built from a dataset's users (CtrlBench-Rec Appendix C: users' demographics
plus seed histories of L_init in [4, 6] liked items).

Every probe carries a profile text (`ProbeSpec.profile`): the embedding black boxes build their
query as 0.2 * embedding(profile) + 0.8 * mean embedding(liked items), so a roster without
profiles would silently drop the bio term. Without an LLM the profile is `template_bio`, a
sentence from the user's demographics and the tags of their seed items; LLM-written personas
(`ctrlsim.agents.profiles`) replace it with the LLM's bio.
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError

from .engine import ProbeSpec

GENDER_WORDS = {"M": "man", "F": "woman"}


def catalogue_noun(dataset_name: str) -> tuple[str, str]:
    """(plural, singular) noun for a catalogue: movies for MovieLens, products for Amazon, items otherwise."""
    lowered = dataset_name.lower()
    if lowered.startswith(("ml-", "movielens")):
        return "movies", "movie"
    if "amazon" in lowered:
        return "products", "product"
    return "items", "item"


def user_order(dataset: Dataset) -> list[str]:
    """Users in id order (numeric where ids are numbers), restricted to users with interactions."""
    have = set(dataset.user_ids)
    ids = [u for u in dataset.users["user_id"] if u in have] or list(dataset.user_ids)
    return sorted(ids, key=lambda u: (0, int(u), u) if u.isdigit() else (1, 0, u))


def user_attributes(dataset: Dataset, user_id: str) -> dict:
    """age / gender / occupation of a user (None where unknown; empty when the dataset has no users table)."""
    row = dataset.users[dataset.users["user_id"] == user_id]
    if not len(row):
        return {}
    rec = row.iloc[0]
    return {k: (None if _missing(rec[k]) else (int(rec[k]) if k == "age" else str(rec[k])))
            for k in ("age", "gender", "occupation")}


# A history "rich in" tags (the suppression task's starting histories): at least this share of its
# items carry one of them.
RICH_SHARE = 0.5


def rich_count(length: int) -> int:
    """How many of a rich seed history's `length` items carry a rich tag."""
    return int(np.ceil(RICH_SHARE * length))


def seed_items(dataset: Dataset, user_id: str, length: int, min_rating: float = 4.0,
               rich_in: Sequence[str] = ()) -> list[str]:
    """The user's first `length` liked items (any rated items if none liked), oldest first.

    With `rich_in` tags: the user's first `rich_count(length)` liked items carrying one of them and
    the first liked items without them for the rest (more tagged ones where those run out), oldest
    first, so at least half of the history is the tags' (see `is_rich_user`)."""
    liked = dataset.history_ids(user_id, min_rating=min_rating) or dataset.history_ids(user_id, require=True)
    if not rich_in:
        return liked[:length]
    tagged = set().union(*(dataset.items_with_tag(t) for t in rich_in))
    with_tags = [i for i in liked if i in tagged]
    chosen = set(with_tags[:rich_count(length)])
    for item in [i for i in liked if i not in tagged] + with_tags:
        if len(chosen) >= length:
            break
        chosen.add(item)
    return [i for i in liked if i in chosen]


def is_rich_user(dataset: Dataset, user_id: str, rich_in: Sequence[str], length: int,
                 min_rating: float = 4.0) -> bool:
    """Whether the user liked enough items with a `rich_in` tag for a rich seed history of `length`."""
    tagged = set().union(*(dataset.items_with_tag(t) for t in rich_in))
    liked = dataset.history_ids(user_id, min_rating=min_rating)
    return sum(i in tagged for i in liked) >= rich_count(length)


def describe_person(attributes: Mapping[str, object]) -> str:
    """"A 24-year-old man working as a technician" from demographics ("A person" when none are known)."""
    age, gender, job = attributes.get("age"), attributes.get("gender"), attributes.get("occupation")
    noun = GENDER_WORDS.get(str(gender), "person")
    head = f"A {age}-year-old {noun}" if age is not None else f"A {noun}"
    if job and str(job).lower() not in ("other", "none"):
        head += f" working as {'an' if str(job)[0].lower() in 'aeiou' else 'a'} {job}"
    return head


def top_tags(dataset: Dataset, items: Sequence[str], k: int = 5) -> list[str]:
    """The `k` most frequent tags of `items` (ties in first-seen order)."""
    counts = Counter(t for tags in dataset.items["tags"].iloc[dataset.indices(items)] for t in tags)
    return [t for t, _ in counts.most_common(k)]


def template_bio(dataset: Dataset, attributes: Mapping[str, object], items: Sequence[str]) -> str:
    """A one-sentence bio from demographics and the seed items' tags (no LLM involved)."""
    domain = catalogue_noun(dataset.name)[0]
    tags = top_tags(dataset, items, 3)
    titles = dataset.items["title"].iloc[dataset.indices(items[:2])].tolist()
    tag_text = ", ".join(tags[:-1]) + f" and {tags[-1]}" if len(tags) > 1 else (tags[0] if tags else "many")
    examples = " and ".join(str(t) for t in titles) or "a few favourites"
    return f"{describe_person(attributes)} who mostly enjoys {tag_text} {domain}, such as {examples}."


def probe_from_user(dataset: Dataset, user_id: str, length: int, min_rating: float = 4.0) -> ProbeSpec:
    """A probe seeded with the user's first `length` liked items and a template bio as its profile."""
    items = seed_items(dataset, user_id, length, min_rating)
    attrs = user_attributes(dataset, user_id)
    return ProbeSpec(history=tuple(items), profile=template_bio(dataset, attrs, items), attributes=attrs,
                     name=f"user-{user_id}")


def _missing(value) -> bool:
    try:
        return bool(value is None or value != value or str(value) == "<NA>")
    except (TypeError, ValueError):
        return False


def default_roster(dataset: Dataset, n_agents: int, rng: np.random.Generator,
                   l_init: tuple[int, int] = (4, 6), min_rating: float = 4.0) -> list[ProbeSpec]:
    """Probes from the first `n_agents` users; each seed length drawn from `rng` in [l_init]."""
    users = user_order(dataset)
    if n_agents < 1 or n_agents > len(users):
        raise ConfigError(f"n_agents must be in [1, {len(users)}], got {n_agents}")
    low, high = l_init
    if not 1 <= low <= high:
        raise ConfigError(f"l_init must satisfy 1 <= low <= high, got {l_init}")
    lengths = rng.integers(low, high + 1, size=n_agents)
    return [probe_from_user(dataset, u, int(n), min_rating) for u, n in zip(users[:n_agents], lengths)]
