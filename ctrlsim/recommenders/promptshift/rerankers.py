"""PromptShift's post-hoc rerankers B0-B3 (Gan & Dong, sections 4.5 and 5.3), usable as env policies.

A reranker maps one candidate pool - catalogue indices in LLM order
(UNMATCHED_SLOT for an unmatched title, EMPTY_SLOT for an empty slot), the
user's slice and prompt history - plus the slice table to a new order of the
pool; as a `PromptShiftEnv` policy it returns that order as an action (one
score per slot in [-1, 1], highest first). Candidate and history indices are
slice-table rows (the slice table is built in catalogue order). It is pure
ranking code (numpy and the metric module, no env or agent), so it sits with
the protocol: validation selection (`selection`) runs it over stored lists.

    B0  Original      the LLM order.
    B1  All-user      score = alpha r_i + (1 - alpha) (1 - phi(i, *)), fixed alpha.
    B2  Slice         score = alpha r_i + (1 - alpha) (1 - phi(i, g_u)), fixed alpha.
    B3  PromptShift   score = alpha_u r_i + (1 - alpha_u) (1 - phi(i, g_u)) with
                      alpha_u = clip(alpha0 + gamma (phi_bar_u - phi_bar_s) / max(phi_bar_s, eps),
                      alpha_min, alpha_max), and the first K' LLM positions protected.

r_i = b + (1 - b) (q^pos(i) - q^N) / (1 - q^N) keeps the LLM rank as a
relevance proxy. In every variant unmatched candidates get no inverse
slice-popularity score: they keep their original positions and the matched
candidates are sorted into the remaining positions (ties by original rank).

Parameter values (section 5.1): K' = 5, b = 0.2, q = 0.9, alpha0 = 0.7,
gamma = 0.2, [alpha_min, alpha_max] = [0.5, 0.9], epsilon = 1e-12. The paper
gives no value for B1/B2's fixed alpha; we use alpha0 = 0.7, and - since it
names the protected prefix as part of B3 only - B1/B2 protect no prefix. The
paper selects reranking parameters on validation data: `select_params` does
that over `PARAM_GRID` against validation positives only (see its docstring).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import (
    EMPTY_SLOT,
    STAR,
    UNMATCHED_SLOT,
    SliceTable,
    adaptive_alpha,
    retention_score,
)
from ctrlsim.recommenders.promptshift.defaults import K


@dataclass(frozen=True)
class RerankParams:
    """Reranker parameters; the defaults are the paper's (section 5.1)."""

    b: float = 0.2
    q: float = 0.9
    alpha0: float = 0.7
    gamma: float = 0.2
    epsilon: float = 1e-12
    alpha_min: float = 0.5
    alpha_max: float = 0.9
    protected_prefix: int = 5

    def __post_init__(self):
        if not 0 < self.q < 1:
            raise ConfigError(f"q must be in (0, 1), got {self.q}")
        if not 0 <= self.b <= 1:
            raise ConfigError(f"b must be in [0, 1], got {self.b}")
        if self.alpha_min > self.alpha_max:
            raise ConfigError(f"alpha_min {self.alpha_min} > alpha_max {self.alpha_max}")
        if self.protected_prefix < 0:
            raise ConfigError(f"protected_prefix must be >= 0, got {self.protected_prefix}")

    def to_dict(self) -> dict:
        return asdict(self)


PAPER_PARAMS = RerankParams()

# Validation grid for B3 (around the paper's values).
PARAM_GRID = {"alpha0": (0.6, 0.7, 0.8), "gamma": (0.1, 0.2, 0.4), "protected_prefix": (3, 5, 8)}


# ------------------------------------------------------------------ helpers
def arrange(candidates: np.ndarray, scores: np.ndarray | None, protected_prefix: int = 0) -> np.ndarray:
    """Slots of the non-empty candidates in their new order.

    The first `protected_prefix` filled slots and every unmatched slot keep
    their positions; matched slots fill the remaining positions by descending
    score, ties by original rank. `scores=None` keeps the original order.
    """
    candidates = np.asarray(candidates)
    filled = [int(s) for s in np.flatnonzero(candidates != EMPTY_SLOT)]
    if scores is None or not filled:
        return np.array(filled, dtype=np.int64)
    fixed = {pos for pos, s in enumerate(filled) if pos < protected_prefix or candidates[s] == UNMATCHED_SLOT}
    movable = sorted((filled[pos] for pos in range(len(filled)) if pos not in fixed),
                     key=lambda s: (-float(scores[s]), s))
    out, it = list(filled), iter(movable)
    for pos in range(len(filled)):
        if pos not in fixed:
            out[pos] = next(it)
    return np.array(out, dtype=np.int64)


