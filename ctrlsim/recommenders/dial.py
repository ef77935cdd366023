"""Dial black boxes: reference recommenders whose controllability is known by construction.

A measuring instrument is calibrated against references whose answer is known. A dial box has a
knob lambda in [0, 1]: at lambda = 0 it ignores everything the user does (a fixed base ranking),
at lambda = 1 it ranks by how well an item matches what the user liked, and in between it mixes
the two by a documented rule. No LLM runs inside a dial box, so it is cheap and exact.

Spec strings (accepted wherever a box name is, e.g. `make_recommender`, `--recommenders`):

    dial:<lambda>[:key=value...]        this module's `DialRecommender` (interactive protocols)
    dial-profile:<lambda>[:key=value]   `ctrlsim.recommenders.dial_profile.DialProfileRanker`
                                        (SteerEval's profile-text ranker)

e.g. `dial:0.5`, `dial:0.25:base=random:mix=scores`. Options given in the spec and as keyword
arguments are merged (keyword arguments win).

`DialRecommender`, for a user whose history (liked items) is H:

* base ranking b: `popularity` (distinct users per item, ties by catalogue order) or `random`
  (a permutation fixed by `seed`); it never looks at the user.
* what it follows, F: `feedback` (default) = the liked items this box itself showed (history
  items that are also in the state's `shown`: what the user did in front of this box), or
  `history` = every liked item, the starting history included. Following feedback is what makes
  the dial steerable by likes alone: a box that follows a starting history the probe cannot
  change shows that history's neighbourhood forever, and a probe that likes only targets never
  gets to like one. With F empty the slate is the base ranking.
* memory `window=W` (a positive integer; absent = unbounded, the default): F is cut to its last W
  items, in the order they were liked (the history's order, most recent last), so a like stops
  being followed after W newer followed likes. The affinity ranking, and so every position the
  draws give to it, sees only those W items; the draws themselves stay seeded by the whole state
  (seed, history, shown), and the excluded items (history, shown with `mask_shown`) are the whole
  state's, as without a window. Without the option nothing changes: no `window` in the identity,
  the same slates and the same draws.
* negative feedback `neg=mu` (a number in [0, 1]; absent = ignored, the default): every item the
  user marked not interested or disliked removes each catalogue item sharing a tag with it with
  probability mu, and every blocked tag removes each of its items with probability mu (one draw
  per (event, item), seeded by `seed` and the event, so the same events always remove the same
  items). Removed items never reach a slate. This holds at every lambda, lambda = 0 included: the
  dial's negative-feedback strength is its own, known answer (issue 48): over the items similar to
  the one dismissed, a share mu disappears.
* affinity a: `tags` (tag overlap: for each of the item's tags, how many items of F carry it,
  summed; an item sharing the tags all the liked items share ranks first; ties by the base
  ranking) or `embedding` (cosine between the item's text embedding and the mean embedding of F,
  with the text encoder `encoder`). Tag overlap rather than cosine: cosine penalises a target
  item for every tag it has that the liked items lack, so a box following War likes by cosine
  drifts to the liked items' other genres.
* mix `positions` (default): each slate position, top down, takes the best remaining item of the
  affinity ranking with probability lambda, else the best remaining item of the base ranking.
  The draws come from a generator seeded by (seed, the state's history and shown items), so the
  same state always gets the same slate, and lambda is exactly the expected share of positions
  that follow the user.
* mix `scores`: score = (1 - lambda) * r_b + lambda * r_a, with r_b and r_a the items' ranks in
  the base and affinity rankings scaled to [0, 1] (1 = first).

Known answers: at lambda = 0 two users with any histories get the base ranking (less the items the
`Recommender` options exclude), so every probe of an episode sees the same slates whatever it
likes; at lambda = 1 (mix positions) the slate is the affinity ranking. `follow=feedback` needs the
env to pass the items shown (ctrlsim's envs always do).

Known answer of a window (steer-then-release persistence): with window W and lambda = 1, once the
last W followed likes are all non-target items, the slate is the affinity ranking of those W items
alone, less the excluded items, so it no longer depends on anything liked before them (beyond their
own exclusion: with `exclude_history`, the default, a liked item is never shown again): the box
forgets the steering within W new followed likes. The full-state seeding does not touch this
answer: at lambda = 1 every draw takes the affinity ranking (mix positions), and mix scores draws
nothing. At lambda in (0, 1) which positions follow the user still varies with older likes (the
seed sees them), but each does with probability lambda and the items it takes come from the
window's ranking alone. Without a window old likes stay in F and the box never fully forgets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import Recommender, UserState
from ctrlsim.seeding import derive_rng

DIAL_PREFIXES = ("dial", "dial-profile")
BASES = ("popularity", "random")
AFFINITIES = ("tags", "embedding")
MIXES = ("positions", "scores")
FOLLOWS = ("feedback", "history")


@dataclass(frozen=True)
class DialSpec:
    """A parsed dial spec: which dial, its lambda and the options written in the spec."""

    kind: str
    lam: float
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        opts = "".join(f":{k}={v}" for k, v in self.options.items())
        return f"{self.kind}:{format_lambda(self.lam)}{opts}"


def format_lambda(lam: float) -> str:
    """lambda as written in box names and tables: 0, 0.25, 0.5, 1 (no trailing zeros)."""
    return f"{lam:.6g}"


def is_dial(name: str) -> bool:
    return isinstance(name, str) and name.split(":", 1)[0] in DIAL_PREFIXES and ":" in name


def check_lambda(lam: object, *, name: str = "lambda") -> float:
    """lambda as a float in [0, 1] (a `ConfigError` names the bad value)."""
    if isinstance(lam, bool) or not isinstance(lam, (int, float, np.integer, np.floating)) \
            or not np.isfinite(float(lam)) or not 0.0 <= float(lam) <= 1.0:
        raise ConfigError(f"{name} must be a number in [0, 1], got {lam!r}")
    return float(lam)


def parse_dial_spec(spec: str) -> DialSpec:
    """`dial:<lambda>[:key=value...]` (or `dial-profile:...`) -> `DialSpec`; `ConfigError` if malformed."""
    if not is_dial(spec):
        raise ConfigError(f"not a dial box spec: {spec!r} (expected dial:<lambda> or dial-profile:<lambda>)")
    kind, _, rest = spec.partition(":")
    value, *pairs = rest.split(":")
    try:
        lam = float(value)
    except ValueError:
        raise ConfigError(f"{spec!r}: lambda {value!r} is not a number in [0, 1]") from None
    lam = check_lambda(lam, name=f"{spec!r}: lambda")
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep or not key or not val:
            raise ConfigError(f"{spec!r}: option {pair!r} is not key=value")
        if key in options:
            raise ConfigError(f"{spec!r}: option {key!r} is given twice")
        options[key] = val
    return DialSpec(kind, lam, options)


def parse_flag(name: str, value: object) -> bool:
    """A boolean option given as a bool, 0/1 or a string (true/false, yes/no, 1/0), as spec options are."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise ConfigError(f"{name}={value!r} is not a boolean (true/false)")


