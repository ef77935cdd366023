"""PromptShift's slice table and metrics (Gan & Dong, sections 4.2-4.4 and 5.4) as pure functions.

Everything here is numpy only. Items are catalogue item ids (str); `None`
stands for a generated title that matched no catalogue item. The rules for
unmatched items (the paper matches titles to the catalogue before any metric):

- `delta_phi` / `SliceTable.phi_of` give NaN for them (they have no slice row);
- `mean_delta_phi` (and so `slice_shift`) follows the formula literally,
  mean over the whole list with |L| in the denominator, and an unmatched item
  contributes 0, i.e. no slice-relative popularity ("receive no inverse
  slice-popularity contribution", section 4.5); `unmatched="skip"` averages over
  matched items only instead;
- `difficulty_at_k` can never credit them: they are not catalogue items, so
  they are never held-out positives.

Notation: n(i, g) distinct positive users of item i in slice g;
phi~(i, g) = n(i, g) / max_j n(j, g); lambda_g = min(1, |U_g| / 30);
phi(i, g) = lambda_g phi~(i, g) + (1 - lambda_g) phi~(i, *), with "*" the
all-user column (for which phi = phi~).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.ranking import drift, hit_rate_at_k, mrr_at_k, ndcg_at_k

STAR = "*"          # the all-user reference column
# Codes of a candidate slot written as a slice-table row (rows are >= 0): the
# generated title matched no catalogue item, or the LLM gave fewer than N titles.
UNMATCHED_SLOT, EMPTY_SLOT = -1, -2
SHRINKAGE_USERS = 30.0  # lambda_g = min(1, |U_g| / 30)  (section 4.2)
RHO = 0.2           # Difficulty@K rank bonus (section 5.1)


@dataclass(frozen=True, eq=False)
class SliceTable:
    """The identity-slice-by-item table built from fit-period positives.

    Attributes:
        item_ids: catalogue item ids; row r of every matrix is item_ids[r].
        slice_ids: column ids, the slices in the order given and "*" last.
        sizes: |U_g| per column (slice members; all users for "*").
        counts: n(i, g), shape (items, columns).
        phi_tilde: max-normalised counts (a column with no positives is all 0).
        shrinkage: lambda_g per column (1 for "*").
        phi: shrunk slice-conditioned popularity phi(i, g).
    """

    item_ids: np.ndarray
    slice_ids: tuple[str, ...]
    sizes: np.ndarray
    counts: np.ndarray
    phi_tilde: np.ndarray
    shrinkage: np.ndarray
    phi: np.ndarray

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, user_ids: Sequence[str], item_ids: Sequence[str], memberships: Mapping[str, Iterable[str]],
              catalogue: Sequence[str] | None = None, *, all_users: Iterable[str] | None = None,
              shrinkage_users: float = SHRINKAGE_USERS) -> "SliceTable":
        """Build from positive interactions given as parallel `user_ids`, `item_ids` arrays.

        `memberships` maps slice id -> user ids (a user may sit in one slice of
        each scenario). |U_g| is the number of members given. `all_users` are
        the users behind "*" (default: every user with a positive). Repeated
        (user, item) pairs count once. `catalogue` fixes the row order (default:
        sorted ids of the positives); positives on items outside it raise.
        """
        users = np.asarray([str(u) for u in user_ids], dtype=object)
        items = np.asarray([str(i) for i in item_ids], dtype=object)
        if users.shape != items.shape:
            raise ConfigError(f"user_ids and item_ids differ in length: {len(users)} vs {len(items)}")
        if STAR in memberships:
            raise ConfigError(f"slice id {STAR!r} is reserved for the all-user column")
        if shrinkage_users <= 0:
            raise ConfigError(f"shrinkage_users must be > 0, got {shrinkage_users}")
        cat = np.asarray(sorted(set(items.tolist())) if catalogue is None else [str(i) for i in catalogue],
                         dtype=object)
        row = {iid: r for r, iid in enumerate(cat)}
        if len(row) != len(cat):
            raise ConfigError("catalogue has duplicate item ids")
        unknown = [i for i in set(items.tolist()) if i not in row]
        if unknown:
            raise ConfigError(f"positives on items outside the catalogue: {sorted(unknown)[:5]}")

        pairs = sorted(set(zip(users.tolist(), items.tolist())))  # distinct positive (user, item)
        slice_ids = tuple(str(g) for g in memberships) + (STAR,)
        members = [set(str(u) for u in memberships[g]) for g in memberships]
        everyone = set(str(u) for u in all_users) if all_users is not None else {u for u, _ in pairs}
        members.append(everyone)
        counts = np.zeros((len(cat), len(slice_ids)), dtype=np.int64)
        user_cols: dict[str, list[int]] = {}
        for col, group in enumerate(members):
            for u in group:
                user_cols.setdefault(u, []).append(col)
        for u, i in pairs:
            cols = user_cols.get(u)
            if cols:
                counts[row[i], cols] += 1
        sizes = np.array([len(g) for g in members], dtype=np.int64)
        top = counts.max(axis=0).astype(float) if len(cat) else np.zeros(len(slice_ids))
        phi_tilde = np.divide(counts, top, out=np.zeros(counts.shape, dtype=float), where=top > 0)
        shrinkage = np.minimum(1.0, sizes / float(shrinkage_users))
        shrinkage[-1] = 1.0  # phi(i, *) = phi~(i, *) whatever lambda_* is
        phi = shrinkage * phi_tilde + (1.0 - shrinkage) * phi_tilde[:, [-1]]
        return cls(cat, slice_ids, sizes, counts, phi_tilde, shrinkage, phi)

    # ---------------------------------------------------------------- lookups
    @property
    def item_row(self) -> dict[str, int]:
        cached = self.__dict__.get("_item_row")
        if cached is None:
            cached = {iid: r for r, iid in enumerate(self.item_ids.tolist())}
            object.__setattr__(self, "_item_row", cached)
        return cached

    def column(self, g: str) -> int:
        """Column index of slice `g` ("*" for the all-user column)."""
        try:
            return self.slice_ids.index(g)
        except ValueError:
            raise ConfigError(f"unknown slice {g!r}; the table has {list(self.slice_ids)}") from None

    def rows(self, items: Sequence[str | None]) -> np.ndarray:
        """Row of each item id; -1 for None. Unknown ids raise (a matcher must map titles first)."""
        index = self.item_row
        out = np.empty(len(items), dtype=np.int64)
        for n, i in enumerate(items):
            if i is None:
                out[n] = -1
            elif i in index:
                out[n] = index[i]
            else:
                raise ConfigError(f"item {i!r} is not in the slice table's catalogue")
        return out

    def phi_rows(self, rows: np.ndarray, g: str) -> np.ndarray:
        """phi(i, g) for row indices (negative rows -> NaN); what rerankers use on catalogue indices."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full(rows.shape, np.nan)
        ok = rows >= 0
        out[ok] = self.phi[rows[ok], self.column(g)]
        return out

    def phi_of(self, items: Sequence[str | None], g: str) -> np.ndarray:
        """phi(i, g) per item id (NaN for None)."""
        return self.phi_rows(self.rows(items), g)

    def delta_rows(self, rows: np.ndarray, g: str) -> np.ndarray:
        """Delta phi(i, g) = phi(i, g) - phi(i, *) for row indices (NaN for negative rows)."""
        return self.phi_rows(rows, g) - self.phi_rows(rows, STAR)


