"""SteerEval's protocol core: scenarios, pool ranking, the conditions, and the engine both the env
and the runner use.

Scenario (SteerEval §4.1 and the release): a user's profile is written from their first
`history_len` (50) rated items; the pool has `pool_size` (100) items, half relevant to the steered
tag and half not, and contains the user's true next item (the item rated right after the history),
which counts towards its own quota; every other item the user rated is excluded; each quota is
filled with the items closest in popularity to the next item (ml-100k has no TMDb popularity: the
number of ratings stands in). Users need at least `min_ratings` (100, as in the paper) ratings; a
(user, tag) whose quotas cannot be met is skipped. Item text (what both rankers and the profile
writer read) is tag-free: title and year, plus the description when one is attached. Oracle
condition: each pool item's description also states whether the steered tag applies.
`SteerEvalEngine` writes original profiles, ranks pools and measures an edit; `envs.steereval_env`
wraps it as a one-step Gymnasium episode, and `ctrlsim steereval` plans its units over it.

Rankers: "llm" and "embedding" (`NLProfileRecommender`), or a dial spec, "dial:<lambda>[:key=value...]"
or "dial-profile:<lambda>[...]" (both mean `ctrlsim.recommenders.dial_profile.DialProfileRanker`, the
reference ranker of known controllability, with the spec's options). With a dial ranker the LLM is
never loaded (the original profile is the ranker's template profile), and `oracle`, `show_tags`,
`encoder`, `profile_style` and `rating` have no effect: it reads only tag names in the profile.
"""
from __future__ import annotations

import numbers
import re
import string
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ctrlsim.backends import LLM, check_llm_argument, resolve_llm
from ctrlsim.data import Dataset, load_dataset
from ctrlsim.errors import ConfigError, DataError
from ctrlsim.metrics.steereval import steereval_figures
from ctrlsim.recommenders.base import UserState
from ctrlsim.recommenders.dial import is_dial, parse_dial_spec
from ctrlsim.recommenders.dial_profile import DialProfileRanker
from ctrlsim.recommenders.nl_profile import NLProfileRecommender
from ctrlsim.recommenders.prompts import item_description
from ctrlsim.seeding import derive_rng

DIRECTIONS = ("increase", "decrease")
PROFILE_CHARSET = string.printable  # observations/actions are ASCII-normalised text
MAX_PROFILE_CHARS = 4000
NON_TAGS = {"unknown"}


@dataclass(frozen=True)
class Scenario:
    user_id: str
    tag: str
    tag_kind: str  # "genre", "trigger", ...
    direction: str
    history: tuple[str, ...]
    ratings: tuple[float, ...]
    next_item: str
    pool: tuple[str, ...]
    relevant: frozenset[str] = field(repr=False)

    @property
    def key(self) -> str:
        return f"{self.user_id}/{self.tag}/{self.direction}"


def eligible_users(ds: Dataset, min_ratings: int = 100) -> list[str]:
    counts = ds.interactions.groupby("user_id").size()
    return sorted(counts[counts >= min_ratings].index, key=lambda u: (len(u), u))


def _check_pool_size(pool_size: object) -> int:
    size = _positive("pool_size", pool_size)
    if size < 2 or size % 2:  # half the pool is relevant to the tag, half is not
        raise ConfigError(f"pool_size must be an even number >= 2, got {pool_size}")
    return size


