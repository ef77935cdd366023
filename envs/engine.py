"""The interaction loop shared by `ProbeEnv` and `PopulationEnv`.

Each round every live probe acts on its current slate (likes some positions,
optionally issues a search query); likes are appended to its history in the
black box; then all probes that did not search get their next slate from ONE
batched `recommend` call, and searching probes get BM25 search results.
With a `PhasePlan` each info also names the phase of the round it describes.
"""
from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass, field, fields
from typing import Mapping, Sequence

import numpy as np
from gymnasium import spaces

from ctrlsim.backends import TokenMeter
from ctrlsim.backends.meter import Usage
from ctrlsim.data import Dataset
from ctrlsim.errors import BudgetExceededError, ConfigError, InvalidAction
from ctrlsim.recommenders import Recommender, UserState
from ctrlsim.recommenders.search import CatalogueSearch

from .feedback import FEEDBACK_KEYS, NO_FEEDBACK, Feedback, check_feedback, feedback_spaces
from .phases import STEER, PhasePlan
from .tasks import SOURCE_RECOMMENDER as RECOMMENDER_SLATE
from .tasks import SOURCE_SEARCH as SEARCH_SLATE
from .tasks import ProbeRecord, Task

QUERY_CHARSET = string.ascii_letters + string.digits + " -'&:,.!?"
MAX_QUERY_LENGTH = 64
ACTION_KEYS = ("likes", "query")
SOURCE_RECOMMENDER, SOURCE_SEARCH = 0, 1


@dataclass(frozen=True)
class ProbeSpec:
    """Who a probe is: seed history (liked items, oldest first), optional profile and attributes.

    `name` is the probe's stable id: its token-meter key and its `UserState.user_id`. It
    follows the probe, not its roster position, so a probe keeps its tokens across roster
    swaps and a newcomer starts from zero. Probes built from users are "user-<id>"; LLM
    personas use their `probe_id`; a spec given without a name is named after its seed
    history ("probe-<hash>"), so the same spec always gets the same id.
    """

    history: tuple[str, ...]
    profile: str | None = None
    attributes: Mapping[str, object] = field(default_factory=dict)
    name: str | None = None

    def __post_init__(self):
        if isinstance(self.history, np.ndarray):
            object.__setattr__(self, "history", tuple(self.history.tolist()))
        if isinstance(self.history, (str, bytes)) or not isinstance(self.history, Sequence):
            raise ConfigError(f"ProbeSpec.history must be a sequence of item ids, got {self.history!r}")
        if not all(isinstance(i, str) for i in self.history):
            bad = next(i for i in self.history if not isinstance(i, str))
            raise ConfigError(f"ProbeSpec.history holds item ids as strings, "
                              f"got {bad!r} ({type(bad).__name__})")
        object.__setattr__(self, "history", tuple(self.history))
        if self.name is None:
            digest = hashlib.sha1("\x1f".join(self.history).encode()).hexdigest()[:10]
            object.__setattr__(self, "name", f"probe-{digest}")
        elif not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"ProbeSpec.name must be a non-empty string, got {self.name!r}")


@dataclass
class Probe:
    """Runtime state of one probe in an episode.

    `key` is the probe's stable id (`spec.name`); `agent` the env's name for its slot
    ("probe_3" in a population). `tokens_at_start` is the meter's reading for `key` when
    the episode began: the episode's tokens are what was charged since.
    """

    key: str
    spec: ProbeSpec
    record: ProbeRecord
    agent: str = ""
    tokens_at_start: Usage = field(default_factory=Usage)
    slate: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    source: int = SOURCE_RECOMMENDER
    shown: dict = field(default_factory=dict)  # catalogue index -> None, insertion-ordered
    rounds: int = 0

    def state(self, dataset: Dataset) -> UserState:
        ids = dataset.item_ids
        record = self.record
        return UserState(history=record.history, profile=self.spec.profile,
                         attributes=dict(self.spec.attributes), shown=tuple(ids[list(self.shown)]),
                         user_id=self.key, not_interested=tuple(record.not_interested),
                         disliked=tuple(record.disliked), blocked_tags=tuple(record.blocked_tags))


