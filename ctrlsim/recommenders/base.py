"""The black-box recommender protocol.

A recommender sees only `UserState`s (history of item ids, optional profile
text, optional attributes, items already shown) and returns one ranked `Slate`
per state, for a whole batch at once. Probes never reach its internals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping, Sequence

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError


@dataclass(frozen=True)
class UserState:
    """What a black box may know about a user.

    history: item ids the user interacted with (liked), oldest first.
    profile: natural-language profile or bio, if any.
    attributes: demographic or other fields (age, gender, ...).
    shown: item ids already shown to this user (masked when the recommender's
        `mask_shown` option is on, as CtrlBench-Rec does).
    not_interested, disliked: item ids the user marked "not interested" or disliked, oldest
        first (explicit negative feedback, issue 48); blocked_tags: tags the user asked never to
        see ("don't recommend this"). What a box does with them is its `negative_feedback`.
    settings: the values the user chose for the controls the box declares (`controls`), name ->
        value; a box that declares none ignores them (`ctrlsim.recommenders.controls`).
    """

    history: tuple[str, ...] = ()
    profile: str | None = None
    attributes: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    shown: tuple[str, ...] = ()
    user_id: str | None = None
    not_interested: tuple[str, ...] = ()
    disliked: tuple[str, ...] = ()
    blocked_tags: tuple[str, ...] = ()
    settings: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        for name in ("history", "shown", "not_interested", "disliked", "blocked_tags"):
            object.__setattr__(self, name, _item_ids(name, getattr(self, name)))
        if not isinstance(self.settings, Mapping) or not all(isinstance(k, str) for k in self.settings):
            raise ConfigError(f"UserState.settings must map control names to values, got {self.settings!r}")

    @property
    def negatives(self) -> tuple[str, ...]:
        """The items of every negative event (not interested, then disliked), oldest first."""
        return self.not_interested + self.disliked

    @property
    def has_negative_feedback(self) -> bool:
        return bool(self.not_interested or self.disliked or self.blocked_tags)


def _item_ids(field_name: str, ids) -> tuple[str, ...]:
    """An ordered sequence of item ids (strings or integers) as a tuple of strings.

    A string is rejected rather than split into characters ("12" would become items
    "1" and "2"); so are None, unordered collections and ids of other types.
    """
    if isinstance(ids, (str, bytes)) or ids is None or isinstance(ids, (set, frozenset, Mapping)) \
            or not isinstance(ids, Iterable):
        what = "tags" if field_name == "blocked_tags" else "item ids"
        raise ConfigError(f"UserState.{field_name} must be a sequence of {what}, got {ids!r}"
                          + (f"; did you mean ({ids!r},)?" if isinstance(ids, str) else ""))
    out = []
    for item in ids:
        if isinstance(item, bool) or not isinstance(item, (str, int, np.integer)):
            raise ConfigError(f"UserState.{field_name} holds {item!r} ({type(item).__name__}); "
                              "item ids are strings")
        out.append(str(item))
    return tuple(out)


@dataclass
class Slate:
    """Ranked recommendations, best first."""

    item_ids: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.item_ids)


Candidates = Sequence[str] | Sequence[Sequence[str]] | None


# What a box that does not read explicit negative feedback does with it (its `negative_feedback`).
IGNORES_NEGATIVE_FEEDBACK = "ignored: not interested, dislikes and blocked tags change nothing"


class Recommender:
    """Base class. Subclasses implement `score_all` (dense) or override `score_candidates`.

    Options common to all recommenders:
        exclude_history: never recommend items in the state's history (default True).
        mask_shown: never recommend items in the state's `shown` (default False).

    `negative_feedback` says in words what the box does with a state's not-interested items,
    dislikes and blocked tags; a box that reads them overrides it (the base class ignores them).
    """

    name: str = "abstract"
    negative_feedback: str = IGNORES_NEGATIVE_FEEDBACK

    @property
    def reads_negative_feedback(self) -> bool:
        return self.negative_feedback != IGNORES_NEGATIVE_FEEDBACK

    @property
    def controls(self):
        """The user-settable controls this box declares (`ctrlsim.recommenders.controls.Controls`);
        none by default. Their values arrive in each `UserState.settings`."""
        from ctrlsim.recommenders.controls import NO_CONTROLS

        return NO_CONTROLS

    def __init__(self, dataset: Dataset, *, exclude_history: bool = True, mask_shown: bool = False):
        self.dataset = dataset
        self.exclude_history = exclude_history
        self.mask_shown = mask_shown

    @property
    def identity(self) -> dict:
        """What actually ran (model, encoder, LLM); recorded in every result and log line."""
        return {"recommender": self.name, "dataset": self.dataset.name}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.identity.items())})"

    # ---------------------------------------------------------------- scoring
    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        """(n_states, n_items) scores over the whole catalogue (higher is better)."""
        raise NotImplementedError(f"{type(self).__name__} scores candidate pools only")

    def score_candidates(self, states: Sequence[UserState], candidates: list[np.ndarray]) -> list[np.ndarray]:
        """Scores of each state's candidate catalogue indices. Default: columns of `score_all`."""
        dense = self.score_all(states)
        return [dense[i, idx] for i, idx in enumerate(candidates)]

    # ---------------------------------------------------------------- public
    def recommend(self, states: Sequence[UserState], k: int, candidates: Candidates = None) -> list[Slate]:
        """Top-`k` items for each state.

        candidates: None (whole catalogue), one list of item ids shared by all
        states, or one list per state. Excluded items (history, and shown with
        `mask_shown`) never appear; when fewer than `k` items remain the slate
        is shorter. Raises `ConfigError` for k < 1, k larger than the
        catalogue or an empty pool; `UnknownItemError` for unknown ids.
        """
        states = self._check_states(states)
        n_items = len(self.dataset.items)
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        if k > n_items:
            raise ConfigError(f"k={k} is larger than the catalogue ({n_items} items)")
        pools = self._pools(states, candidates)
        for state in states:
            self.dataset.check_items(state.history)
            self.dataset.check_items(state.shown)
            self.dataset.check_items(state.negatives)
        if pools is None:  # the whole catalogue
            return [self._top_k(state, None, np.asarray(s, dtype=np.float64), k)
                    for state, s in zip(states, self.score_all(states))]
        scores = self.score_candidates(states, pools)
        return [self._top_k(state, pool, np.asarray(s, dtype=np.float64), k)
                for state, pool, s in zip(states, pools, scores)]

    # --------------------------------------------------------------- helpers
    @staticmethod
    def _check_states(states) -> list[UserState]:
        if isinstance(states, UserState):
            raise ConfigError("recommend expects a batch (list) of UserState; wrap a single state in a list")
        states = list(states)
        if not states:
            raise ConfigError("recommend got an empty batch of states")
        for s in states:
            if not isinstance(s, UserState):
                raise ConfigError(f"expected UserState, got {type(s).__name__}")
        return states

    def _pools(self, states: list[UserState], candidates: Candidates) -> list[np.ndarray] | None:
        if candidates is None:
            return None
        candidates = list(candidates)
        if not candidates:
            raise ConfigError("the candidate pool is empty")
        if all(isinstance(c, str) for c in candidates):
            shared = self.dataset.indices(str(c) for c in candidates)
            return [shared] * len(states)
        if len(candidates) != len(states):
            raise ConfigError(f"got {len(candidates)} candidate pools for {len(states)} states")
        pools = []
        for n, pool in enumerate(candidates):
            if isinstance(pool, str) or not len(pool):
                raise ConfigError(f"candidate pool {n} is empty or not a list of item ids")
            pools.append(self.dataset.indices(pool))
        return pools

    def _top_k(self, state: UserState, pool: np.ndarray | None, scores: np.ndarray, k: int) -> Slate:
        index = pool if pool is not None else np.arange(len(scores))
        keep = np.isfinite(scores) | (scores == np.inf)
        banned: set[str] = set()
        if self.exclude_history:
            banned.update(state.history)
        if self.mask_shown:
            banned.update(state.shown)
        if banned:
            banned_idx = self.dataset.indices(banned)
            if pool is None:  # index is the whole catalogue: mask positions directly
                keep[banned_idx] = False
            else:
                keep &= ~np.isin(index, banned_idx)
        cand = np.flatnonzero(keep)
        # Highest score first; ties broken by catalogue order so results are deterministic.
        order = cand[np.lexsort((index[cand], -scores[cand]))][:k]
        ids = self.dataset.item_ids[index[order]]
        return Slate([str(i) for i in ids], scores[order])