def build_scenario(ds: Dataset, user_id: str, tag: str, direction: str, *, pool_size: int = 100,
                   history_len: int = 50, tag_kind: str | None = None,
                   items: frozenset[str] | set[str] | None = None) -> Scenario | None:
    """The scenario for (user, tag, direction), or None when its pool quotas cannot be filled.

    `items` restricts the catalogue (SteerEval drops movies without a TMDb description):
    the history, the next item and the pool then come from those items only, while every
    item the user rated stays out of the pool.
    """
    if direction not in DIRECTIONS:
        raise ConfigError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    _check_pool_size(pool_size)
    full = ds.history(user_id)
    rated = set(full["item_id"])
    hist = full if items is None else full[full["item_id"].isin(items)]
    if len(hist) <= history_len:
        return None
    relevant = set(ds.items_with_tag(tag))
    next_item = str(hist["item_id"].iat[history_len])
    pop = ds.items.set_index("item_id")["popularity"]
    target_pop = pop[next_item]
    half = pool_size // 2
    pool = [next_item]
    for want_relevant in (True, False):
        quota = half - ((next_item in relevant) == want_relevant)
        cands = [i for i in ds.item_ids if (i in relevant) == want_relevant and i not in rated
                 and (items is None or i in items)]
        if len(cands) < quota:
            return None
        gaps = np.abs(pop.loc[cands].to_numpy() - target_pop)
        order = np.argsort(gaps, kind="stable")[:quota]
        pool.extend(cands[i] for i in order)
    kinds = ds.item_tags.loc[ds.item_tags["tag"] == tag, "kind"]
    kind = tag_kind or (kinds.iat[0] if len(kinds) else "genre")
    return Scenario(user_id, tag, kind, direction, tuple(hist["item_id"].iloc[:history_len]),
                    tuple(float(r) for r in hist["rating"].iloc[:history_len]), next_item,
                    tuple(sorted(pool, key=ds.item_index.__getitem__)), frozenset(relevant & set(pool)))


def to_observation_text(text: str) -> str:
    """ASCII-normalised text that fits the Text spaces (accents dropped, curly quotes straightened)."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(c for c in ascii_text if c in PROFILE_CHARSET)[:MAX_PROFILE_CHARS]


_REFUSAL = re.compile(r"\b(i'?m sorry|i cannot|i can'?t|i am unable|as an ai|i won'?t|cannot assist|"
                      r"not able to (help|comply)|against (my|the) (guidelines|policy))\b", re.I)


def edit_problems(original: str, steered: str, tag: str) -> list[str]:
    """Detect LLM refusals and misreadings in a steered profile (SteerEval §4.4.1).

    Flags: "empty", "refusal" (refusal phrases), "unchanged" (identical to the
    original), "tag_missing" (the tag's words never appear, so the edit likely
    misread the request).
    """
    problems = []
    text = steered.strip()
    if not text:
        return ["empty"]
    if _REFUSAL.search(text):
        problems.append("refusal")
    if text == original.strip():
        problems.append("unchanged")
    words = [w for w in re.findall(r"[a-z]+", tag.lower()) if len(w) > 2] or [tag.lower()]
    if not any(w[:5] in text.lower() for w in words):
        problems.append("tag_missing")
    return problems


def oracle_descriptions(ds: Dataset, tag: str) -> pd.Series:
    """Each item's usual (tag-free) description plus a sentence stating whether `tag` applies."""
    relevant = set(ds.items_with_tag(tag))
    notes = []
    for _, item in ds.items.iterrows():
        base = item_description(item)
        sentence = f"This movie is {'' if item['item_id'] in relevant else 'not '}about: {tag}."
        notes.append(f"{base} {sentence}" if base else sentence)
    return pd.Series(notes, index=ds.items["item_id"].to_numpy())


