"""`dial-profile`: a SteerEval profile-text ranker whose controllability is known by construction.

SteerEval (`ctrlsim.recommenders.steereval`) asks whether editing a user's natural-language profile
steers a ranker. To calibrate that measurement this ranker reads a profile with a fixed, documented
lexical rule and mixes what it reads with a ranking that ignores the profile, through a knob
lambda in [0, 1]. No LLM and no text encoder run inside it.

Rule. For item i with tag set G_i and the weights w = `read_profile(profile)`:

    affinity  a_i = tanh(sum over g in G_i of w_g)                  (in (-1, 1); 0 if no tag is named)
    base      b_i = i's rank among the ranked items (the pool) in a profile-independent ranking,
                scaled to [0, 1] (1 = first)
    score     s_i = (1 - lambda) * b_i + lambda * a_i

The base ranking is `popularity` (the dataset's `popularity` column, ties by catalogue order) or
`random` (a permutation drawn from `derive_rng(seed, "dial-base")`); both are scaled with
`ctrlsim.recommenders.dial.rank_scale`.

Profiles (`profiles`). A state's own `profile` is used whenever it is not None (an empty string
is a profile that names nothing). Otherwise a template profile is written from the history:

    The user has enjoyed: "<title>" (<year>), ... . The user likes <tag>, <tag> and <tag> movies.

with up to 5 titles, best rated first (ties, and histories without ratings, in history order), and
up to 3 tags, the most frequent among the history's items, each item counting its rating when
`state.attributes["ratings"]` is given (aligned with the history), else 1 (ties in the dataset's
tag order). Titles are double-quoted so that the reader skips them. An empty history without a
profile raises `EmptyHistoryError`.

Reader (`read_profile`, identity "reader": "lexical-tags"):

* Double-quoted spans ("...") are dropped first: they hold titles ("Star Wars" is not a War mention).
* The rest is split into sentences, ending at ".", "!", "?" or ";" followed by white space, or at
  a line break.
* A dataset tag is mentioned in a sentence when its words appear case-insensitively, as whole
  words, in order; between words a hyphen, white space or nothing ("Film-Noir" = "film noir" =
  "filmnoir", "Sci-Fi" = "sci fi"); apostrophes are optional ("Children's" = "childrens"); the
  last word may carry a plural ("s", "es", or "y" -> "ies": "comedies", "mysteries"). "unknown"
  is never a tag (SteerEval's NON_TAGS).
* Each tag mentioned in a sentence adds +1 (once per sentence, however often it is named), or -1
  when the sentence holds a negation cue, a whole word among NEGATION_CUES (not, no, don't,
  doesn't, dont, doesnt, never, less, avoid, without, dislike(s), hate(s), neither, nor; so "*does
  not want*", "*no*" and "*less*" negate), times the sentence's emphasis: 2 with a strong cue
  (only, no, never, exclusively), 0.5 with a weak one (more, less, somewhat), else 1. The weights
  of a tag over all sentences are summed.

Every genre template of `ctrlsim.agents.steering` reads with the right sign: increase templates
("Please show the user movies that satisfy: X.", "... *only* X movies.", "... *more* X movies.")
give +1, +2 and +0.5 for X; decrease templates ("The user *does not want* to see X movies.",
"... *no* X movies.", "... *less* X movies.") give -1, -2 and -0.5. So at any lambda > 0 the
stronger templates steer this ranker at least as much as the default ones, and the weaker ones
at most as much: an instrument that cannot order them on this box cannot order them anywhere.

Limits, by design: the reader sees only tag names and these cues. An edit that paraphrases a tag
without naming it (an LLM-written "films with detectives in shadowy cities" for Film-Noir), or
negates it with words outside the list ("cannot stand", "isn't into"), or names the wrong tag,
is invisible or misread; so is a tag written inside double quotes (skipped like a title). The
sign applies to a whole sentence ("I like comedies but not horror" reads -1 for both). Trigger
tags are read by their tag name only, not by the phrase the templates write for them. An edit
appended to a profile whose last sentence has no final punctuation joins that sentence.

Known answers:

* lambda = 0: the score is b_i exactly, whatever the profile; in SteerEval every Delta-AUC_t and
  every Rank_set change is 0 exactly, for every edit.
* lambda > 0: a genre template edit changes only w_X, up (increase) or down (decrease); since tanh
  is strictly increasing every X item's score moves that way and no other item's score moves, so
  AUC_t never moves against the requested direction, and it moves strictly whenever a (tagged,
  untagged) pair can flip. As lambda grows the base ranking matters less and the ranking follows
  the profile's stated tag preferences; at lambda = 1 the base ranking is ignored.
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError, EmptyHistoryError
from ctrlsim.recommenders.base import Recommender, UserState
from ctrlsim.recommenders.dial import (
    BASES,
    FLAG_OPTIONS,
    base_ranking,
    check_lambda,
    parse_flag,
    parse_seed,
    rank_scale,
)

NON_TAGS = frozenset({"unknown"})  # the same as ctrlsim.recommenders.steereval.NON_TAGS
NEGATION_CUES = ("not", "no", "don't", "doesn't", "dont", "doesnt", "never", "less", "avoid", "without",
                 "dislike", "dislikes", "hate", "hates", "neither", "nor")
# Emphasis: a sentence with a strong cue counts twice, one with a weak cue half (strong wins).
STRONG_CUES = ("only", "no", "never", "exclusively")
WEAK_CUES = ("more", "less", "somewhat")
STRONG, WEAK = 2.0, 0.5
MAX_TITLES = 5
MAX_TAGS = 3

_WORD_CHAR = "A-Za-z0-9"
_QUOTED = re.compile(r'"[^"]*"')
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def _cue_pattern(words) -> re.Pattern:
    return re.compile(rf"(?<![{_WORD_CHAR}'])(?:{'|'.join(map(re.escape, words))})(?![{_WORD_CHAR}'])",
                      re.IGNORECASE)


_CUE, _STRONG, _WEAK = _cue_pattern(NEGATION_CUES), _cue_pattern(STRONG_CUES), _cue_pattern(WEAK_CUES)


def emphasis(sentence: str) -> float:
    """How much a sentence's tag mentions count: 2 with a strong cue, 0.5 with a weak one, else 1."""
    if _STRONG.search(sentence):
        return STRONG
    return WEAK if _WEAK.search(sentence) else 1.0


