"""A PromptShift list generator whose dependence on the identity cue is known: the dial generator.

`DialListGenerator` stands where `LLMListGenerator` does (`PromptShiftEngine(..., generator=...)`)
but runs no LLM: it writes catalogue titles by a fixed rule with one knob lambda in [0, 1], the
share of the cued list that follows the cue. It is a reference for the protocol: at lambda = 0
the cue changes nothing (Cue Drift, SliceShift and Delta d are 0 for every user and scenario), at
lambda = 1 the cued list is the slice's most over-represented items.

Spec string (`make_list_generator`): ``dial:<lambda>``, e.g. ``dial:0.5``; no options are defined.

The rule, for one request (history titles, prompt condition) and list length N:

* History. The history titles are mapped back to catalogue items by their prompt titles
  (`ctrlsim.recommenders.promptshift.data.prompt_titles`: "Title (Year)" for movies, "Artist -
  Title" for tracks), the way `UserProfile.history_titles` writes them. A title that several
  catalogue items share (ml-100k lists a few movies twice) stands for all of them; a title no
  item has is a `ConfigError` naming it.
* Listable items. Only items whose prompt title the engine's `TitleMatcher` maps back to the same
  item with kind "exact" are ever listed, so every generated title lands on the intended item
  (ml-100k: 20 of 1682 items are left out, the second copy of each duplicated title and two
  titles that another item's alternative title or a missing year captures). History items
  are never listed.
* L^0, for every condition without a cue (history-only and the paraphrases P1-P3 alike: the
  generator is wording-blind, so each paraphrase list equals L^0 and Paraphrase Drift is 0):
  the N listable items with the highest tag affinity to the history, the cosine between an
  item's tag (genre) multi-hot vector and the sum of the history's vectors (a shared title
  adds the mean vector of its items), rounded to 12 decimals; ties by popularity, the item's
  fit-period positive users in the slice table's "*" column (`data.table.counts`), then by
  catalogue order.
* A cued list for slice g (a condition with `cue=g`, any instruction): start from L^0 and give
  the positions i (0-based) with floor((i+1) lambda) > floor(i lambda), an evenly spread share
  lambda of every prefix (floor(m lambda) of the first m positions), in order to the items with
  the largest Delta phi(i, g) = phi(i, g) - phi(i, "*") of the slice table (ties as above),
  skipping history items, unlistable items and the items L^0 keeps at the other positions.
  lambda is read as the decimal it is written as (0.57 is 57/100 exactly), so the positions
  have no rounding error; a catalogue too small to fill a position drops it. lambda = 0 gives
  L^0 itself; lambda = 1 gives the top N listable non-history items by Delta phi(., g).

Each list comes back as a `GeneratedList` with the items' prompt titles, the numbered list as
its text, no tokens, `raw_count` = the number of titles, no error and `cached` False.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np

from ctrlsim.data.matching import TitleMatcher
from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import STAR
from ctrlsim.recommenders.dial import check_lambda, format_lambda, parse_dial_spec
from ctrlsim.recommenders.promptshift.data import PromptShiftData, prompt_titles
from ctrlsim.recommenders.promptshift.defaults import N_CANDIDATES
from ctrlsim.recommenders.promptshift.generation import DOMAINS, GeneratedList, PromptCondition

RULE = ("L^0 (no cue; the paraphrases alike): top n listable non-history items by tag cosine to the "
        "summed history tag vectors, ties by fit popularity ('*' counts) then catalogue order; cue g: "
        "L^0 with positions i where floor((i+1)*lambda) > floor(i*lambda) replaced, in order, by the "
        "items of largest Delta phi(i, g) not in the history or kept in the list")


def substituted_positions(n: int, lam: float) -> list[int]:
    """0-based positions i < n the cue takes over: floor((i+1) lambda) > floor(i lambda).

    lambda is taken as the decimal its float repr writes, so e.g. 0.57 * 100 is exactly 57.
    """
    exact = Fraction(repr(check_lambda(lam)))
    return [i for i in range(n) if (i + 1) * exact // 1 > i * exact // 1]


def tag_vectors(data: PromptShiftData) -> np.ndarray:
    """Unit-norm tag multi-hot vectors, one row per catalogue item (all zero for an untagged item)."""
    dataset = data.dataset
    tags = dataset.item_tags
    index = {t: c for c, t in enumerate(sorted(set(tags["tag"])))}
    vectors = np.zeros((len(dataset.items), len(index)))
    if len(tags):
        vectors[dataset.indices(tags["item_id"].astype(str)), tags["tag"].map(index).to_numpy()] = 1.0
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


class DialListGenerator:
    """PromptShift lists of known cue dependence lambda (see the module docstring for the rule)."""

    def __init__(self, data: PromptShiftData, lam: float, *, n: int = N_CANDIDATES, domain: str = "movies"):
        self.lam = check_lambda(lam)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(f"n must be an integer >= 1, got {n!r}")
        if domain not in DOMAINS:
            raise ConfigError(f"unknown domain {domain!r}; choose from {DOMAINS}")
        self.data, self.n, self.domain = data, int(n), domain
        dataset = data.dataset
        ids = [str(i) for i in dataset.item_ids]
        if [str(i) for i in data.table.item_ids.tolist()] != ids:
            raise ConfigError("the slice table's rows are not the dataset's catalogue order")
        self.item_ids = ids
        self.titles = prompt_titles(dataset, ids)
        self._rows_of_title: dict[str, list[int]] = {}
        for row, title in enumerate(self.titles):
            self._rows_of_title.setdefault(title, []).append(row)
        # Listable: the engine's matcher sends the item's own title back to it, exactly.
        matcher = TitleMatcher(dataset.items, fuzzy=False)
        self.listable = np.array([m.item_id == iid and m.kind == "exact"
                                  for iid, m in zip(ids, matcher.match_many(self.titles))], dtype=bool)
        self.vectors = tag_vectors(data)
        self.popularity = data.table.counts[:, data.table.column(STAR)].astype(np.int64)
        self.positions = substituted_positions(self.n, self.lam)
        self._slice_order: dict[str, np.ndarray] = {}

    @property
    def config(self) -> dict:
        return {"generator": "dial", "lambda": self.lam, "n": self.n, "rule": RULE}

    @property
    def name(self) -> str:
        return f"dial:{format_lambda(self.lam)}"

    # ------------------------------------------------------------ pieces
    def history_rows(self, history: Sequence[str]) -> list[list[int]]:
        """Catalogue rows of each history title (several for a shared title); unknown titles raise."""
        unknown = [t for t in history if t not in self._rows_of_title]
        if unknown:
            raise ConfigError(f"history titles not in the catalogue of {self.data.dataset.name!r}: "
                              f"{unknown[:5]}")
        return [self._rows_of_title[t] for t in history]

    def _ranked(self, score: np.ndarray) -> np.ndarray:
        """Rows by score (descending), ties by popularity (descending), then catalogue order."""
        rows = np.arange(len(score))
        return np.lexsort((rows, -self.popularity, -score))

    def reference_rows(self, history: Sequence[str]) -> list[int]:
        """L^0 as catalogue rows: the top n listable non-history items by tag affinity."""
        groups = self.history_rows(history)
        query = np.zeros(self.vectors.shape[1])
        for rows in groups:
            query += self.vectors[rows].mean(axis=0)
        norm = float(np.linalg.norm(query))
        affinity = self.vectors @ (query / norm) if norm > 0 else np.zeros(len(self.item_ids))
        allowed = self._allowed(groups)
        return [int(r) for r in self._ranked(np.round(affinity, 12)) if allowed[r]][: self.n]

    def slice_order(self, slice_id: str) -> np.ndarray:
        """Catalogue rows by Delta phi(., g) = phi(., g) - phi(., *), largest first (ties as L^0's)."""
        if slice_id not in self._slice_order:
            table = self.data.table
            delta = table.phi[:, table.column(slice_id)] - table.phi[:, table.column(STAR)]
            self._slice_order[slice_id] = self._ranked(delta)
        return self._slice_order[slice_id]

    def cued_rows(self, history: Sequence[str], slice_id: str) -> list[int]:
        """L^0 with the substituted positions given, in order, to the slice's top Delta phi items."""
        reference = self.reference_rows(history)
        allowed = self._allowed(self.history_rows(history))
        subs = [i for i in self.positions if i < len(reference)]
        kept = set(reference) - {reference[i] for i in subs}
        out: list[int | None] = list(reference)
        candidates = (int(r) for r in self.slice_order(slice_id) if allowed[r] and int(r) not in kept)
        for i in subs:
            out[i] = next(candidates, None)  # None only when the catalogue runs out: the slot is dropped
        return [r for r in out if r is not None]

    def _allowed(self, groups: list[list[int]]) -> np.ndarray:
        allowed = self.listable.copy()
        for rows in groups:
            allowed[rows] = False
        return allowed

    # ------------------------------------------------------------ interface
    def rows_for(self, history: Sequence[str], condition: PromptCondition) -> list[int]:
        """The list's catalogue rows: L^0 without a cue, the cued list with one."""
        if condition.cue is None:
            return self.reference_rows(history)
        return self.cued_rows(history, condition.cue)

    def generate(self, requests: Sequence[tuple[Sequence[str], PromptCondition]]) -> list[GeneratedList]:
        """One list per (history titles, condition) request, by the dial rule (no LLM)."""
        out = []
        for history, condition in requests:
            titles = [self.titles[r] for r in self.rows_for(list(history), condition)]
            text = "\n".join(f"{k}. {t}" for k, t in enumerate(titles, 1))
            out.append(GeneratedList(condition.name, titles, text, 0, 0, len(titles), None, False))
        return out


def make_list_generator(spec: str, data: PromptShiftData, *, n: int = N_CANDIDATES) -> DialListGenerator:
    """The list generator a spec names: ``dial:<lambda>`` (no options are defined)."""
    parsed = parse_dial_spec(spec)
    if parsed.kind != "dial":
        raise ConfigError(f"{spec!r}: PromptShift list generators are dial:<lambda>, not {parsed.kind}:")
    if parsed.options:
        raise ConfigError(f"{spec!r}: unknown list generator options {sorted(parsed.options)}; "
                          "dial:<lambda> takes none")
    return DialListGenerator(data, parsed.lam, n=n, domain=data.domain)


__all__ = ["DialListGenerator", "RULE", "make_list_generator", "substituted_positions", "tag_vectors"]