def rank_pool(pool: Sequence[str], scores: np.ndarray, tie_order: np.ndarray) -> list[str]:
    """Pool items by descending score; equal scores in the order of `tie_order` (a permutation)."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) != len(pool) or len(tie_order) != len(pool):
        raise ConfigError(f"got {len(scores)} scores and {len(tie_order)} tie ranks for {len(pool)} items")
    order = np.lexsort((tie_order, -scores))
    return [pool[i] for i in order]


@dataclass(frozen=True)
class Condition:
    ranker: str = "llm"
    profile_style: str = "paragraph"
    intervention: str = "template-append"
    emphasis: str = "default"
    oracle: bool = False
    show_tags: bool = False

    @property
    def env_key(self) -> tuple:
        return self.ranker, self.profile_style, self.oracle, self.show_tags


CONDITIONS = {
    "default": Condition(),
    "embedding": Condition(ranker="embedding"),
    "sentence": Condition(profile_style="sentence"),
    "llm-append": Condition(intervention="llm-append"),
    "llm-rewrite": Condition(intervention="llm-rewrite"),
    "stronger": Condition(emphasis="stronger"),
    "weaker": Condition(emphasis="weaker"),
    "oracle": Condition(oracle=True),
    "tags-visible": Condition(show_tags=True),
}
PAPER_CONDITIONS = tuple(c for c in CONDITIONS if c != "tags-visible")
LLM_WRITTEN = ("llm-append", "llm-rewrite")  # the edits whose refusals drive the Trigger(75) filter


class SteerEvalEngine:
    """Scenarios, original profiles and rankings, and the measurement of one edit (no Gym API).

    Original profiles and rankings are memoised per (user, profile style) and (user, tag, pool,
    style): the work several episodes share is paid once. The LLM loads on first use. A dial
    `ranker` spec is parsed and its `DialProfileRanker` built at construction (a bad spec is a
    `ConfigError` there); it never loads the LLM and ignores `oracle` and `show_tags`.
    """

    def __init__(self, *, dataset: Dataset | str = "ml-100k", llm: LLM | str = "qwen2.5-1.5b",
                 ranker: str = "llm", encoder: str = "minilm", profile_style: str = "paragraph",
                 rating: str = "digits", oracle: bool = False, show_tags: bool = False,
                 tags: Sequence[str] | None = None, tag_phrases: Mapping[str, str] | None = None,
                 items: Sequence[str] | None = None, pool_size: int = 100, history_len: int = 50,
                 min_ratings: int = 100, k: int = 10, tie_seed: int = 0):
        self.pool_size = _check_pool_size(pool_size)
        self.history_len = _positive("history_len", history_len)
        min_ratings = _positive("min_ratings", min_ratings)
        self.k = _positive("k", k)
        self.dataset = load_dataset(dataset) if isinstance(dataset, str) else dataset
        self.tags = list(tags) if tags is not None else [t for t in self.dataset.tags if t not in NON_TAGS]
        if not self.tags:
            raise ConfigError("SteerEval needs at least one tag")
        unknown = [t for t in self.tags if t not in set(self.dataset.tags)]
        if unknown:
            raise ConfigError(f"unknown tag(s) {unknown} for dataset {self.dataset.name!r}")
        self.tag_phrases = dict(tag_phrases or {})
        self.items = None if items is None else frozenset(map(str, items))
        self.users = eligible_users(self.dataset, min_ratings)
        if not self.users:
            raise DataError(f"no user of {self.dataset.name} has >= {min_ratings} ratings")
        self.oracle, self.tie_seed = oracle, tie_seed
        self._llm_spec = check_llm_argument(llm)
        self._llm: LLM | None = None
        self.recommender_options: dict[str, Any] = {
            "ranker": ranker, "encoder": encoder, "profile_style": profile_style, "rating": rating,
            "show_tags": show_tags}
        self._recommenders: dict[str, NLProfileRecommender | DialProfileRanker] = {}
        if is_dial(ranker):  # built now: cheap, and a bad spec or option fails at construction
            spec = parse_dial_spec(ranker)
            self._recommenders[""] = DialProfileRanker(self.dataset, lam=spec.lam, **spec.options)
        self._original_profiles: dict[str, str] = {}
        self._original_rankings: dict[tuple, list[str]] = {}

    @property
    def config(self) -> dict:
        llm = str(self._llm_spec) if self._llm is None else self.llm.identity
        return {"dataset": self.dataset.name, "llm": llm,
                **self.recommender_options, "oracle": self.oracle, "pool_size": self.pool_size,
                "history_len": self.history_len, "k": self.k, "tie_seed": self.tie_seed}

    @property
    def llm(self) -> LLM:
        if self._llm is None:
            self._llm = resolve_llm(self._llm_spec)
        return self._llm

    def recommender(self, tag: str | None = None) -> NLProfileRecommender | DialProfileRanker:
        """The ranker; in the oracle condition one per tag, over item texts that state the tag
        (a dial ranker is one for all tags: it reads no item text)."""
        if is_dial(self.recommender_options["ranker"]):
            return self._recommenders[""]
        key = tag if self.oracle and tag else ""
        if key not in self._recommenders:
            ds = self.dataset.with_descriptions(oracle_descriptions(self.dataset, key)) if key \
                else self.dataset
            # The embedding ranker never needs the LLM: pass the spec so it stays unloaded.
            llm = self.llm if self.recommender_options["ranker"] == "llm" or self._llm is not None \
                else self._llm_spec
            self._recommenders[key] = NLProfileRecommender(ds, llm=llm, **self.recommender_options)
        return self._recommenders[key]

    def tag_phrase(self, tag: str) -> str:
        return self.tag_phrases.get(tag, tag)

    def build(self, user_id: str, tag: str, direction: str) -> Scenario | None:
        """The scenario for (user, tag, direction) under these pool settings (None when infeasible)."""
        return build_scenario(self.dataset, user_id, tag, direction, pool_size=self.pool_size,
                              history_len=self.history_len, items=self.items)

    def original_profile(self, sc: Scenario) -> str:
        """The profile generated from the scenario's history, as the observation shows it (ASCII)."""
        key = f"{sc.user_id}/{self.recommender_options['profile_style']}/{len(sc.history)}"
        if key not in self._original_profiles:
            state = UserState(history=sc.history, attributes={"ratings": sc.ratings}, user_id=sc.user_id)
            self._original_profiles[key] = to_observation_text(self.recommender().profiles([state])[0])
        return self._original_profiles[key]

    def rank(self, profile: str, sc: Scenario) -> list[str]:
        """The scenario's pool ranked for `profile` (ties in the scenario's seeded random order)."""
        rec = self.recommender(sc.tag)
        scores = rec.score_candidates([UserState(profile=profile)], [self.dataset.indices(sc.pool)])[0]
        tie_order = derive_rng(self.tie_seed, "steereval-ties", sc.user_id, sc.tag).permutation(len(sc.pool))
        return rank_pool(sc.pool, scores, tie_order)

    def original_ranking(self, sc: Scenario) -> list[str]:
        """The pool ranked for the original profile (computed once per user, tag, pool and style)."""
        key = (sc.user_id, sc.tag, tuple(sc.pool), self.recommender_options["profile_style"])
        if key not in self._original_rankings:
            self._original_rankings[key] = self.rank(self.original_profile(sc), sc)
        return self._original_rankings[key]

    def measure(self, sc: Scenario, steered: str) -> tuple[float, dict]:
        """(reward, figures) of replacing the original profile by `steered` in scenario `sc`.

        Reward: signed ΔAUC_t (negated for "decrease"), so higher is always better steering."""
        original = self.original_profile(sc)
        before = self.original_ranking(sc)
        after = self.rank(steered, sc)
        info = steereval_figures(before, after, sc.relevant, sc.next_item, self.k)
        info["edit_problems"] = edit_problems(original, steered, self.tag_phrase(sc.tag))
        info["steered_profile"] = steered
        reward = info["delta_auc"] if sc.direction == "increase" else -info["delta_auc"]
        return float(reward), info


def _positive(name: str, value: object) -> int:
    """A count: an integer >= 1 (the envs' `check_positive_int`, at this layer)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def choose_scenarios(engine: SteerEvalEngine, tags: Sequence[str], users_per_tag: int, seed: int):
    """Per tag, the first `users` users (seeded order) whose pool quotas can be met; both directions.

    Returned round-robin over tags (each tag's first user, then each tag's second, ...) so
    that an interrupted run has results for every tag.
    """
    order = derive_rng(seed, "steereval-users").permutation(len(engine.users))
    users = [engine.users[i] for i in order]
    per_tag: dict[str, list] = {}
    for tag in tags:
        per_tag[tag] = []
        for user in users:
            if len(per_tag[tag]) == users_per_tag:
                break
            pair = [engine.build(user, tag, d) for d in DIRECTIONS]
            if all(sc is not None for sc in pair):
                per_tag[tag].append(pair)
    scenarios = [sc for rank in range(users_per_tag) for tag in tags if rank < len(per_tag[tag])
                 for sc in per_tag[tag][rank]]
    short = {tag: len(pairs) for tag, pairs in per_tag.items() if len(pairs) < users_per_tag}
    return scenarios, short