def tag_pattern(tag: str) -> re.Pattern | None:
    """The regular expression that finds a mention of `tag` (None for a tag with no word in it)."""
    words = re.findall(rf"[{_WORD_CHAR}']+", tag)
    words = [w.strip("'") for w in words if w.strip("'")]
    if not words:
        return None

    def word(w: str) -> str:  # apostrophes optional
        return "'?".join(re.escape(part) for part in w.split("'"))

    last = words[-1]
    if re.search(r"[^aeiouAEIOU'\d]y$", last):
        tail = word(last[:-1]) + "(?:y|ies)"
    else:
        tail = word(last) + "(?:e?s)?"
    body = r"[\s\-]*".join([*(word(w) for w in words[:-1]), tail])
    return re.compile(rf"(?<![{_WORD_CHAR}]){body}(?![{_WORD_CHAR}])", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """`text` without its double-quoted spans, split into sentences (see the module docstring)."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return [s for s in _SENTENCE_END.split(_QUOTED.sub(" ", text)) if s.strip()]


def _flag(name: str, value: object) -> bool:
    return parse_flag(f"dial-profile option {name}", value)


def _lambda(value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"dial-profile option lam={value!r} is not a number in [0, 1]") from None
    return check_lambda(value, name="dial-profile option lam (lambda)")


class DialProfileRanker(Recommender):
    """SteerEval's reference ranker (see the module docstring for the rule and its known answers)."""

    name = "dial-profile"

    def __init__(self, dataset: Dataset, *, lam: float, base: str = "popularity", seed: int | str = 0,
                 **options: Any):
        unknown = sorted(set(options) - set(FLAG_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown dial-profile option(s) {unknown}; options: lam, base, seed, "
                              f"{', '.join(FLAG_OPTIONS)}")
        super().__init__(dataset, **{k: _flag(k, v) for k, v in options.items()})
        self.lam = _lambda(lam)
        if base not in BASES:
            raise ConfigError(f"dial-profile option base={base!r}; choose from {list(BASES)}")
        self.base = base
        self.seed = parse_seed("dial-profile option seed", seed)
        n = len(dataset.items)
        self.base_order, self.base_rank = base_ranking(dataset, base, self.seed)
        self.reader_tags = [t for t in dataset.tags if t not in NON_TAGS]
        self._patterns = [(t, p) for t in self.reader_tags if (p := tag_pattern(t)) is not None]
        column = {t: c for c, t in enumerate(self.reader_tags)}
        tags = dataset.item_tags[dataset.item_tags["tag"].isin(column)]
        self.item_tag_matrix = np.zeros((n, len(self.reader_tags)))
        rows, cols = dataset.indices(tags["item_id"].astype(str)), tags["tag"].map(column).to_numpy()
        self.item_tag_matrix[rows, cols] = 1

    @property
    def identity(self) -> dict:
        return {**super().identity, "lambda": self.lam, "base": self.base, "seed": self.seed,
                "reader": "lexical-tags"}

    # ------------------------------------------------------------------ reading
    def read_profile(self, text: str) -> dict[str, float]:
        """Tag -> summed weight over the sentences of `text` that mention it (module docstring)."""
        weights: dict[str, float] = {}
        for sentence in sentences(str(text)):
            sign = (-1.0 if _CUE.search(sentence) else 1.0) * emphasis(sentence)
            for tag, pattern in self._patterns:
                if pattern.search(sentence):
                    weights[tag] = weights.get(tag, 0.0) + sign
        return weights

    # ------------------------------------------------------------------ profiles
    def template_profile(self, state: UserState) -> str:
        """The deterministic profile written from the state's history (and ratings, when given)."""
        if not state.history:
            raise EmptyHistoryError(f"dial-profile needs a profile or a non-empty history "
                                    f"(user {state.user_id!r})")
        ratings = self._ratings(state)
        idx = self.dataset.indices(state.history)
        order = sorted(range(len(idx)), key=lambda n: -ratings[n]) if ratings is not None else range(len(idx))
        items = self.dataset.items
        titles = []
        for n in list(order)[:MAX_TITLES]:
            row = items.iloc[idx[n]]
            title = f'"{str(row["title"]).replace(chr(34), chr(39))}"'
            year = row["year"]
            titles.append(title if pd.isna(year) else f"{title} ({int(year)})")
        text = f"The user has enjoyed: {', '.join(titles)}."
        counts = self.item_tag_matrix[idx].T @ (np.ones(len(idx)) if ratings is None else np.asarray(ratings))
        liked = [self.reader_tags[c] for c in np.lexsort((np.arange(len(counts)), -counts))
                 if counts[c] > 0][:MAX_TAGS]
        if liked:
            names = liked[0] if len(liked) == 1 else f"{', '.join(liked[:-1])} and {liked[-1]}"
            text += f" The user likes {names} movies."
        return text

    def _ratings(self, state: UserState) -> list[float] | None:
        given = state.attributes.get("ratings")
        if given is None:
            return None
        if isinstance(given, (str, bytes)):
            raise ConfigError(f"attributes['ratings'] must be a sequence of numbers, got {given!r}")
        ratings = list(given)  # type: ignore[call-overload]
        if len(ratings) != len(state.history):
            raise ConfigError(f"attributes['ratings'] has {len(ratings)} values for "
                              f"{len(state.history)} items")
        out = []
        for r in ratings:
            if isinstance(r, bool) or not isinstance(r, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(float(r)):
                raise ConfigError(f"attributes['ratings'] holds {r!r}; ratings are finite numbers")
            out.append(float(r))
        return out

    def profiles(self, states: Sequence[UserState]) -> list[str]:
        """Each state's own profile, else its template profile (module docstring)."""
        return [str(s.profile) if s.profile is not None else self.template_profile(s) for s in states]

    # ------------------------------------------------------------------ scoring
    def affinity(self, profile: str, idx: np.ndarray) -> np.ndarray:
        """a_i = tanh(sum of the profile's weights over item i's tags), for catalogue indices `idx`."""
        read = self.read_profile(profile)
        w = np.array([read.get(t, 0.0) for t in self.reader_tags])
        return np.tanh(self.item_tag_matrix[idx] @ w)

    def base_scores(self, idx: np.ndarray) -> np.ndarray:
        """b_i: the items' ranks among `idx` in the base ranking, scaled to [0, 1] (1 = first).

        Ranks within the pool, not the catalogue: SteerEval's pools hold items of about the same
        popularity, whose catalogue ranks would all scale to nearly the same b."""
        return rank_scale(np.argsort(self.base_rank[idx], kind="stable"))

    def _scores(self, profile: str, idx: np.ndarray) -> np.ndarray:
        return (1.0 - self.lam) * self.base_scores(idx) + self.lam * self.affinity(profile, idx)

    def score_candidates(self, states: Sequence[UserState], candidates: list[np.ndarray]) -> list[np.ndarray]:
        return [self._scores(p, np.asarray(idx, dtype=np.int64))
                for p, idx in zip(self.profiles(states), candidates)]

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        everything = np.arange(len(self.dataset.items))
        return np.stack(self.score_candidates(states, [everything] * len(states)))