def observation_space(n_items: int, slate_size: int, budget: int) -> spaces.Dict:
    """slate: catalogue indices (-1 pads a short slate); source: 0 recommender, 1 search; round."""
    n_items, slate_size, budget = int(n_items), int(slate_size), int(budget)
    return spaces.Dict({
        "slate": spaces.Box(low=-1, high=n_items - 1, shape=(slate_size,), dtype=np.int64),
        "source": spaces.Discrete(2),
        "round": spaces.Discrete(budget + 1),
    })


#: How often `QuerySpace.sample()` searches when search is on: a sampled episode is mostly
#: recommender rounds (the thing measured), with a search now and then.
SEARCH_PROBABILITY = 0.1


class QuerySpace(spaces.Text):
    """The `query` action: a `Text` space (same `contains`, charset and length bounds) whose
    `sample()` gives what a sensible random probe would send.

    Plain `Text.sample()` types a random string almost every time, so a randomly acting client
    (random exploration, vector envs, PettingZoo's API tests) would search nearly every round and
    get back empty slates. Here `sample()` returns "" (no search, the next slate comes from the
    recommender) unless search is on (`allow_search`), and then a query only with probability
    `search_probability`, drawn from `vocabulary` (the catalogue's tag names), so a sampled search
    finds items. Draws come from the space's own generator (`space.seed(n)`). An explicit `mask`
    or `probability` argument samples exactly as `Text` does.
    """

    def __init__(self, max_length: int = MAX_QUERY_LENGTH, *, vocabulary: Sequence[str] = (),
                 allow_search: bool = True, search_probability: float = SEARCH_PROBABILITY,
                 charset: str = QUERY_CHARSET, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=int(max_length), min_length=0, charset=charset, seed=seed)
        if not 0.0 <= float(search_probability) <= 1.0:
            raise ConfigError(f"search_probability must be in [0, 1], got {search_probability!r}")
        words = (str(v) for v in vocabulary)
        self.vocabulary = tuple(q for q in words if q.strip() and spaces.Text.contains(self, q))
        self.allow_search = bool(allow_search)
        self.search_probability = float(search_probability)

    def sample(self, mask=None, probability=None) -> str:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        if not self.allow_search or not self.vocabulary or self.search_probability <= 0.0:
            return ""
        if self.np_random.random() >= self.search_probability:
            return ""
        return self.vocabulary[int(self.np_random.integers(len(self.vocabulary)))]

    def __repr__(self) -> str:
        return (f"QuerySpace({self.min_length}, {self.max_length}, allow_search={self.allow_search}, "
                f"search_probability={self.search_probability}, vocabulary={len(self.vocabulary)} queries)")


def query_vocabulary(dataset: Dataset, max_length: int = MAX_QUERY_LENGTH) -> tuple[str, ...]:
    """The queries `QuerySpace.sample()` draws: the catalogue's tag names that fit the query space."""
    return tuple(t for t in map(str, dataset.tags)
                 if t.strip() and len(t) <= max_length and set(t) <= set(QUERY_CHARSET))


def action_space(slate_size: int, max_query: int = MAX_QUERY_LENGTH, *, allow_search: bool = True,
                 vocabulary: Sequence[str] = ()) -> spaces.Dict:
    """likes: 1 marks a liked slate position (all zeros = skip); query: non-empty = search next."""
    return spaces.Dict({
        "likes": spaces.MultiBinary(int(slate_size)),
        "query": QuerySpace(max_query, vocabulary=vocabulary, allow_search=allow_search),
    })


