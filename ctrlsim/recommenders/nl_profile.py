"""`nl-profile`: SteerEval's natural-language-profile recommender.

A profile is written by an LLM from the user's history (paragraph or sentence
prompt), then items are ranked by (a) an LLM rating per item (expected digit
value by default; the paper's generate-and-parse as `rating="generate"`) or
(b) cosine similarity between profile and item-text embeddings. A state that
already carries a profile is ranked by it directly: that is how steering works.

Item text is tag-free (title, year, description when attached); `show_tags=True`
adds each item's tags, a variant that leaks tag relevance to the ranker. A rating
that is missing or unparsable counts as 0, the lowest score (as in SteerEval), so
every candidate keeps a score.

Ratings in the profile prompt come from `state.attributes["ratings"]` (aligned
with the history) when present. Histories longer than `max_history` keep the
first `max_history` items, as SteerEval's "first H rated items".
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ctrlsim.backends import (
    LLM,
    Encoder,
    check_encoder_argument,
    check_llm_argument,
    resolve_encoder,
    resolve_llm,
)
from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError, EmptyHistoryError
from ctrlsim.recommenders.base import Recommender, UserState
from ctrlsim.recommenders.prompts import (
    PROFILE_STYLES,
    SCORE_PREFIX,
    embedding_text,
    profile_messages,
    score_messages,
)
from ctrlsim.seeding import derive_rng


class NLProfileRecommender(Recommender):
    name = "nl-profile"

    def __init__(self, dataset: Dataset, *, llm: LLM | str = "qwen2.5-1.5b", ranker: str = "llm",
                 profile_style: str = "paragraph", rating: str = "digits", encoder: Encoder | str = "minilm",
                 max_history: int = 50, profile_max_tokens: int = 256, seed: int = 0, show_tags: bool = False,
                 **options):
        super().__init__(dataset, **options)
        if ranker not in ("llm", "embedding"):
            raise ConfigError(f"ranker must be 'llm' or 'embedding', got {ranker!r}")
        if profile_style not in PROFILE_STYLES:
            raise ConfigError(f"profile_style must be one of {sorted(PROFILE_STYLES)}, got {profile_style!r}")
        if rating not in ("digits", "generate"):
            raise ConfigError(f"rating must be 'digits' or 'generate', got {rating!r}")
        self._llm_spec = check_llm_argument(llm)
        self._llm: LLM | None = None
        self.ranker, self.profile_style, self.rating = ranker, profile_style, rating
        self.max_history, self.profile_max_tokens, self.seed = max_history, profile_max_tokens, seed
        self.show_tags = bool(show_tags)
        self._encoder_spec = check_encoder_argument(encoder)
        self._encoder: Encoder | None = None
        self._profiles: dict[tuple, str] = {}

    @property
    def identity(self) -> dict:
        ident = {**super().identity, "ranker": self.ranker, "profile_style": self.profile_style,
                 "show_tags": self.show_tags,
                 "llm": self._llm.identity if self._llm is not None else str(self._llm_spec)}
        if self.ranker == "llm":
            ident["rating"] = self.rating
        else:
            ident["encoder"] = self.encoder.identity
        return ident

    @property
    def llm(self) -> LLM:
        """Loaded on first use: the embedding ranker on given profiles needs no LLM."""
        if self._llm is None:
            self._llm = resolve_llm(self._llm_spec)
        return self._llm

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = resolve_encoder(self._encoder_spec)
        return self._encoder

    # --------------------------------------------------------------- profiles
    def _profile_key(self, state: UserState) -> tuple:
        """(history, ratings) cut to `max_history`: what a generated profile depends on."""
        if not state.history:
            raise EmptyHistoryError(f"nl-profile needs a profile or a non-empty history "
                                    f"(user {state.user_id!r})")
        given: Any = state.attributes.get("ratings", (None,) * len(state.history))
        ratings = tuple(given)
        if len(ratings) != len(state.history):
            raise ConfigError(f"attributes['ratings'] has {len(ratings)} values for "
                              f"{len(state.history)} items")
        return state.history[: self.max_history], ratings[: self.max_history]

    def profiles(self, states: Sequence[UserState]) -> list[str]:
        """Each state's profile: its own text, else one generated from its history (batched, memoised)."""
        keys = [None if state.profile else self._profile_key(state) for state in states]
        needed = [k for k in dict.fromkeys(keys) if k is not None and k not in self._profiles]
        if needed:
            items = self.dataset.items
            convs = [profile_messages([items.iloc[i] for i in self.dataset.indices(h)], r, self.profile_style,
                                      show_tags=self.show_tags) for h, r in needed]
            replies = self.llm.chat(convs, max_tokens=self.profile_max_tokens, temperature=0.0)
            for key, reply in zip(needed, replies):
                self._profiles[key] = reply.text.strip()
        return [str(state.profile) if key is None else self._profiles[key]
                for state, key in zip(states, keys)]

    # ---------------------------------------------------------------- scoring
    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        everything = np.arange(len(self.dataset.items))
        return np.stack(self.score_candidates(states, [everything] * len(states)))

    def score_candidates(self, states: Sequence[UserState], candidates: list[np.ndarray]) -> list[np.ndarray]:
        profiles = self.profiles(states)
        items = self.dataset.items
        if self.ranker == "embedding":
            prof_vecs = self.encoder.encode(profiles, kind="query")
            out = []
            for p, idx in zip(prof_vecs, candidates):
                item_vecs = self.encoder.encode([embedding_text(items.iloc[i], show_tags=self.show_tags)
                                                 for i in idx])
                out.append(item_vecs @ p)
            return out
        convs: list[list[dict]] = []
        owners: list[int] = []
        for profile, idx in zip(profiles, candidates):
            convs.extend(score_messages(profile, items.iloc[i], show_tags=self.show_tags) for i in idx)
            owners.append(len(idx))
        if self.rating == "digits":
            flat = self.llm.rate(convs, prefix=SCORE_PREFIX)
        else:  # ties stay ties here; callers that need a random tie order break them (SteerEvalEnv does)
            rng = derive_rng(self.seed, "nl-profile-jitter", len(convs))
            flat, _ = self.llm.rate_by_generation(convs, rng=rng, jitter=0.0)
        # a missing score counts as 0, as in SteerEval
        flat = np.nan_to_num(np.asarray(flat, dtype=np.float64), nan=0.0)
        return np.split(flat, np.cumsum(owners)[:-1])