FLAG_OPTIONS = ("exclude_history", "mask_shown")


def parse_seed(name: str, value: object) -> int:
    """A seed option given as a non-negative integer or its digits (as spec options are)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise ConfigError(f"{name}={value!r} is not an integer >= 0")


def parse_strength(name: str, value: object) -> float:
    """A negative-feedback strength mu in [0, 1], given as a number or its text (as spec options are)."""
    mu = float("nan")
    if isinstance(value, (str, int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        try:
            mu = float(value)
        except ValueError:
            pass
    if not 0.0 <= mu <= 1.0:
        raise ConfigError(f"{name}={value!r} is not a number in [0, 1] (the share of similar items a "
                          "negative event removes)")
    return mu


def parse_window(name: str, value: object) -> int:
    """A memory window given as a positive integer or its digits (as spec options are)."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and int(value) > 0:
        return int(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value > 0:
        return int(value)
    raise ConfigError(f"{name}={value!r} is not a positive integer (the number of followed likes remembered)")


def base_ranking(dataset: Dataset, base: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(catalogue indices best first, each item's position) of a base ranking that ignores the user:
    `popularity` (distinct users per item, ties in catalogue order) or `random` (seeded)."""
    _check_option("base", base, BASES)
    n = len(dataset.items)
    if base == "popularity":
        pop = dataset.items["popularity"].to_numpy(dtype=np.float64)
        order = np.lexsort((np.arange(n), -pop))
    else:
        order = derive_rng(seed, "dial-base").permutation(n)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return order, rank


# The options each dial kind takes, and their allowed values (None: any value of the right type).
DIAL_OPTIONS: dict[str, dict[str, Sequence[str] | None]] = {
    "dial": {"base": BASES, "affinity": AFFINITIES, "mix": MIXES, "follow": FOLLOWS, "seed": None,
             "window": None, "encoder": None, "neg": None, "exclude_history": None, "mask_shown": None},
    "dial-profile": {"base": BASES, "seed": None, "exclude_history": None, "mask_shown": None},
}


def check_dial_spec(spec: str) -> DialSpec:
    """Parse a dial spec and check its options' names and values without building the box."""
    parsed = parse_dial_spec(spec)
    known = DIAL_OPTIONS[parsed.kind]
    for key, value in parsed.options.items():
        if key not in known:
            raise ConfigError(f"{spec!r}: unknown {parsed.kind} option {key!r}; options: {', '.join(known)}")
        choices = known[key]
        if choices is not None:
            _check_option(key, value, choices)
        elif key in FLAG_OPTIONS:
            parse_flag(f"{spec!r}: option {key}", value)
        elif key == "seed":
            parse_seed(f"{spec!r}: option seed", value)
        elif key == "window":
            parse_window(f"{spec!r}: option window", value)
        elif key == "neg":
            parse_strength(f"{spec!r}: option neg", value)
    return parsed


def _check_option(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(f"dial option {name}={value!r}; choose from {list(choices)}")
    return value


def rank_scale(order: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1]: the item at order[0] gets 1, the last 0 (a single item gets 1)."""
    n = len(order)
    out = np.empty(n, dtype=np.float64)
    out[order] = 1.0 - np.arange(n) / max(n - 1, 1)
    return out


class DialRecommender(Recommender):
    """The interactive dial box (see the module docstring for the rule and its known answers)."""

    name = "dial"

    def __init__(self, dataset: Dataset, *, lam: float, base: str = "popularity", affinity: str = "tags",
                 mix: str = "positions", follow: str = "feedback", seed: int | str = 0,
                 window: int | str | None = None, encoder: str = "minilm", neg: float | str | None = None,
                 **options):
        unknown = sorted(set(options) - set(FLAG_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown dial option(s) {unknown}; options: base, affinity, mix, follow, "
                              f"seed, window, encoder, neg, {', '.join(FLAG_OPTIONS)}")
        super().__init__(dataset, **{k: parse_flag(f"dial option {k}", v) for k, v in options.items()})
        self.lam = check_lambda(lam)
        self.base = _check_option("base", base, BASES)
        self.affinity = _check_option("affinity", affinity, AFFINITIES)
        self.mix = _check_option("mix", mix, MIXES)
        self.follow = _check_option("follow", follow, FOLLOWS)
        self.seed = parse_seed("dial option seed", seed)
        # None: unbounded memory (F whole); W: only the last W items of F are followed.
        self.window = None if window is None else parse_window("dial option window", window)
        # None: negative feedback ignored; mu: each negative event removes each item sharing a tag
        # with it (or carrying a blocked tag) with probability mu.
        self.neg = None if neg is None else parse_strength("dial option neg", neg)
        if self.neg is not None:
            mu = format_lambda(self.neg)
            self.negative_feedback = (f"neg={mu}: each not-interested or disliked item removes every item "
                                      f"sharing a tag with it with probability {mu} (a seeded draw per "
                                      "pair), and a blocked tag removes its items with that probability")
        self.encoder_spec = encoder
        # An item's position in the base ranking breaks affinity ties (earlier = better).
        self.base_order, self.base_rank = base_ranking(dataset, self.base, self.seed)
        self._item_vectors: np.ndarray | None = None

    @property
    def identity(self) -> dict:
        ident = {**super().identity, "lambda": self.lam, "base": self.base, "affinity": self.affinity,
                 "mix": self.mix, "follow": self.follow, "seed": self.seed}
        if self.window is not None:  # absent without a window, so unwindowed identities are unchanged
            ident["window"] = self.window
        if self.neg is not None:  # likewise absent without the option
            ident["neg"] = self.neg
        if self.affinity == "embedding":
            ident["encoder"] = self.encoder_spec
        return ident

    # ------------------------------------------------------------------ affinity
    def item_vectors(self) -> np.ndarray:
        """Rows of item vectors: 0/1 tag vectors (`tags`), or unit-norm text embeddings."""
        if self._item_vectors is None:
            if self.affinity == "tags":
                tags = self.dataset.item_tags
                index = {t: c for c, t in enumerate(sorted(set(tags["tag"])))}
                vectors = np.zeros((len(self.dataset.items), len(index)))
                rows = self.dataset.indices(tags["item_id"].astype(str))
                vectors[rows, tags["tag"].map(index).to_numpy()] = 1
            else:
                from ctrlsim.backends import resolve_encoder

                vectors = resolve_encoder(self.encoder_spec).encode(self.dataset.items["text"].tolist())
                norms = np.linalg.norm(vectors, axis=1, keepdims=True)
                vectors = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
            self._item_vectors = vectors
        return self._item_vectors

    def followed(self, state: UserState) -> list[str]:
        """The liked items the dial follows, oldest first (`follow` and `window`: module docstring)."""
        if self.follow == "history":
            followed = list(state.history)
        else:
            shown = set(state.shown)
            followed = [i for i in state.history if i in shown]
        return followed if self.window is None else followed[-self.window:]

    def affinity_order(self, state: UserState) -> np.ndarray | None:
        """Catalogue indices by affinity to the followed likes, best first (None: nothing to follow)."""
        followed = self.followed(state)
        if not followed:
            return None
        vectors = self.item_vectors()
        query = vectors[self.dataset.indices(followed)].sum(axis=0)
        affinity = vectors @ query
        return np.lexsort((self.base_rank, -np.round(affinity, 12)))

    def removed_by_feedback(self, state: UserState) -> np.ndarray:
        """Catalogue mask of the items the state's negative events remove (`neg`, see above)."""
        removed = np.zeros(len(self.dataset.items), dtype=bool)
        if self.neg is None or not self.neg or not state.has_negative_feedback:
            return removed
        tags = self.dataset.items["tags"]
        events = [(f"item:{i}", set(tags.iat[self.dataset.item_index[i]])) for i in state.negatives]
        events += [(f"tag:{t}", {t}) for t in state.blocked_tags]
        for event, event_tags in events:
            similar = np.flatnonzero([bool(event_tags & set(t)) for t in tags])
            draws = derive_rng(self.seed, "dial-negative", event).random(len(removed))
            removed[similar[draws[similar] < self.neg]] = True
        return removed

    # ------------------------------------------------------------------ scoring
    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        n = len(self.dataset.items)
        base_scores = rank_scale(self.base_order)
        out = np.empty((len(states), n))
        for row, state in enumerate(states):
            order = self.affinity_order(state) if self.lam > 0 else None
            if order is None:
                out[row] = base_scores
            elif self.mix == "scores":
                out[row] = (1.0 - self.lam) * base_scores + self.lam * rank_scale(order)
            else:
                out[row] = rank_scale(self._mixed_order(state, order))
            out[row, self.removed_by_feedback(state)] = -np.inf
        return out

    def _mixed_order(self, state: UserState, affinity: np.ndarray) -> np.ndarray:
        """The catalogue as positions drawn from the affinity ranking (prob. lambda) or the base one.

        Excluded items (history, and shown items with `mask_shown`) are skipped first, so every
        draw fills a position a slate can show. `affinity` comes from the followed (windowed) likes;
        the draws are seeded by the whole state, with or without a window (module docstring)."""
        banned = set(state.history) if self.exclude_history else set()
        if self.mask_shown:
            banned.update(state.shown)
        banned_idx = self.dataset.indices(sorted(banned)) if banned else np.empty(0, dtype=np.int64)
        keep = np.ones(len(self.base_order), dtype=bool)
        keep[banned_idx] = False
        lists = [self.base_order[keep[self.base_order]], affinity[keep[affinity]]]
        rng = derive_rng(self.seed, "dial-positions", "|".join(state.history), "|".join(state.shown))
        follow = rng.random(len(lists[0])) < self.lam
        used = np.zeros(len(keep), dtype=bool)
        cursor = [0, 0]
        order = []
        for pick in follow.astype(int):
            source = lists[pick]
            while used[source[cursor[pick]]]:
                cursor[pick] += 1
            item = source[cursor[pick]]
            used[item] = True
            order.append(item)
        return np.concatenate([np.asarray(order, dtype=np.int64), banned_idx])
