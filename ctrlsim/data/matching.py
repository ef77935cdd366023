"""Match LLM-generated titles to catalogue items (PromptShift section 5.1: "Titles are
normalized for case, punctuation, release year, and common formatting variants
before exact and validation-frozen fuzzy matching").

Normalisation: Unicode accents folded, lower case, "&" read as "and",
punctuation dropped, a trailing release year "(1980)" split off, and articles
moved ("Shining, The" <-> "The Shining", "Postino, Il" <-> "Il Postino").
Catalogue titles with an alternative title in parentheses ("Seven (Se7en)",
"Big Blue, The (Grand bleu, Le)") are indexed under the full title, the main
title and the alternative title.

Track catalogues (an `artist` column, as Last.fm's) are also indexed under
"Artist - Title", the form the music prompt asks for.

Order: exact match on the normalised title (preferring catalogue items whose
year agrees with a generated year, then the more popular item), then the same
without any leading article, then fuzzy matching with rapidfuzz above a
threshold (default 90) among items whose year does not contradict a generated
year by more than one. Titles that match nothing are kept as `Match` with
`item_id=None`, and `match_counts` counts every kind.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Sequence

import pandas as pd

from ctrlsim.errors import ConfigError, MissingDependencyError

# Articles that catalogues (MovieLens) move behind the title: "Shining, The", "Postino, Il", "Uomo, L'".
ARTICLES = ("the", "a", "an", "il", "la", "le", "les", "l'", "der", "die", "das", "det", "den", "el", "los",
            "las", "lo", "un", "une")
_ARTICLE_ALT = "|".join(re.escape(a) for a in sorted(ARTICLES, key=len, reverse=True))
_TRAILING_ARTICLE = re.compile(rf"^(?P<body>.+?),\s*(?P<art>{_ARTICLE_ALT})$", re.IGNORECASE)
# Leading words dropped for the article-free fallback key (on normalised keys, so "l'" is "l").
# German articles are left alone: "Die Hard" must not become "hard".
_BARE_ARTICLES = frozenset({"the", "a", "an", "il", "la", "le", "les", "l", "el", "los", "las", "lo", "un",
                            "une"})
_YEAR_TAIL = re.compile(r"\s*[\(\[]\s*(?P<year>(?:18|19|20)\d{2})\s*[\)\]]\s*$")
_PAREN_TAIL = re.compile(r"^(?P<main>.+?)\s*\((?P<alt>[^()]+)\)\s*$")

MATCH_KINDS = ("exact", "exact_title", "no_article", "fuzzy", "none")


@dataclass(frozen=True)
class Match:
    """One generated title and where it landed.

    kind: "exact" (normalised title and year agree, or no year was generated),
    "exact_title" (normalised title agrees, the year does not), "no_article"
    (agrees once leading articles are dropped), "fuzzy" (rapidfuzz score >=
    threshold), "none" (unmatched; `item_id` is None).
    """

    title: str
    item_id: str | None
    kind: str
    score: float = 0.0
    year: int | None = None

    @property
    def matched(self) -> bool:
        return self.item_id is not None


# ------------------------------------------------------------------ normalising
def split_year(title: str) -> tuple[str, int | None]:
    """("Shining, The (1980)") -> ("Shining, The", 1980); no trailing year -> (title, None)."""
    title = title.strip()
    m = _YEAR_TAIL.search(title)
    if m and m.start() > 0:
        return title[: m.start()].strip(), int(m.group("year"))
    return title, None


def natural_order(title: str) -> str:
    """Move a trailing article to the front: "Shining, The" -> "The Shining", "Uomo, L'" -> "L'Uomo".

    Applied to the main title and to a parenthesised alternative title separately.
    """
    title = title.strip()
    m = _PAREN_TAIL.match(title)
    if m:
        return f"{natural_order(m.group('main'))} ({natural_order(m.group('alt'))})"
    m = _TRAILING_ARTICLE.match(title)
    if not m:
        return title
    art = m.group("art")
    sep = "" if art.endswith("'") else " "
    return f"{art}{sep}{m.group('body')}"


def display_title(title: str, year=None) -> str:
    """How a catalogue item is written in a prompt: natural article order plus "(Year)" where known."""
    text = natural_order(title)
    if year is not None and not pd.isna(year):
        text += f" ({int(year)})"
    return text


def track_display(title: str, artist) -> str:
    """How a track is written in a prompt and by the LLM: "Artist - Title".

    The Last.fm loader stores a track's title as "Title by Artist"; that suffix is dropped.
    """
    title = str(title)
    if artist is None or pd.isna(artist) or not str(artist):
        return title
    suffix = f" by {artist}"
    track = title[: -len(suffix)] if title.endswith(suffix) and len(title) > len(suffix) else title
    return f"{artist} - {track}"


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in text if not unicodedata.combining(ch))


def normalize_title(title: str) -> str:
    """Canonical key: year dropped, articles in front, accents folded, lower case, no punctuation."""
    body, _ = split_year(title)
    body = natural_order(_fold(body)).lower().replace("&", " and ")
    body = re.sub(r"(?<=\w)'(?=\w)", "", body)            # "don't" -> "dont"
    body = re.sub(r"(?<=\bl)'", " ", body)                  # "l'uomo" -> "l uomo"
    body = re.sub(r"[^\w\s]", " ", body)
    body = re.sub(r"_", " ", body)
    return re.sub(r"\s+", " ", body).strip()


def strip_article(key: str) -> str:
    """A normalised key without its leading article ("the shining" -> "shining")."""
    head, _, rest = key.partition(" ")
    return rest if head in _BARE_ARTICLES and rest else key


def title_variants(title: str) -> list[str]:
    """Normalised keys a catalogue title is found under: full, main title, alternative title."""
    body, _ = split_year(title)
    keys = [normalize_title(body)]
    m = _PAREN_TAIL.match(body)
    if m:
        keys += [normalize_title(m.group("main")), normalize_title(m.group("alt"))]
    return [k for n, k in enumerate(keys) if k and k not in keys[:n]]


# ------------------------------------------------------------------- matcher
class TitleMatcher:
    """Maps generated titles to catalogue item ids.

    `items` is a Dataset's item table (item_id, title, year, popularity).
    `threshold` is the rapidfuzz score (0-100) a fuzzy match needs; `scorer`
    a name in `rapidfuzz.fuzz` (default token_sort_ratio, which ignores word
    order). `fuzzy=False` turns fuzzy matching off.
    """

    def __init__(self, items: pd.DataFrame, *, threshold: float = 90.0, scorer: str = "token_sort_ratio",
                 fuzzy: bool = True):
        if not 0 <= threshold <= 100:
            raise ConfigError(f"fuzzy threshold must be in [0, 100], got {threshold}")
        try:
            from rapidfuzz import fuzz, process
        except ImportError as exc:  # a core dependency; reported like an optional one if missing
            raise MissingDependencyError("rapidfuzz", "all", "fuzzy title matching") from exc
        if not hasattr(fuzz, scorer):
            raise ConfigError(f"unknown rapidfuzz scorer {scorer!r}")
        self._process, self._scorer = process, getattr(fuzz, scorer)
        self.threshold, self.scorer_name, self.fuzzy = float(threshold), scorer, fuzzy
        self._year: dict[str, int | None] = {}
        self._pop: dict[str, int] = {}
        self._order: dict[str, int] = {}
        self._exact: dict[str, list[str]] = {}
        self._bare: dict[str, list[str]] = {}
        pops = items["popularity"] if "popularity" in items else pd.Series(0, index=items.index)
        artists = items["artist"] if "artist" in items else pd.Series(None, index=items.index, dtype=object)
        rows = zip(items["item_id"], items["title"], items["year"], pops, artists)
        for n, (iid, title, year, pop, artist) in enumerate(rows):
            iid = str(iid)
            self._year[iid] = None if pd.isna(year) else int(year)
            self._pop[iid] = int(pop)
            self._order[iid] = n
            keys = title_variants(str(title))
            if artist is not None and not pd.isna(artist):
                keys.append(normalize_title(track_display(title, artist)))
            for key in dict.fromkeys(k for k in keys if k):
                self._exact.setdefault(key, []).append(iid)
                self._bare.setdefault(strip_article(key), []).append(iid)
        self._keys = list(self._exact)
        self._memo: dict[tuple[str, int | None], Match] = {}

    @property
    def config(self) -> dict:
        return {"threshold": self.threshold, "scorer": self.scorer_name, "fuzzy": self.fuzzy}

    def _best(self, ids: Iterable[str], year: int | None) -> tuple[str, bool]:
        """Among equally good candidates: year agreement first, then popularity, then catalogue order."""
        ids = list(dict.fromkeys(ids))
        agree = [i for i in ids if year is not None and self._year[i] == year]
        pool = agree or ids
        best = min(pool, key=lambda i: (-self._pop[i], self._order[i]))
        return best, bool(agree) or year is None

    def match(self, title: str) -> Match:
        """Match one generated title ("The Shining (1980)", "Shining, The", "shining")."""
        raw = title.strip()
        body, year = split_year(raw)
        key = normalize_title(body)
        memo_key = (key, year)
        if memo_key in self._memo:
            hit = self._memo[memo_key]
            return Match(raw, hit.item_id, hit.kind, hit.score, year)
        result = self._match_key(raw, key, year)
        self._memo[memo_key] = result
        return result

    def _match_key(self, raw: str, key: str, year: int | None) -> Match:
        if not key:
            return Match(raw, None, "none", 0.0, year)
        ids = self._exact.get(key)
        if ids:
            best, agrees = self._best(ids, year)
            return Match(raw, best, "exact" if agrees else "exact_title", 100.0, year)
        ids = self._bare.get(strip_article(key))
        if ids:
            best, _ = self._best(ids, year)
            return Match(raw, best, "no_article", 100.0, year)
        if self.fuzzy:
            found = self._process.extract(key, self._keys, scorer=self._scorer, score_cutoff=self.threshold,
                                          limit=5)
            # A fuzzy match must not contradict a generated year ("The Little Prince (1959)" is not
            # "Little Princess, A (1995)"); items without a year, or a year off by one, are accepted.
            scored = [(score, i) for choice, score, _ in found for i in self._exact[choice]
                      if self._year_agrees(self._year[i], year)]
            if scored:
                top = max(score for score, _ in scored)
                best, _ = self._best([i for score, i in scored if score == top], year)
                return Match(raw, best, "fuzzy", float(top), year)
        return Match(raw, None, "none", 0.0, year)

    @staticmethod
    def _year_agrees(known: int | None, generated: int | None) -> bool:
        return known is None or generated is None or abs(known - generated) <= 1

    def match_many(self, titles: Sequence[str]) -> list[Match]:
        return [self.match(t) for t in titles]


def match_counts(matches: Iterable[Match]) -> dict[str, int]:
    """How many titles matched by each kind, plus "matched", "unmatched" and "total"."""
    counts = {kind: 0 for kind in MATCH_KINDS}
    for m in matches:
        counts[m.kind] += 1
    total = sum(counts.values())
    counts.update(matched=total - counts["none"], unmatched=counts["none"], total=total)
    return counts


__all__ = ["ARTICLES", "MATCH_KINDS", "Match", "TitleMatcher", "display_title", "match_counts",
           "natural_order", "normalize_title", "split_year", "strip_article", "title_variants",
           "track_display"]
