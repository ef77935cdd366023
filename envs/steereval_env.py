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
Oracle condition: each pool item's description states whether the steered tag
applies ("This movie is about: Horror." / "This movie is not about: Horror.").
"""
from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Sequence

import gymnasium as gym
import numpy as np
import pandas as pd
from gymnasium import spaces

from ctrlsim.backends import LLM, load_llm
from ctrlsim.data import Dataset, load_dataset
from ctrlsim.errors import ConfigError, DataError
from ctrlsim.metrics import auc_t, coverage_at_k, ndcg_at_k, rank_set
from ctrlsim.recommenders import UserState
from ctrlsim.recommenders.nl_profile import NLProfileRecommender
from ctrlsim.recommenders.prompts import fallback_description

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


def build_scenario(ds: Dataset, user_id: str, tag: str, direction: str, *, pool_size: int = 100,
                   history_len: int = 50, tag_kind: str | None = None) -> Scenario | None:
    """The scenario for (user, tag, direction), or None when its pool quotas cannot be filled."""
    if direction not in DIRECTIONS:
        raise ConfigError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if pool_size < 2 or pool_size % 2:
        raise ConfigError(f"pool_size must be an even number >= 2, got {pool_size}")
    hist = ds.history(user_id)
    if len(hist) <= history_len:
        return None
    relevant = set(ds.items_with_tag(tag))
    rated = set(hist["item_id"])
    next_item = str(hist["item_id"].iat[history_len])
    pop = ds.items.set_index("item_id")["popularity"]
    target_pop = pop[next_item]
    half = pool_size // 2
    pool = [next_item]
    for want_relevant in (True, False):
        quota = half - ((next_item in relevant) == want_relevant)
        cands = [i for i in ds.item_ids if (i in relevant) == want_relevant and i not in rated]
        if len(cands) < quota:
            return None
        gaps = np.abs(pop.loc[cands].to_numpy() - target_pop)
        order = np.argsort(gaps, kind="stable")[:quota]
        pool.extend(cands[i] for i in order)
    kinds = ds.item_tags.loc[ds.item_tags["tag"] == tag, "kind"]
    kind = tag_kind or (kinds.iat[0] if len(kinds) else "genre")
    return Scenario(user_id, tag, kind, direction, tuple(hist["item_id"].iloc[:history_len]),
                    tuple(float(r) for r in hist["rating"].iloc[:history_len]), next_item,
                    tuple(sorted(pool, key=ds.item_index.get)), frozenset(relevant & set(pool)))


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
    """Each item's usual description plus a sentence stating whether `tag` applies."""
    relevant = set(ds.items_with_tag(tag))
    notes = []
    for _, item in ds.items.iterrows():
        base = str(item.get("description", "") or "") or fallback_description(item)
        notes.append(f"{base}. This movie is {'' if item['item_id'] in relevant else 'not '}about: {tag}.")
    return pd.Series(notes, index=ds.items["item_id"].to_numpy())