def check_likes(likes: object, slate_size: int) -> np.ndarray:
    """`likes` as an int64 vector, checked BEFORE any cast: integers or bools that are 0 or 1,
    or floats that are exactly 0.0 or 1.0 (RL libraries such as Stable-Baselines3 send the
    `MultiBinary` space's values as floats).

    Casting first would read 0.9 as "not liked", 1.7 as "liked" and "1" as a like; each of
    those (and nan, 1.0000001) is an `InvalidAction` naming the value instead.
    """
    values = likes.tolist() if isinstance(likes, np.ndarray) else likes
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise InvalidAction(f"'likes' must be a sequence of {slate_size} zeros/ones, got {likes!r}")
    flat = list(values)
    if len(flat) != slate_size:
        raise InvalidAction(f"'likes' must have {slate_size} entries (one per slate position), "
                            f"got {len(flat)}: {likes!r}")
    for pos, value in enumerate(flat):
        if isinstance(value, (bool, np.bool_)):
            continue
        if isinstance(value, (float, np.floating)):
            if value == 0.0 or value == 1.0:  # exactly: nan, 0.9 and 1.0000001 are not likes
                continue
            raise InvalidAction(f"'likes' must hold 0 or 1 (floats only as exactly 0.0 or 1.0); "
                                f"position {pos} is {value!r} in {likes!r}")
        if not isinstance(value, (int, np.integer)):
            raise InvalidAction(f"'likes' must hold integers, bools or floats 0/1; "
                                f"position {pos} is {value!r} "
                                f"({type(value).__name__}) in {likes!r}")
        if value not in (0, 1):
            raise InvalidAction(f"'likes' must hold 0 or 1; position {pos} is {value!r} in {likes!r}")
    return np.asarray(flat, dtype=np.int64)


def check_query(query: object, max_length: int = MAX_QUERY_LENGTH) -> str:
    """A search query as the action space's `Text` declares it: at most `max_length`
    characters from `QUERY_CHARSET` (None counts as no query)."""
    if query is None:
        return ""
    if not isinstance(query, str):
        raise InvalidAction(f"'query' must be a string, got {query!r} ({type(query).__name__})")
    if len(query) > max_length:
        raise InvalidAction(f"'query' may have at most {max_length} characters, got {len(query)}: "
                            f"{query[:80]!r}")
    outside = sorted(set(query) - set(QUERY_CHARSET))
    if outside:
        raise InvalidAction(f"'query' {query!r} has characters outside the action space's charset: "
                            f"{''.join(outside)!r} (allowed: letters, digits and {QUERY_CHARSET[62:]!r})")
    return query.strip()


