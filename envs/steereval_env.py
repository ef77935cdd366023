"""SteerEval as a single-step episode: edit a profile, measure how the ranking moves.

Scenario (SteerEval §4.1 and the release): a user's profile is written from
their first `history_len` (50) rated items; the pool has `pool_size` (100)
items, half relevant to the steered tag and half not, and contains the user's
true next item (the item rated right after the history), which counts towards
its own quota; every other item the user rated is excluded; each quota is
filled with the items closest in popularity to the next item (ml-100k has no
TMDb popularity: the number of ratings stands in). Users need at least
`min_ratings` (100, as in the paper) ratings; a (user, tag) whose quotas cannot
be met is skipped. On ml-100k only genre tags with enough items are feasible at
pool size 100 (e.g. not Film-Noir with 24 items); "unknown" is not a tag.
Item text (what both rankers and the profile writer read) is tag-free: title and
year, plus the description when one is attached, as in the paper's "title and TMDb
description". Oracle condition: each pool item's description also states whether
the steered tag applies ("This movie is about: Horror." / "This movie is not about:
Horror."). `show_tags=True` is a named variant that lists every item's tags.
"""
from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
import pandas as pd
from gymnasium import spaces

from ctrlsim.backends import LLM, check_llm_argument, resolve_llm
from ctrlsim.data import Dataset, load_dataset
from ctrlsim.errors import ConfigError, DataError, InvalidAction
from ctrlsim.metrics.steereval import steereval_figures
from ctrlsim.recommenders import UserState
from ctrlsim.recommenders.nl_profile import NLProfileRecommender
from ctrlsim.recommenders.prompts import item_description
from ctrlsim.seeding import derive_rng

from .checks import check_options, check_positive_int, check_render_mode, check_reset, check_seed

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
    size = check_positive_int("pool_size", pool_size)
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