def order_to_action(order: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """Scores in [-1, 1] whose descending sort (ties by slot) reproduces `order`; other slots get -1."""
    action = np.full(n, -1.0, dtype=np.float32)
    m = len(order)
    for j, s in enumerate(order):
        action[int(s)] = 1.0 - 2.0 * j / max(m - 1, 1)
    return action


# ---------------------------------------------------------------- rerankers
class Reranker:
    """Base class. `order(...)` is the reranking; `__call__(observation)` the env policy.

    `slice_names` maps the observation's `slice` index to a slice id, and
    `slice_means` a slice id to phi_bar_s of its scenario (B3 only); use
    `for_env(env)` to take both from a `PromptShiftEnv` or a `PromptShiftEngine`.
    """

    name = "B?"
    label = ""

    def __init__(self, table: SliceTable, *, params: RerankParams = PAPER_PARAMS,
                 slice_names: Sequence[str] | None = None, slice_means: Mapping[str, float] | None = None):
        self.table, self.params = table, params
        self.slice_names = tuple(slice_names) if slice_names is not None else table.slice_ids[:-1]
        self.slice_means = dict(slice_means or {})

    @classmethod
    def for_env(cls, env, **kwargs) -> "Reranker":
        env = getattr(env, "unwrapped", env)
        return cls(env.slice_table, slice_names=env.slice_names, slice_means=env.slice_means, **kwargs)

    @property
    def config(self) -> dict:
        return {"name": self.name, "label": self.label, "params": self.params.to_dict()}

    def scores(self, candidates: np.ndarray, slice_id: str, history: np.ndarray | None) -> np.ndarray | None:
        """Per-slot scores (higher first); None keeps the LLM order."""
        return None

    def protected(self) -> int:
        return 0

    def order(self, candidates: np.ndarray, slice_id: str, history: np.ndarray | None = None) -> np.ndarray:
        """New order of the non-empty slots."""
        candidates = np.asarray(candidates, dtype=np.int64)
        return arrange(candidates, self.scores(candidates, slice_id, history), self.protected())

    def action(self, candidates: np.ndarray, slice_id: str, history: np.ndarray | None = None) -> np.ndarray:
        return order_to_action(self.order(candidates, slice_id, history), len(candidates))

    def __call__(self, observation: Mapping) -> np.ndarray:
        slice_id = self.slice_names[int(observation["slice"])]
        return self.action(observation["candidates"], slice_id, observation.get("history"))

    def _retention(self, candidates: np.ndarray) -> np.ndarray:
        n = len(candidates)
        return retention_score(np.arange(1, n + 1), n, self.params.b, self.params.q)


class OriginalOrder(Reranker):
    """B0: the unmodified identity-conditioned list (its first K items)."""

    name, label = "B0", "Original"


class FixedWeightReranker(Reranker):
    """B1 (popularity="all": phi(i, *)) and B2 (popularity="slice": phi(i, g_u)) with a fixed alpha.

    alpha defaults to the paper's alpha0; no protected prefix unless given.
    """

    def __init__(self, table: SliceTable, *, popularity: str = "slice", alpha: float | None = None,
                 protected_prefix: int = 0, **kwargs):
        super().__init__(table, **kwargs)
        if popularity not in ("all", "slice"):
            raise ConfigError(f"popularity must be 'all' or 'slice', got {popularity!r}")
        self.popularity = popularity
        self.alpha = float(self.params.alpha0 if alpha is None else alpha)
        if not 0 <= self.alpha <= 1:
            raise ConfigError(f"alpha must be in [0, 1], got {self.alpha}")
        self.prefix = int(protected_prefix)
        self.name, self.label = ("B1", "All-user-fixed") if popularity == "all" else ("B2", "Slice-fixed")

    @property
    def config(self) -> dict:
        return {**super().config, "alpha": self.alpha, "protected_prefix": self.prefix}

    def protected(self) -> int:
        return self.prefix

    def scores(self, candidates, slice_id, history):
        column = STAR if self.popularity == "all" else slice_id
        phi = self.table.phi_rows(np.where(candidates >= 0, candidates, -1), column)
        return self.alpha * self._retention(candidates) + (1.0 - self.alpha) * (1.0 - np.nan_to_num(phi))


class PromptShiftReranker(Reranker):
    """B3: slice popularity, per-user alpha_u from within-slice history mainstreamness, protected prefix."""

    name, label = "B3", "PromptShift"

    def alpha_u(self, slice_id: str, history: np.ndarray | None) -> float:
        if history is None:
            raise ConfigError("the PromptShift reranker needs the user's history")
        if slice_id not in self.slice_means:
            raise ConfigError(f"no scenario mainstreamness phi_bar_s for slice {slice_id!r}")
        hist = np.asarray(history, dtype=np.int64)
        phi = self.table.phi_rows(hist[hist >= 0], slice_id)
        phi_u = float(phi.mean()) if phi.size else float("nan")
        p = self.params
        return adaptive_alpha(phi_u, self.slice_means[slice_id], alpha0=p.alpha0, gamma=p.gamma,
                              epsilon=p.epsilon, alpha_min=p.alpha_min, alpha_max=p.alpha_max)

    def protected(self) -> int:
        return self.params.protected_prefix

    def scores(self, candidates, slice_id, history):
        alpha = self.alpha_u(slice_id, history)
        phi = self.table.phi_rows(np.where(candidates >= 0, candidates, -1), slice_id)
        return alpha * self._retention(candidates) + (1.0 - alpha) * (1.0 - np.nan_to_num(phi))


VARIANTS = ("B0", "B1", "B2", "B3")


def make_reranker(name: str, table: SliceTable, *, params: RerankParams = PAPER_PARAMS, **kwargs) -> Reranker:
    """"B0".."B3" -> the reranker, with the paper's parameters unless `params` says otherwise."""
    if name == "B0":
        return OriginalOrder(table, params=params, **kwargs)
    if name == "B1":
        return FixedWeightReranker(table, popularity="all", params=params, **kwargs)
    if name == "B2":
        return FixedWeightReranker(table, popularity="slice", params=params, **kwargs)
    if name == "B3":
        return PromptShiftReranker(table, params=params, **kwargs)
    raise ConfigError(f"unknown reranker {name!r}; choose from {VARIANTS}")


def param_grid(grid: Mapping[str, Iterable] = PARAM_GRID,
               base: RerankParams = PAPER_PARAMS) -> list[RerankParams]:
    """Every combination of `grid` values applied to `base`."""
    points = [base]
    for key, values in grid.items():
        points = [replace(p, **{key: v}) for p in points for v in values]
    return list(dict.fromkeys(points))


def select_params(evaluate: Callable[[RerankParams], Mapping[str, float]], baseline: Mapping[str, float], *,
                  grid: Mapping[str, Iterable] = PARAM_GRID, k: int = K,
                  base: RerankParams = PAPER_PARAMS) -> tuple[RerankParams, list[dict]]:
    """Choose B3's parameters on validation data (the paper states no criterion).

    `evaluate(params)` returns B3's mean metrics against the validation
    positives ("difficulty@k", "hit_rate@k"), `baseline` B0's. Criterion: among
    grid points whose validation HitRate@k is not below B0's, the highest
    validation Difficulty@k; ties go to `base` (the paper's values), then to
    the first point of the grid. With no such point, `base`. Only held-out
    validation items enter: SliceShift is never an objective, because it has no
    held-out part - it is computed on exactly the lists that are reported.
    Returns the choice and every point's metrics.
    """
    rows, best, best_key = [], None, None
    for params in param_grid(grid, base):
        m = dict(evaluate(params))
        rows.append({**params.to_dict(), **m})
        if m[f"hit_rate@{k}"] + 1e-12 < baseline[f"hit_rate@{k}"]:
            continue
        key = (-round(m[f"difficulty@{k}"], 12), params != base)
        if best_key is None or key < best_key:
            best, best_key = params, key
    return (best if best is not None else base), rows


__all__ = ["FixedWeightReranker", "OriginalOrder", "PAPER_PARAMS", "PARAM_GRID", "PromptShiftReranker",
           "Reranker", "RerankParams", "VARIANTS", "arrange", "make_reranker", "order_to_action",
           "param_grid", "select_params"]