class InteractionEngine:
    def __init__(self, recommender: Recommender, task: Task, *, slate_size: int, budget: int,
                 token_meter: TokenMeter | None = None, allow_search: bool = True,
                 phases: PhasePlan | None = None, negative_feedback: bool = False):
        if isinstance(slate_size, bool) or not isinstance(slate_size, (int, np.integer)) or slate_size < 1:
            raise ConfigError(f"slate_size must be an integer >= 1, got {slate_size!r}")
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
            raise ConfigError(f"budget must be an integer >= 1, got {budget!r}")
        self.recommender, self.task = recommender, task
        self.dataset = recommender.dataset
        if not isinstance(allow_search, (bool, np.bool_)):
            raise ConfigError(f"allow_search must be True or False, got {allow_search!r}")
        self.slate_size, self.budget = int(slate_size), int(budget)  # numpy integers as Python ints
        self.allow_search = bool(allow_search)
        self.token_meter = token_meter
        if phases is not None and phases.total != self.budget:
            raise ConfigError(f"budget={self.budget} differs from the phase plan's {phases.total} rounds")
        self.phases = phases
        if not isinstance(negative_feedback, (bool, np.bool_)):
            raise ConfigError(f"negative_feedback must be True or False, got {negative_feedback!r}")
        self.negative_feedback = bool(negative_feedback)
        # the tags a `block` action names by index (envs.feedback), in the catalogue's order
        self.block_tags = tuple(map(str, self.dataset.tags)) if self.negative_feedback else ()
        # the target tags, which infos name as the goal in steer rounds
        self.goal = [str(t) for t in task.config.get("target") or []] if phases is not None else []
        self._search: CatalogueSearch | None = None
        self._texts = self.dataset.items["text"].to_numpy()

    def action_space(self) -> spaces.Dict:
        """The env's action space: `QuerySpace.sample()` searches only where search is on, rarely,
        with the catalogue's tag names."""
        space = action_space(self.slate_size, allow_search=self.allow_search,
                             vocabulary=query_vocabulary(self.dataset))
        if self.negative_feedback:
            space = spaces.Dict({**space.spaces, **feedback_spaces(self.slate_size, self.block_tags)})
        return space

    @property
    def search(self) -> CatalogueSearch:
        if self._search is None:
            self._search = CatalogueSearch(self.dataset)
        return self._search

    # ----------------------------------------------------------------- probes
    def start(self, agent_specs: Sequence[tuple[str, ProbeSpec]]) -> list[Probe]:
        """New episode for each (agent slot, spec); probe names must be unique in the roster."""
        names = [str(spec.name) for _, spec in agent_specs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"probe names must be unique in a roster (they key each probe's tokens); "
                              f"repeated: {', '.join(map(repr, repeated))}")
        probes = []
        for agent, spec in agent_specs:
            if not isinstance(spec, ProbeSpec):
                raise ConfigError(f"a roster holds ProbeSpec objects, got {spec!r} for {agent}")
            self.dataset.check_items(spec.history)
            key = str(spec.name)
            start = self.token_meter.usage(key) if self.token_meter is not None else Usage()
            probes.append(Probe(key, spec, ProbeRecord(tuple(spec.history)), agent=agent,
                                tokens_at_start=start))
        self._next_slates(probes, [""] * len(probes))
        return probes

    def validate(self, action) -> tuple[np.ndarray, str, Feedback]:
        """(likes vector, stripped query, negative feedback) of a well-formed action; `InvalidAction`
        otherwise."""
        if not isinstance(action, Mapping) or "likes" not in action:
            raise InvalidAction(f"action must be a dict with 'likes' (and optional 'query'), got {action!r}")
        keys = ACTION_KEYS + FEEDBACK_KEYS if self.negative_feedback else ACTION_KEYS
        unknown = sorted(str(k) for k in action if k not in keys)
        if unknown:
            off = [k for k in unknown if k in FEEDBACK_KEYS]
            raise InvalidAction(f"action has unknown key(s) {', '.join(map(repr, unknown))}; "
                                f"expected {list(keys)}"
                                + ("; negative feedback needs an env made with negative_feedback=True"
                                   if off else ""))
        likes, query = check_likes(action["likes"], self.slate_size), check_query(action.get("query"))
        if query and not self.allow_search:
            raise InvalidAction(f"search is off in this env (allow_search=False), got query {query!r}: "
                                "send an empty 'query' (Appendix B: a_t in L_t or a skip)")
        feedback = check_feedback(action, likes, self.block_tags) if self.negative_feedback else NO_FEEDBACK
        return likes, query, feedback

    def episode_tokens(self, probe: Probe) -> Usage:
        """Tokens charged to the probe's key since its episode began."""
        if self.token_meter is None:
            return Usage()
        now, start = self.token_meter.usage(probe.key), probe.tokens_at_start
        return Usage(**{f.name: getattr(now, f.name) - getattr(start, f.name) for f in fields(Usage)})

    def act(self, probe: Probe, likes: np.ndarray, query: str,
            feedback: Feedback = NO_FEEDBACK) -> tuple[list[str], float]:
        """Apply one probe's likes (and negative feedback) on its current slate; returns (new likes,
        reward).

        Every like joins the probe's history (the black box sees it), and the round records the
        slate's source and the query; the task's reward and metrics count likes on recommender
        slates only, so what search found never passes for the recommender's doing."""
        if probe.rounds >= self.budget:
            raise BudgetExceededError(f"probe {probe.key} already used its budget of {self.budget} rounds")
        positions = np.flatnonzero(likes[: len(probe.slate)])
        have = set(probe.record.history)
        new = []
        for idx in probe.slate[positions]:
            item = str(self.dataset.item_ids[idx])
            if item not in have:
                new.append(item)
                have.add(item)
        record = probe.record
        from_search = probe.source == SOURCE_SEARCH
        record.likes.extend(new)
        record.likes_per_round.append(new)
        record.slates.append([int(i) for i in probe.slate])
        record.sources.append(SEARCH_SLATE if from_search else RECOMMENDER_SLATE)
        record.queries.append(query)
        record.add_feedback(*self._feedback_items(probe, feedback))
        probe.rounds += 1
        if from_search:  # search results earn nothing: the reward is for steering the recommender
            return new, self.task.step_reward(record, [], [])
        return new, self.task.step_reward(record, new, probe.slate.tolist())

    def _feedback_items(self, probe: Probe, feedback: Feedback) -> tuple[list[str], list[str], str | None]:
        """(not-interested items, disliked items, blocked tag) of a probe's feedback on its slate."""
        def items(positions):
            return [str(self.dataset.item_ids[probe.slate[p]]) for p in positions if p < len(probe.slate)]

        return items(feedback.not_interested), items(feedback.disliked), feedback.block

    def advance(self, probes: Sequence[Probe], queries: Sequence[str]) -> None:
        """Next slates for probes that still have budget."""
        live = [(p, q) for p, q in zip(probes, queries) if p.rounds < self.budget]
        if live:
            self._next_slates([p for p, _ in live], [q for _, q in live])

    def _next_slates(self, probes: Sequence[Probe], queries: Sequence[str]) -> None:
        recommend = [p for p, q in zip(probes, queries) if not q]
        if recommend:
            slates = self.recommender.recommend([p.state(self.dataset) for p in recommend], self.slate_size)
            for probe, slate in zip(recommend, slates):
                self._show(probe, self.dataset.indices(slate.item_ids), SOURCE_RECOMMENDER)
        for probe, query in zip(probes, queries):
            if query:
                exclude = self.dataset.indices(probe.record.history)
                self._show(probe, self.search.search(query, self.slate_size, exclude=exclude), SOURCE_SEARCH)

    @staticmethod
    def _show(probe: Probe, slate: np.ndarray, source: int) -> None:
        probe.slate, probe.source = np.asarray(slate, dtype=np.int64), source
        probe.shown.update(dict.fromkeys(int(i) for i in slate))

    # ----------------------------------------------------------- observation
    def observation(self, probe: Probe) -> dict:
        slate = np.full(self.slate_size, -1, dtype=np.int64)
        slate[: len(probe.slate)] = probe.slate
        return {"slate": slate, "source": probe.source, "round": min(probe.rounds, self.budget)}

    def info(self, probe: Probe, new_likes: Sequence[str] = ()) -> dict:
        texts = self._texts
        info = {
            "probe": probe.key,
            "round": probe.rounds,
            "slate_item_ids": [str(self.dataset.item_ids[i]) for i in probe.slate],
            "slate_items": [str(texts[i]) for i in probe.slate],
            "slate_source": SEARCH_SLATE if probe.source == SOURCE_SEARCH else RECOMMENDER_SLATE,
            "new_likes": list(new_likes),
            "metrics": self.task.probe_metrics(probe.record),
        }
        if self.phases is not None:  # the round the probe acts in next (the last one once done)
            phase = self.phases.phase_of(min(probe.rounds + 1, self.phases.total))
            info["phase"] = phase
            info["goal"] = list(self.goal) if phase == STEER else []
            info["direction"] = self.phases.direction
        if self.token_meter is not None:
            usage = self.episode_tokens(probe)
            probe.record.tokens = usage.total_tokens
            info["tokens"] = usage.to_dict()
        return info

    def render_text(self, probe: Probe) -> str:
        where = "search results" if probe.source == SOURCE_SEARCH else "recommendations"
        label = f"{probe.agent}: {probe.key}" if probe.agent and probe.agent != probe.key else probe.key
        lines = [f"[{label}] round {probe.rounds}/{self.budget}, {len(probe.record.likes)} likes; {where}:"]
        texts = self.dataset.items["text"]
        lines += [f"  {n}. {texts.iat[i]}" for n, i in enumerate(probe.slate)]
        return "\n".join(lines)