# ---------------------------------------------------------------- metrics
def delta_phi(table: SliceTable, items: Sequence[str | None], g: str) -> np.ndarray:
    """Slice-relative excess popularity Delta phi(i, g) = phi(i, g) - phi(i, *) per item (NaN for None)."""
    return table.phi_of(items, g) - table.phi_of(items, STAR)


def mean_delta_phi(table: SliceTable, items: Sequence[str | None], g: str, *,
                   unmatched: str = "zero") -> float:
    """Mean Delta phi over a list: (1/|L|) sum_{i in L} Delta phi(i, g).

    unmatched="zero": None items count in |L| and add 0 (default, the formula
    as written); "skip": average over matched items only. An empty list (or,
    with "skip", a list with no matched item) gives 0.0: no evidence of any
    slice-relative movement.
    """
    if unmatched not in ("zero", "skip"):
        raise ConfigError(f"unmatched must be 'zero' or 'skip', got {unmatched!r}")
    values = delta_phi(table, items, g)
    if unmatched == "skip":
        values = values[~np.isnan(values)]
    if values.size == 0:
        return 0.0
    # fsum is exact, so a reordered list has exactly the same mean (no rounding noise in paired tests).
    return math.fsum(np.nan_to_num(values, nan=0.0).tolist()) / values.size


