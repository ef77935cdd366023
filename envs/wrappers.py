"""Wrappers that make the probe envs ready for reinforcement-learning libraries (Stable-Baselines3, ...).

The raw `ProbeEnv` speaks in the terms an LLM probe needs: a Dict action with a free-text `query`,
an observation of bare catalogue indices, and item texts in `info`. RL libraries want fixed-size
numeric spaces. `rl_env(...)` stacks the three wrappers below; each can also be used alone:

- `LikesActions`: the action is `MultiBinary(slate_size)` (1 = like that position), or, with a
  search menu, `MultiDiscrete([2] * slate_size + [1 + len(menu)])` whose last entry picks a query
  from a fixed list (0 = no search). A menu needs an env made with `allow_search=True`. With
  `not_interested=True` each position chooses among three (`MultiDiscrete([3] * slate_size)`, then
  the menu entry): 0 skip, 1 like, 2 not interested, mapped to the env's `likes` and `feedback`;
  it needs an env made with `negative_feedback=True`.
- `ItemFeatures`: the observation becomes one `float32` vector computed by `SlateFeatures`: per
  slate position whether it holds an item, its tags (multi-hot over the catalogue's tags), its
  popularity (log-scaled to [0, 1]) and optionally its text embedding from an encoder; then
  whether the slate came from search and the fraction of the budget used.
- `NumericInfo`: `info` keeps only numbers, the same keys on every step, so clients that stack
  infos into arrays (Gymnasium's vector envs) can: the task's metrics as `metric/<name>`, the
  counts of new likes and of slate items, `from_search`, and tokens where a meter is attached.

The features are a pure function of the observation (`SlateFeatures.encode`), so a trained policy
acts the same on a population env's per-probe observations (`ctrlsim.agents.rl.LearnedProbe`).
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ctrlsim.errors import ConfigError, InvalidAction

from .feedback import NOT_INTERESTED

if TYPE_CHECKING:
    from ctrlsim.backends import Encoder

# A position's choice under `LikesActions(..., not_interested=True)`.
CHOICE_SKIP, CHOICE_LIKE, CHOICE_NOT_INTERESTED = 0, 1, 2
FEATURE_SET_VERSION = 1  # bump when `SlateFeatures.encode` changes: saved policies record it
GLOBAL_FEATURES = ("from_search", "budget_used")


class SlateFeatures:
    """The numeric view of a slate (see the module docstring), for one dataset and slate size.

    tags: multi-hot tags per position. popularity: log(1 + users) / log(1 + max users).
    embedding: an `Encoder` spec (e.g. "minilm"), or a loaded `Encoder`, whose item-text embeddings
    join each position (computed once for the catalogue, on first use; a saved policy records the
    encoder's name). Every value lies in [-1, 1].
    """

    def __init__(
        self,
        dataset,
        slate_size: int,
        budget: int,
        *,
        tags: bool = True,
        popularity: bool = True,
        embedding: "str | Encoder | None" = None,
    ):
        for name, value in (("slate_size", slate_size), ("budget", budget)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if not (tags or popularity or embedding):
            raise ConfigError("SlateFeatures needs at least one of tags, popularity, embedding")
        self.dataset = dataset
        self.slate_size, self.budget = int(slate_size), int(budget)
        self.tags, self.popularity, self.embedding = bool(tags), bool(popularity), embedding
        self._table: np.ndarray | None = None

    # ------------------------------------------------------------------ description
    def settings(self) -> dict[str, Any]:
        """What rebuilds these features (stored beside a trained policy)."""
        return {
            "slate_size": self.slate_size,
            "budget": self.budget,
            "tags": self.tags,
            "popularity": self.popularity,
            "embedding": self.embedding if self.embedding is None or isinstance(self.embedding, str)
            else self.embedding.name,
            "version": FEATURE_SET_VERSION,
            "dataset": self.dataset.name,
            "catalogue_tags": list(self.dataset.tags),
        }

    @classmethod
    def from_settings(cls, dataset, settings: Mapping[str, Any]) -> "SlateFeatures":
        """The features a saved policy was trained on, checked against `dataset` and this version."""
        if settings.get("version") != FEATURE_SET_VERSION:
            raise ConfigError(
                f"the policy's features are version {settings.get('version')!r}; this ctrlsim "
                f"computes version {FEATURE_SET_VERSION}: retrain the policy"
            )
        if list(settings.get("catalogue_tags", [])) != list(dataset.tags):
            raise ConfigError(
                f"the policy was trained on a catalogue with other tags "
                f"({settings.get('dataset')!r}); this dataset is {dataset.name!r}"
            )
        return cls(
            dataset,
            settings["slate_size"],
            settings["budget"],
            tags=settings["tags"],
            popularity=settings["popularity"],
            embedding=settings.get("embedding"),
        )

    @property
    def per_position(self) -> int:
        return self.item_table.shape[1] + 1  # + "position holds an item"

    @property
    def size(self) -> int:
        return self.slate_size * self.per_position + len(GLOBAL_FEATURES)

    def space(self) -> spaces.Box:
        return spaces.Box(low=-1.0, high=1.0, shape=(self.size,), dtype=np.float32)

    # ------------------------------------------------------------------ values
    @property
    def item_table(self) -> np.ndarray:
        """Per catalogue item (row, in catalogue order): its feature values (float32)."""
        if self._table is None:
            self._table = self._build_table()
        return self._table

    def _build_table(self) -> np.ndarray:
        items = self.dataset.items
        columns: list[np.ndarray] = []
        if self.tags:
            index = {tag: n for n, tag in enumerate(self.dataset.tags)}
            multi_hot = np.zeros((len(items), len(index)), dtype=np.float32)
            for row, item_tags in enumerate(items["tags"]):
                for tag in item_tags:
                    if tag in index:
                        multi_hot[row, index[tag]] = 1.0
            columns.append(multi_hot)
        if self.popularity:
            users = items["popularity"].to_numpy(dtype=np.float64)
            top = max(float(users.max()), 1.0)
            columns.append((np.log1p(users) / np.log1p(top)).astype(np.float32)[:, None])
        if self.embedding:
            from ctrlsim.backends import resolve_encoder

            encoder = resolve_encoder(self.embedding)
            columns.append(np.clip(encoder.encode(list(items["text"])), -1, 1).astype(np.float32))
        return np.concatenate(columns, axis=1)

    def encode(self, observation: Mapping[str, Any]) -> np.ndarray:
        """The feature vector of one raw observation (`slate`, `source`, `round`)."""
        slate = np.asarray(observation["slate"], dtype=np.int64)
        if slate.shape != (self.slate_size,):
            raise ConfigError(
                f"the features are for slates of {self.slate_size}; got a slate of shape {slate.shape}"
            )
        table = self.item_table
        per_position = np.zeros((self.slate_size, table.shape[1] + 1), dtype=np.float32)
        present = slate >= 0
        per_position[present, 0] = 1.0
        per_position[present, 1:] = table[slate[present]]
        used = min(int(observation["round"]), self.budget) / self.budget
        extra = np.array([float(int(observation["source"]) == 1), used], dtype=np.float32)
        return np.concatenate([per_position.ravel(), extra])


# ----------------------------------------------------------------------------- actions


def search_menu_for(dataset, menu: str | Sequence[str] | None) -> tuple[str, ...]:
    """The queries a `LikesActions` menu offers: "tags" means the catalogue's tag names."""
    if menu is None:
        return ()
    if isinstance(menu, str):
        if menu != "tags":
            raise ConfigError(f"search_menu must be 'tags' or a list of queries, got {menu!r}")
        return tuple(dataset.tags)
    queries = tuple(menu)
    if not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        raise ConfigError(f"search_menu must hold non-empty query strings, got {menu!r}")
    return queries


def _exact_int(value: Any, where: str) -> int:
    """An integer action entry; floats only where exactly whole (SB3 sends 0.0 / 1.0)."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (numbers.Integral, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise InvalidAction(f"{where} must be a whole number, got {value!r}")


def likes_action_space(slate_size: int, search_menu: Sequence[str] = (), not_interested: bool = False
                       ) -> spaces.Space:
    """`LikesActions`' action space (a saved policy's network is rebuilt on it)."""
    if not_interested:
        return spaces.MultiDiscrete([3] * slate_size + ([1 + len(search_menu)] if search_menu else []))
    if search_menu:
        return spaces.MultiDiscrete([2] * slate_size + [1 + len(search_menu)])
    return spaces.MultiBinary(slate_size)


def choice_action(choices: Sequence[int]) -> dict[str, np.ndarray]:
    """The env's `likes` and `feedback` of per-position choices (0 skip, 1 like, 2 not interested);
    any other choice is an `InvalidAction`."""
    allowed = (CHOICE_SKIP, CHOICE_LIKE, CHOICE_NOT_INTERESTED)
    bad = [(n, c) for n, c in enumerate(choices) if c not in allowed]
    if bad:
        raise InvalidAction(f"a position's choice must be 0 (skip), 1 (like) or 2 (not interested); "
                            f"position {bad[0][0]} is {bad[0][1]!r}")
    codes = np.asarray(choices, dtype=np.int64)
    return {"likes": (codes == CHOICE_LIKE).astype(np.int64),
            "feedback": np.where(codes == CHOICE_NOT_INTERESTED, NOT_INTERESTED, 0).astype(np.int64)}


class LikesActions(gym.ActionWrapper):
    """Likes-only actions, with an optional discrete search menu and, with `not_interested`, a
    per-position choice among skip, like and not interested (see the module docstring)."""

    def __init__(self, env: gym.Env, search_menu: str | Sequence[str] | None = None, *,
                 not_interested: bool = False):
        super().__init__(env)
        engine = env.unwrapped.engine  # type: ignore[attr-defined]
        self.slate_size = int(engine.slate_size)
        self.search_menu = search_menu_for(engine.dataset, search_menu)
        if self.search_menu and not engine.allow_search:
            raise ConfigError("a search menu needs an env made with allow_search=True")
        if not isinstance(not_interested, (bool, np.bool_)):
            raise ConfigError(f"not_interested must be True or False, got {not_interested!r}")
        self.not_interested = bool(not_interested)
        if self.not_interested and not engine.negative_feedback:
            raise ConfigError("not_interested needs an env made with negative_feedback=True")
        self.action_space = likes_action_space(self.slate_size, self.search_menu, self.not_interested)

    def action(self, action: Any) -> dict[str, Any]:
        values = (
            np.asarray(action).ravel().tolist() if not isinstance(action, (list, tuple)) else list(action)
        )
        expected = self.slate_size + (1 if self.search_menu else 0)
        if len(values) != expected:
            raise InvalidAction(f"the action must have {expected} entries, got {len(values)}: {action!r}")
        what = "the choice at position" if self.not_interested else "like at position"
        entries = [_exact_int(v, f"{what} {n}") for n, v in enumerate(values[: self.slate_size])]
        query = ""
        if self.search_menu:
            pick = _exact_int(values[-1], "the search-menu entry")
            if not 0 <= pick <= len(self.search_menu):
                raise InvalidAction(
                    f"the search-menu entry must be in [0, {len(self.search_menu)}], got {pick}"
                )
            query = self.search_menu[pick - 1] if pick else ""
        if not self.not_interested:
            return {"likes": np.asarray(entries, dtype=np.int64), "query": query}
        return {**choice_action(entries), "query": query}


# ----------------------------------------------------------------------------- observations


class ItemFeatures(gym.ObservationWrapper):
    """Observations as `SlateFeatures` vectors (tags, popularity, optional embedding, per position)."""

    def __init__(
        self,
        env: gym.Env,
        *,
        tags: bool = True,
        popularity: bool = True,
        embedding: "str | Encoder | None" = None,
        features: SlateFeatures | None = None,
    ):
        super().__init__(env)
        engine = env.unwrapped.engine  # type: ignore[attr-defined]
        self.features = features or SlateFeatures(
            engine.dataset,
            engine.slate_size,
            engine.budget,
            tags=tags,
            popularity=popularity,
            embedding=embedding,
        )
        self.observation_space = self.features.space()

    def observation(self, observation: Mapping[str, Any]) -> np.ndarray:
        return self.features.encode(observation)


# ----------------------------------------------------------------------------- info


class NumericInfo(gym.Wrapper):
    """`info` with numbers only, the same keys on every step (see the module docstring)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._keys: tuple[str, ...] | None = None

    @staticmethod
    def numeric(info: Mapping[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {
            "round": float(info.get("round", 0)),
            "slate_items": float(len(info.get("slate_item_ids", ()))),
            "new_likes": float(len(info.get("new_likes", ()))),
            "from_search": float(info.get("slate_source") == "search"),
        }
        for name, value in sorted((info.get("metrics") or {}).items()):
            if isinstance(value, (numbers.Real, np.number)) and not isinstance(value, bool):
                out[f"metric/{name}"] = float(value)
        for name, value in sorted((info.get("tokens") or {}).items()):
            if isinstance(value, (numbers.Real, np.number)):
                out[f"tokens/{name}"] = float(value)
        return out

    def _same_keys(self, info: dict[str, float]) -> dict[str, float]:
        if self._keys is None:
            self._keys = tuple(info)
        return {key: info.get(key, float("nan")) for key in self._keys}

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        return observation, self._same_keys(self.numeric(info))

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, self._same_keys(self.numeric(info))


# ----------------------------------------------------------------------------- all together


def rl_env(
    env: gym.Env | str = "ctrlsim/TargetDiscovery-v0",
    *,
    search_menu: str | Sequence[str] | None = None,
    not_interested: bool = False,
    tags: bool = True,
    popularity: bool = True,
    embedding: "str | Encoder | None" = None,
    numeric_info: bool = True,
    **make_kwargs: Any,
) -> gym.Env:
    """A probe env ready for RL libraries: `LikesActions`, `ItemFeatures` and `NumericInfo` around
    `env` (a made env, or an env id made here with `make_kwargs`; search is on only with a menu, and
    negative feedback only with `not_interested`, the per-position choice among skip, like and not
    interested).

    `rl_env("ctrlsim/TargetDiscovery-v0", recommender="dial:1", target="War")` trains as it is with
    `stable_baselines3.PPO("MlpPolicy", env)`."""
    if isinstance(env, str):
        make_kwargs.setdefault("allow_search", bool(search_menu))
        if not_interested:
            make_kwargs.setdefault("negative_feedback", True)
        env = gym.make(env, **make_kwargs)
    elif make_kwargs:
        raise ConfigError(f"rl_env: {sorted(make_kwargs)} only apply when the env is given by id")
    wrapped: gym.Env = ItemFeatures(
        LikesActions(env, search_menu, not_interested=not_interested),
        tags=tags,
        popularity=popularity,
        embedding=embedding,
    )
    return NumericInfo(wrapped) if numeric_info else wrapped