class SteerEvalEnv(gym.Env[dict, str]):
    """SteerEval steering scenario as a one-step episode.

    Observation (Dict): `profile` - the original profile (Text, ASCII);
    `tag` - index into `env.tags`; `direction` - 0 increase, 1 decrease.
    Action: the steered profile (Text, ASCII, at most 4000 characters); anything the
    action space does not contain raises `InvalidAction`. `to_observation_text`
    turns free LLM text into a valid action.
    Reward: signed ΔAUC_t = AUC_t(steered) - AUC_t(original) for increase, and
    its negation for decrease, so higher is always better steering.
    Episode end: `terminated=True` after the one step.
    Info: auc_before/after, delta_auc, rank_set before/after and the next item's
    relevance, coverage@k and ndcg@k (tag items as relevant) before/after,
    edit_problems (refusal/misreading flags), the scenario and the raw texts.
    Seeding: `reset(seed=...)`; the scenario (user, tag, direction) is drawn
    from `self.np_random` unless `options={"scenario": Scenario}`. Equal scores
    are ranked in a random order drawn from (`tie_seed`, user, tag), the same
    order for the original and the steered profile.
    Options: ranker "llm" | "embedding"; llm spec or LLM; encoder; profile_style
    "paragraph" | "sentence"; rating "digits" | "generate"; oracle (item texts
    state the steered tag's relevance); show_tags (item texts list their tags:
    leaks relevance, a named variant only); tag_phrases (tag -> the phrase the
    templates use, e.g. a renamed trigger); items (the catalogue items scenarios
    may use, e.g. those with a description).
    Render: mode "ansi" returns a one-line summary of the current (or just finished)
    scenario; without a mode, None. Stepping before `reset`, or again after the one step,
    and rendering before the first `reset` raise `ResetNeededError`.
    The LLM loads on first use (construction is cheap).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, *, dataset: Dataset | str = "ml-100k", llm: LLM | str = "qwen2.5-1.5b",
                 ranker: str = "llm", encoder: str = "minilm", profile_style: str = "paragraph",
                 rating: str = "digits", oracle: bool = False, show_tags: bool = False,
                 tags: Sequence[str] | None = None, tag_phrases: Mapping[str, str] | None = None,
                 items: Sequence[str] | None = None, pool_size: int = 100, history_len: int = 50,
                 min_ratings: int = 100, k: int = 10, tie_seed: int = 0, render_mode: str | None = None):
        check_render_mode(render_mode, self.metadata)
        pool_size = _check_pool_size(pool_size)
        history_len = check_positive_int("history_len", history_len)
        min_ratings = check_positive_int("min_ratings", min_ratings)
        k = check_positive_int("k", k)
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
        self.pool_size, self.history_len, self.k, self.oracle = pool_size, history_len, k, oracle
        self.tie_seed = tie_seed
        self._llm_spec = check_llm_argument(llm)
        self._llm: LLM | None = None
        self.recommender_options: dict[str, Any] = {
            "ranker": ranker, "encoder": encoder, "profile_style": profile_style, "rating": rating,
            "show_tags": show_tags}
        self._recommenders: dict[str, NLProfileRecommender] = {}
        self._original_profiles: dict[str, str] = {}
        self._original_rankings: dict[tuple, list[str]] = {}
        self.render_mode = render_mode
        self.observation_space = spaces.Dict({
            "profile": spaces.Text(max_length=MAX_PROFILE_CHARS, min_length=0, charset=PROFILE_CHARSET),
            "tag": spaces.Discrete(len(self.tags)),
            "direction": spaces.Discrete(2),
        })
        self.action_space = spaces.Text(max_length=MAX_PROFILE_CHARS, min_length=0, charset=PROFILE_CHARSET)
        self.scenario: Scenario | None = None  # the current episode's, kept after its step for render
        self._stepped = False

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

    def recommender(self, tag: str | None = None) -> NLProfileRecommender:
        """The ranker; in the oracle condition one per tag, over item texts that state the tag."""
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

    # -------------------------------------------------------------- episode
    def build(self, user_id: str, tag: str, direction: str) -> Scenario | None:
        """The scenario for (user, tag, direction) under this env's pool settings (None when infeasible)."""
        return build_scenario(self.dataset, user_id, tag, direction, pool_size=self.pool_size,
                              history_len=self.history_len, items=self.items)

    def sample_scenario(self) -> Scenario:
        for _ in range(200):
            user = self.users[int(self.np_random.integers(len(self.users)))]
            tag = self.tags[int(self.np_random.integers(len(self.tags)))]
            direction = DIRECTIONS[int(self.np_random.integers(2))]
            sc = self.build(user, tag, direction)
            if sc is not None:
                return sc
        raise DataError(f"no feasible scenario found in 200 draws (pool_size={self.pool_size}); "
                        "use a smaller pool or tags with more items")

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

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=check_seed(seed))
        sc = check_options(options, ("scenario",)).get("scenario") or self.sample_scenario()
        if not isinstance(sc, Scenario):
            raise ConfigError(f"options['scenario'] must be a Scenario, got {type(sc).__name__}")
        if sc.tag not in self.tags:
            raise ConfigError(f"scenario tag {sc.tag!r} is not one of this env's tags")
        self.scenario, self._stepped = sc, False
        profile = self.original_profile(sc)
        obs = {"profile": profile, "tag": self.tags.index(sc.tag),
               "direction": DIRECTIONS.index(sc.direction)}
        info = {"scenario": {**asdict(sc), "relevant": sorted(sc.relevant)}, "tag_name": sc.tag,
                "tag_phrase": self.tag_phrase(sc.tag), "tag_kind": sc.tag_kind,
                "direction_name": sc.direction, "original_profile": profile}
        return obs, info

    def step(self, action: str) -> tuple[dict, float, bool, bool, dict]:
        sc = check_reset(self.scenario, "step", ended=self._stepped)
        if not isinstance(action, str):
            raise InvalidAction(f"the action is the steered profile text, got {type(action).__name__}")
        if not self.action_space.contains(action):
            bad = sorted({c for c in action if c not in PROFILE_CHARSET})[:5]
            why = f"{len(action)} characters (max {MAX_PROFILE_CHARS})" if len(action) > MAX_PROFILE_CHARS \
                else f"characters outside the action charset: {bad!r}"
            raise InvalidAction(f"steered profile is not in the action space: {why}; "
                                "to_observation_text() makes free text valid")
        original = self.original_profile(sc)
        before = self.original_ranking(sc)
        after = self.rank(action, sc)
        info = steereval_figures(before, after, sc.relevant, sc.next_item, self.k)
        info["edit_problems"] = edit_problems(original, action, self.tag_phrase(sc.tag))
        info["steered_profile"] = action
        reward = info["delta_auc"] if sc.direction == "increase" else -info["delta_auc"]
        self._stepped = True
        obs = {"profile": action, "tag": self.tags.index(sc.tag), "direction": DIRECTIONS.index(sc.direction)}
        return obs, float(reward), True, False, info

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        sc = check_reset(self.scenario, "render")
        return f"user {sc.user_id}: {sc.direction} {sc.tag!r} over {len(sc.pool)} items"
