"""The probe validity card (issue 42): each probe method's adherence and fidelity, from its records.

Every runner that plays probe episodes stores, per episode, the decisions of the two fixed checks and
of the box's own slates (`ctrlsim.agents.episode.validity_record`). This module pools them per method
over all its episodes and prints the "Probe validity" table; a method whose check-adherence interval
does not lie above 0 is marked (`FAIL_MARK`) in every table row that reports it, because what it
measured cannot be told from what a probe that ignores its goal would measure.

A cluster of the bootstrap is one probe in one episode (all it decided there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from ctrlsim.metrics import validity as V
from ctrlsim.metrics.stats import Estimate, format_estimate

FAIL_MARK = "†"
MIN_SLATE_TARGETS = 5  # fewer target items on the box's slates leave adherence on slates undefined
FAIL_NOTE = (
    f"{FAIL_MARK} the method failed its validity card: its adherence interval on the fixed check "
    "does not lie above 0, so it cannot be told from a probe that ignores its goal; its differences "
    "are not evidence about the box."
)


@dataclass(frozen=True)
class Card:
    method: str
    label: str
    episodes: int
    adherence: V.AdherenceCard
    slate_adherence: V.AdherenceCard
    fidelity: Estimate
    fidelity_n: int
    relevance: Estimate
    parse_failures: int
    decisions: int

    @property
    def has_check(self) -> bool:
        return self.adherence.n_target + self.adherence.n_other > 0

    @property
    def passes(self) -> bool:
        return self.adherence.passes

    @property
    def verdict(self) -> str:
        if not self.has_check:
            return "no check stored"
        if not self.adherence.defined or np.isnan(self.adherence.adherence.low):
            return "undefined (one probe episode or one kind of item)"
        return "passes" if self.passes else f"FAILS {FAIL_MARK}: interval contains 0 or lies below it"

    def to_dict(self) -> dict:
        def est(e: Estimate) -> dict:
            return {
                k: (None if not np.isfinite(v) else float(v))
                for k, v in (("value", e.value), ("low", e.low), ("high", e.high))
            } | {"n": e.n}

        return {
            "method": self.method,
            "label": self.label,
            "episodes": self.episodes,
            "passes": self.passes,
            "verdict": self.verdict,
            "adherence": est(self.adherence.adherence)
            | {
                "like_target": _num(self.adherence.like_target),
                "like_other": _num(self.adherence.like_other),
                "n_target": self.adherence.n_target,
                "n_other": self.adherence.n_other,
            },
            "slate_adherence": est(self.slate_adherence.adherence)
            | {
                "like_target": _num(self.slate_adherence.like_target),
                "like_other": _num(self.slate_adherence.like_other),
                "n_target": self.slate_adherence.n_target,
                "n_other": self.slate_adherence.n_other,
            },
            "fidelity_auc": est(self.fidelity) | {"decisions": self.fidelity_n},
            "relevance": est(self.relevance),
            "parse_failures": self.parse_failures,
            "decisions": self.decisions,
        }


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def _cluster(record: dict, probe: str) -> str:
    return "|".join(str(record.get(k)) for k in ("method", "recommender", "target", "seed")) + "|" + probe


def _check_cluster(record: dict, probe: str) -> str:
    """The fixed checks never touch the box: one probe of one (method, target, seed) takes the same
    check in every box's episode, so the check's cluster leaves the box out."""
    return "|".join(str(record.get(k)) for k in ("method", "target", "seed")) + "|" + probe


def card_for(method: str, records: list[dict], *, seed: int = 0) -> Card:
    """One method's card from its episode records (records without `validity` contribute nothing).

    A fixed-check decision repeated in several boxes' episodes (same probe, target, seed and item)
    counts once: counting it per box would shrink the interval without new evidence."""
    check, slates, fidelity = [], [], []
    seen: set[tuple[str, str, str]] = set()

    def first(kind: str, cluster: str, item) -> bool:
        key = (kind, cluster, str(item))
        if key in seen:
            return False
        seen.add(key)
        return True

    parse_failures = decisions = 0
    for r in records:
        v = r.get("validity") or {}
        check += [(c, d["target"], d["liked"]) for d in v.get("check", [])
                  if first("check", c := _check_cluster(r, d["probe"]), d["item"])]
        fidelity += [
            (c, d["rating"] >= 4, float(d["liked"]))
            for d in v.get("fidelity_check", [])
            if (d["rating"] >= 4 or d["rating"] <= 2)
            and first("fidelity", c := _check_cluster(r, d["probe"]), d["item"])
        ]
        # the check's parse failures repeat on every box it replays on: count them once per episode cluster
        checked = first("parse", _check_cluster(r, ""), "")
        parse_failures += int(v.get("check_parse_failures", 0)) * checked
        parse_failures += int(r.get("parse_failures", 0) or 0)
        decisions += int(r.get("decisions", 0) or 0)
        for c in v.get("slate_decisions", []):  # per probe: targets and others shown and liked
            cluster = _cluster(r, c["probe"])
            for kind, is_target in (("target", True), ("other", False)):
                liked, shown = int(c[f"{kind}_liked"]), int(c[f"{kind}_shown"])
                slates += [(cluster, is_target, True)] * liked + [(cluster, is_target, False)] * (
                    shown - liked
                )
    label = records[0].get("label", method) if records else method

    def card(rows):
        return V.adherence_card(
            [c for c, _, _ in rows], [t for _, t, _ in rows], [x for _, _, x in rows], seed=seed
        )

    relevance = _pooled_relevance(records, seed)
    return Card(
        method,
        label,
        len(records),
        card(check),
        card(slates),
        V.fidelity_auc(
            [c for c, _, _ in fidelity], [p for _, p, _ in fidelity], [s for _, _, s in fidelity], seed=seed
        ),
        len(fidelity),
        relevance,
        parse_failures,
        decisions,
    )


def _pooled_relevance(records: list[dict], seed: int) -> Estimate:
    """The relevance share pooled over episodes: each episode's share weighted by its likes is not
    stored per like, so the pooled share is the episodes' relevant likes over their likes, with a
    bootstrap over episodes."""
    counts = [((r.get("validity") or {}).get("relevance") or {}) for r in records]
    rows: list[tuple[str, bool]] = []
    for r, c in zip(records, counts):
        n, relevant = int(c.get("likes") or 0), int(c.get("relevant") or 0)
        cluster = _cluster(r, "episode")
        rows += [(cluster, True)] * relevant + [(cluster, False)] * (n - relevant)
    return V.share_ci([c for c, _ in rows], [h for _, h in rows], seed=seed)


def cards(records: Iterable[dict]) -> dict[str, Card]:
    """method -> its card, in first-seen order."""
    by_method: dict[str, list[dict]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    return {m: card_for(m, recs) for m, recs in by_method.items()}


def _interval(e: Estimate, digits: int = 2) -> str:
    """A bootstrap estimate with its (asymmetric) bounds: "0.62 [0.54, 0.67]"."""
    return format_estimate(e, digits=digits, bounds=True, missing="undefined")


def _rates(c: V.AdherenceCard) -> str:
    def pct(x):
        return "-" if not np.isfinite(x) else f"{100 * x:.0f}%"

    return f"{pct(c.like_target)} / {pct(c.like_other)} ({c.n_target} / {c.n_other})"


VALIDITY_TITLE = "Probe validity (does each method act on its goal and play its user?)"


def validity_table(found: Mapping[str, Card], title: str = VALIDITY_TITLE):
    """The "Probe validity" table (a `tables.Table`): one row per method, the definitions after it,
    and `FAIL_NOTE` where a method failed its card."""
    from ctrlsim.experiments.tables import Table

    header = [
        "Method",
        "Episodes",
        "Adherence",
        "Likes: target / other (n)",
        "Adherence on slates",
        "Slate likes: target / other (n)",
        "Fidelity AUC",
        "Relevance",
        "Parse failures",
        "Card",
    ]
    rows = []
    for c in found.values():
        slate = (
            _interval(c.slate_adherence.adherence)
            if c.slate_adherence.n_target >= MIN_SLATE_TARGETS
            else f"undefined (the box showed {c.slate_adherence.n_target} targets)"
        )
        fidelity = _interval(c.fidelity) + f" ({c.fidelity_n})" if c.fidelity_n else "no source users"
        rows.append(
            [
                c.label,
                c.episodes,
                _interval(c.adherence.adherence),
                _rates(c.adherence),
                slate,
                _rates(c.slate_adherence),
                fidelity,
                _interval(c.relevance),
                f"{c.parse_failures}",
                c.verdict,
            ]
        )
    note = (
        "Adherence = P(like | target) - P(like | other) on the fixed check (the same slates for every "
        f"box, decided by each probe as it starts) and on the box's own slates (undefined below "
        f"{MIN_SLATE_TARGETS} targets shown); Fidelity AUC = liking the source user's items rated >= 4 "
        "over those rated <= 2, goal hidden (0.5 = chance); Relevance = share of likes whose tags meet "
        "the persona's interests or seed items. 95% percentile cluster-bootstrap intervals, a cluster = "
        "one probe in one episode. A card passes when the adherence interval lies above 0."
    )
    if any(c.has_check and not c.passes for c in found.values()):
        note += "\n\n" + FAIL_NOTE
    return Table.of(title, [[str(x) for x in row] for row in rows], header, after=note)


def marked_records(records: Mapping[str, dict], found: Mapping[str, Card]) -> dict[str, dict]:
    """The records with each failing method's label marked, so every table row shows it."""
    failing = {m for m, c in found.items() if c.has_check and not c.passes}
    return {
        k: ({**r, "label": f"{r.get('label', r['method'])} {FAIL_MARK}"} if r["method"] in failing else r)
        for k, r in records.items()
    }