def slice_shift(table: SliceTable, cued: Sequence[str | None], reference: Sequence[str | None], g: str, *,
                unmatched: str = "zero") -> float:
    """SliceShift s_u = mean Delta phi(L^c, g_u) - mean Delta phi(L^0, g_u) (section 4.3).

    Positive: the cued (or reranked) list moved toward items more popular in
    slice g than among all users, relative to the history-only reference.
    """
    return (mean_delta_phi(table, cued, g, unmatched=unmatched)
            - mean_delta_phi(table, reference, g, unmatched=unmatched))


def difficulty_weights(phi_values: np.ndarray, ranks: np.ndarray, k: int, rho: float = RHO) -> np.ndarray:
    """w_i = 10 (1 - phi(i, g_u)) (1 + rho (K - l_i + 1) / K) for 1-based list ranks l_i."""
    phi_values = np.asarray(phi_values, dtype=float)
    ranks = np.asarray(ranks, dtype=float)
    return 10.0 * (1.0 - phi_values) * (1.0 + rho * (k - ranks + 1.0) / k)


def difficulty_at_k(ranking: Sequence[str | None], relevant: Iterable[str], table: SliceTable, g: str,
                    k: int = 20, *, rho: float = RHO) -> float:
    """Difficulty@K (section 5.4): sum of w_i over the top-K items that are held-out positives.

    `relevant` is T^C_u, the user's held-out positives (those inside the
    candidate pool; since the list is drawn from the pool, passing all test
    positives gives the same value). A hit less popular within the slice and
    ranked higher earns more: at most 10 (1 + rho) per hit. None never hits.
    """
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    relevant = set(relevant)
    hits = [(pos, item) for pos, item in enumerate(list(ranking)[:k], 1)
            if item is not None and item in relevant]
    if not hits:
        return 0.0
    ranks = np.array([pos for pos, _ in hits], dtype=float)
    phis = table.phi_of([item for _, item in hits], g)
    return float(difficulty_weights(phis, ranks, k, rho).sum())


def mainstreamness(table: SliceTable, history: Sequence[str], g: str) -> float:
    """Within-slice history mainstreamness phi_bar_u = mean of phi(i, g_u) over the history H_u.

    None entries (if any) are skipped; an empty history gives NaN.
    """
    values = table.phi_of(list(history), g)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")


