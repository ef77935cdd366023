"""`keyword-bm25`: an LLM writes search keywords from the history; BM25 retrieves the slate.

The CtrlBench-Rec paper describes this black box (Qwen writes keywords, BM25
recalls items) without a prompt or parameters; the choices made here:
- the prompt lists the last `history_items` (default 10) liked items as
  "Title (Year), (Genres)" plus the profile when the state has one, and asks
  for `n_keywords` (default 8) comma-separated keywords: genres, themes, moods,
  settings; no titles or explanations;
- the reply is split on commas/newlines, list markers stripped, lower-cased,
  deduplicated, truncated to `n_keywords`; a reply with no keyword raises
  `LLMOutputError`;
- BM25 (bm25s, Lucene variant, k1=1.5, b=0.75, English stop words) indexes each
  item's text: title, year, genres/tags and description where present;
- items with equal BM25 score are ordered by popularity (a tiny tie-breaker),
  so a query that matches nothing returns popular items, not catalogue order.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from ctrlsim.backends import LLM, resolve_llm
from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError, EmptyHistoryError, LLMOutputError
from ctrlsim.recommenders.base import Recommender, UserState
from ctrlsim.recommenders.search import CatalogueSearch

KEYWORD_PROMPT = (
    "A user liked these movies (most recent last):\n{items}\n{profile}"
    "Write {n} search keywords that describe what this user wants to watch next: genres, themes, moods, "
    "settings or styles. Do not write movie titles. Output only the keywords, separated by commas."
)
_MARKER = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s*")


def parse_keywords(text: str, limit: int) -> list[str]:
    """Comma/newline separated keywords, cleaned; raises LLMOutputError if none."""
    words = []
    for part in re.split(r"[,\n;]", text):
        part = _MARKER.sub("", part).strip().strip("\"'.").lower()
        if part and len(part) <= 60 and part not in words:
            words.append(part)
    if not words:
        raise LLMOutputError("no search keywords in the LLM reply", text)
    return words[:limit]


class KeywordBM25Recommender(Recommender):
    name = "keyword-bm25"

    def __init__(self, dataset: Dataset, *, llm: LLM | str = "qwen2.5-1.5b", n_keywords: int = 8,
                 history_items: int = 10, k1: float = 1.5, b: float = 0.75, **options):
        super().__init__(dataset, **options)
        if n_keywords < 1 or history_items < 1:
            raise ConfigError("n_keywords and history_items must be >= 1")
        self.llm = resolve_llm(llm)
        self.n_keywords, self.history_items, self.k1, self.b = n_keywords, history_items, k1, b
        self.search = CatalogueSearch(dataset, k1=k1, b=b)
        self.last_keywords: list[list[str]] = []  # what the LLM wrote for the last batch (for logs)

    @property
    def identity(self) -> dict:
        return {**super().identity, "llm": self.llm.identity, "n_keywords": self.n_keywords,
                "history_items": self.history_items, "bm25": {"k1": self.k1, "b": self.b, "method": "lucene"}}

    def keyword_prompt(self, state: UserState) -> list[dict]:
        if not state.history and not state.profile:
            raise EmptyHistoryError(f"keyword-bm25 needs a history or a profile (user {state.user_id!r})")
        texts = self.dataset.items["text"].to_numpy()
        recent = state.history[-self.history_items:]
        items = "\n".join(f"- {texts[i]}" for i in self.dataset.indices(recent)) or "- (none yet)"
        profile = f"\nAbout the user: {state.profile}\n\n" if state.profile else "\n"
        prompt = KEYWORD_PROMPT.format(items=items, profile=profile, n=self.n_keywords)
        return [{"role": "user", "content": prompt}]

    def keywords(self, states: Sequence[UserState]) -> list[list[str]]:
        replies = self.llm.chat([self.keyword_prompt(s) for s in states], max_tokens=64, temperature=0.0)
        return [parse_keywords(r.text, self.n_keywords) for r in replies]

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        self.last_keywords = self.keywords(states)
        return np.stack([self.search.scores(" ".join(words)) for words in self.last_keywords])