class SteerEvalEnv(gym.Env):
    """SteerEval steering scenario as a one-step episode.

    Observation (Dict): `profile` - the original profile (Text, ASCII);
    `tag` - index into `env.tags`; `direction` - 0 increase, 1 decrease.
    Action: the steered profile (Text).
    Reward: signed ΔAUC_t = AUC_t(steered) - AUC_t(original) for increase, and
    its negation for decrease, so higher is always better steering.
    Episode end: `terminated=True` after the one step.
    Info: auc_before/after, delta_auc, rank_set before/after and the next item's
    relevance, coverage@k and ndcg@k (tag items as relevant) before/after,
    edit_problems (refusal/misreading flags), the scenario and the raw texts.
    Seeding: `reset(seed=...)`; the scenario (user, tag, direction) is drawn
    from `self.np_random` unless `options={"scenario": Scenario}`.
    Options: ranker "llm" | "embedding"; llm spec or LLM; encoder; profile_style
    "paragraph" | "sentence"; rating "digits" | "generate"; oracle; tags.
    The LLM loads on first use (construction is cheap).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, *, dataset: Dataset | str = "ml-100k", llm: LLM | str = "qwen2.5-1.5b",
                 ranker: str = "llm", encoder: str = "minilm", profile_style: str = "paragraph",
                 rating: str = "digits", oracle: bool = False, tags: Sequence[str] | None = None,
                 pool_size: int = 100, history_len: int = 50, min_ratings: int = 100, k: int = 10,
                 render_mode: str | None = None):
        self.dataset = load_dataset(dataset) if isinstance(dataset, str) else dataset
        self.tags = list(tags) if tags is not None else [t for t in self.dataset.tags if t not in NON_TAGS]
        if not self.tags:
            raise ConfigError("SteerEval needs at least one tag")
        self.users = eligible_users(self.dataset, min_ratings)
        if not self.users:
            raise DataError(f"no user of {self.dataset.name} has >= {min_ratings} ratings")
        self.pool_size, self.history_len, self.k, self.oracle = pool_size, history_len, k, oracle
        self._llm_spec, self._llm = llm, None
        self.recommender_options = {"ranker": ranker, "encoder": encoder, "profile_style": profile_style,
                                    "rating": rating}
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
        self.scenario: Scenario | None = None

    @property
    def config(self) -> dict:
        return {"dataset": self.dataset.name, "llm": str(self._llm_spec) if self._llm is None else self.llm.identity,
                **self.recommender_options, "oracle": self.oracle, "pool_size": self.pool_size,
                "history_len": self.history_len, "k": self.k}

    @property
    def llm(self) -> LLM:
        if self._llm is None:
            self._llm = load_llm(self._llm_spec) if isinstance(self._llm_spec, str) else self._llm_spec
        return self._llm

    def recommender(self, tag: str | None = None) -> NLProfileRecommender:
        """The ranker; in the oracle condition one per tag, over item texts that state the tag."""
        key = tag if self.oracle and tag else ""
        if key not in self._recommenders:
            ds = self.dataset.with_descriptions(oracle_descriptions(self.dataset, tag)) if key else self.dataset
            self._recommenders[key] = NLProfileRecommender(ds, llm=self.llm, **self.recommender_options)
        return self._recommenders[key]

    # -------------------------------------------------------------- episode
    def sample_scenario(self) -> Scenario:
        for _ in range(200):
            user = self.users[int(self.np_random.integers(len(self.users)))]
            tag = self.tags[int(self.np_random.integers(len(self.tags)))]
            direction = DIRECTIONS[int(self.np_random.integers(2))]
            sc = build_scenario(self.dataset, user, tag, direction, pool_size=self.pool_size,
                                history_len=self.history_len)
            if sc is not None:
                return sc
        raise DataError(f"no feasible scenario found in 200 draws (pool_size={self.pool_size}); "
                        "use a smaller pool or tags with more items")

    def original_profile(self, sc: Scenario) -> str:
        key = f"{sc.user_id}/{self.recommender_options['profile_style']}"
        if key not in self._original_profiles:
            state = UserState(history=sc.history, attributes={"ratings": sc.ratings}, user_id=sc.user_id)
            self._original_profiles[key] = self.recommender().profiles([state])[0]
        return self._original_profiles[key]

    def rank(self, profile: str, sc: Scenario) -> list[str]:
        slate = self.recommender(sc.tag).recommend([UserState(profile=profile)], len(sc.pool), candidates=sc.pool)
        return slate[0].item_ids

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        sc = (options or {}).get("scenario") or self.sample_scenario()
        if sc.tag not in self.tags:
            raise ConfigError(f"scenario tag {sc.tag!r} is not one of this env's tags")
        self.scenario = sc
        profile = self.original_profile(sc)
        obs = {"profile": to_observation_text(profile), "tag": self.tags.index(sc.tag),
               "direction": DIRECTIONS.index(sc.direction)}
        info = {"scenario": {**asdict(sc), "relevant": sorted(sc.relevant)}, "tag_name": sc.tag,
                "tag_kind": sc.tag_kind, "direction_name": sc.direction, "original_profile": profile}
        return obs, info

    def step(self, action: str):
        if self.scenario is None:
            raise RuntimeError("call reset() before step()")
        if not isinstance(action, str):
            raise ConfigError(f"the action is the steered profile text, got {type(action).__name__}")
        sc = self.scenario
        original = self.original_profile(sc)
        key = (sc.user_id, sc.tag, tuple(sc.pool), self.recommender_options["profile_style"])
        if key not in self._original_rankings:
            self._original_rankings[key] = self.rank(original, sc)
        before = self._original_rankings[key]
        after = self.rank(action, sc)
        info = steereval_figures(before, after, sc, self.k)
        info["edit_problems"] = edit_problems(original, action, sc.tag)
        info["steered_profile"] = action
        reward = info["delta_auc"] if sc.direction == "increase" else -info["delta_auc"]
        self.scenario = None
        obs = {"profile": to_observation_text(action), "tag": self.tags.index(sc.tag),
               "direction": DIRECTIONS.index(sc.direction)}
        return obs, float(reward), True, False, info

    def render(self):
        sc = self.scenario
        return "" if sc is None else f"user {sc.user_id}: {sc.direction} {sc.tag!r} over {len(sc.pool)} items"


def steereval_figures(before: Sequence[str], after: Sequence[str], sc: Scenario, k: int = 10) -> dict:
    """The metric hook: named figures of one steering episode (shared by env info and the runners)."""
    rel = set(sc.relevant)
    a0, a1 = auc_t(before, rel), auc_t(after, rel)
    return {
        "auc_before": a0, "auc_after": a1, "delta_auc": a1 - a0,
        "next_item_relevant": sc.next_item in rel,
        "rank_set_before": rank_set(before, sc.next_item, rel),
        "rank_set_after": rank_set(after, sc.next_item, rel),
        f"coverage@{k}_before": coverage_at_k(before, rel, k), f"coverage@{k}_after": coverage_at_k(after, rel, k),
        f"ndcg@{k}_before": ndcg_at_k(before, rel, k), f"ndcg@{k}_after": ndcg_at_k(after, rel, k),
    }