def scenario_mainstreamness(values: Iterable[float]) -> float:
    """phi_bar_s: the mean of phi_bar_u over the users of a scenario (NaNs ignored)."""
    arr = np.asarray(list(values), dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(arr.mean()) if arr.size else float("nan")


def retention_score(pos: np.ndarray, n: int, b: float = 0.2, q: float = 0.9) -> np.ndarray:
    """Geometric rank-retention r_i = b + (1 - b) (q^pos - q^N) / (1 - q^N) for 1-based ranks (section 4.5).

    Decreasing in the rank, from b + (1 - b)(q - q^N)/(1 - q^N) at pos 1 down to b at pos N.
    """
    if not 0 < q < 1:
        raise ConfigError(f"q must be in (0, 1), got {q}")
    if n < 1:
        raise ConfigError(f"N must be >= 1, got {n}")
    pos = np.asarray(pos, dtype=float)
    return b + (1.0 - b) * (q ** pos - q ** n) / (1.0 - q ** n)


def adaptive_alpha(phi_bar_u: float, phi_bar_s: float, *, alpha0: float = 0.7, gamma: float = 0.2,
                   epsilon: float = 1e-12, alpha_min: float = 0.5, alpha_max: float = 0.9) -> float:
    """alpha_u = clip(alpha0 + gamma (phi_bar_u - phi_bar_s) / max(phi_bar_s, eps), alpha_min, alpha_max).

    Mainstream histories (phi_bar_u above the scenario mean) keep more of the
    LLM order; less mainstream ones give inverse slice popularity more weight.
    A NaN mainstreamness falls back to alpha0.
    """
    if alpha_min > alpha_max:
        raise ConfigError(f"alpha_min {alpha_min} > alpha_max {alpha_max}")
    if np.isnan(phi_bar_u) or np.isnan(phi_bar_s):
        return float(np.clip(alpha0, alpha_min, alpha_max))
    raw = alpha0 + gamma * (phi_bar_u - phi_bar_s) / max(phi_bar_s, epsilon)
    return float(np.clip(raw, alpha_min, alpha_max))


# ------------------------------------------------------------------ metric hook
def evaluate_ranking(table: SliceTable, slice_id: str, ranking: Sequence[str | None],
                     reference: Sequence[str | None], relevant: Iterable[str], *,
                     pool: Iterable[str | None] | None = None, ranking_keys: Sequence[str] | None = None,
                     reference_keys: Sequence[str] | None = None, k: int = 20, p: float = 0.9,
                     rho: float = RHO, unmatched: str = "zero") -> dict[str, float]:
    """The paper's per-user metrics of a (reranked) cue list (section 5.4); the envs and runners share it.

    `ranking` is the list in its new order and `reference` the history-only
    list L^0, as catalogue item ids (None: a title that matched no item); the
    top `k` of each are evaluated. `pool` is the candidate pool C_u (default:
    `ranking` itself) and `relevant` the user's held-out positives T_u: every
    utility metric uses T^C_u = T_u restricted to the matched pool, and is 0
    when the pool holds none (NDCG's ideal ranking is built from T^C_u too).

    Drift = 1 - RBO_p(L^0[:k], L[:k]) over `*_keys` (default: the item ids,
    each unmatched entry a key of its own; pass normalised titles to let equal
    unmatched titles agree). SliceShift = mean Delta phi(L[:k]) - mean Delta
    phi(L^0[:k]) in `slice_id` (`unmatched` as in `mean_delta_phi`).
    """
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    top, ref = list(ranking)[:k], list(reference)[:k]
    top_keys = _keys(ranking, ranking_keys, "L")[:k]
    ref_keys = _keys(reference, reference_keys, "L0")[:k]
    pool_ids = {i for i in (ranking if pool is None else pool) if i is not None}
    t_pool = set(relevant) & pool_ids
    ids = [i if i is not None else "" for i in top]  # "" is never relevant
    return {
        "drift": drift(ref_keys, top_keys, p),
        "slice_shift": slice_shift(table, top, ref, slice_id, unmatched=unmatched),
        f"difficulty@{k}": difficulty_at_k(top, t_pool, table, slice_id, k, rho=rho),
        f"hit_rate@{k}": hit_rate_at_k(ids, t_pool, k),
        f"mrr@{k}": mrr_at_k(ids, t_pool, k),
        f"ndcg@{k}": ndcg_at_k(ids, t_pool, k),
        "pool_positives": float(len(t_pool)),
    }


def _keys(items: Sequence[str | None], keys: Sequence[str] | None, tag: str) -> list[str]:
    if keys is not None:
        if len(keys) != len(items):
            raise ConfigError(f"{len(keys)} keys for {len(items)} list entries")
        return list(keys)
    return [i if i is not None else f"?{tag}:{n}" for n, i in enumerate(items)]


__all__ = [
    "EMPTY_SLOT", "RHO", "SHRINKAGE_USERS", "STAR", "SliceTable", "UNMATCHED_SLOT", "adaptive_alpha",
    "delta_phi", "difficulty_at_k", "difficulty_weights", "evaluate_ranking", "mainstreamness",
    "mean_delta_phi", "retention_score", "scenario_mainstreamness", "slice_shift",
]
