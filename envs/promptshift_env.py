"""`PromptShiftEnv`: PromptShift's identity-cue audit as a single-step `gymnasium.Env`.

One episode = one (user, identity-cue scenario) pair of the PromptShift
protocol (Gan & Dong, sections 3-5). At `reset` the LLM recommender generates
(or takes from the env's cache) the user's N-item lists under the history-only
prompt, the identity-cued prompt of the scenario and the three identity-free
paraphrases; the agent then reranks the cue-conditioned candidate pool, and
`step` scores the reranked top K with the paper's metrics.

The module also holds the protocol's data preparation (`PromptShiftData`) and
the list evaluation (`evaluate_ranking`) that the table runner reuses, so the
environment and the paper tables compute every number the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import gymnasium as gym
import numpy as np
import pandas as pd
from gymnasium import spaces

from ctrlsim.backends import LLM, TokenMeter, load_llm
from ctrlsim.data import Dataset, chronological_split, identity_slices, load_dataset
from ctrlsim.data.matching import TitleMatcher, display_title, normalize_title
from ctrlsim.data.splits import SCENARIOS
from ctrlsim.errors import ConfigError, UnknownUserError
from ctrlsim.metrics.promptshift import (
    RHO,
    SliceTable,
    difficulty_at_k,
    mainstreamness,
    scenario_mainstreamness,
    slice_shift,
)
from ctrlsim.metrics.ranking import drift, hit_rate_at_k, mrr_at_k, ndcg_at_k
from ctrlsim.recommenders.llm_lists import (
    HISTORY_ONLY,
    PARAPHRASE_CONDITIONS,
    GeneratedList,
    LLMListRecommender,
    PromptCondition,
)

DEFAULT_LLM = "qwen2.5-1.5b"
EMPTY, UNMATCHED = -2, -1           # observation codes for a candidate slot
SCENARIO_OF_PREFIX = {"gender": "gender", "age": "age", "cross": "gender_age"}
REWARDS = ("slice_shift", "difficulty")


def scenario_of_slice(slice_id: str) -> str:
    """"gender_F" -> "gender", "age_older" -> "age", "cross_F_older" -> "gender_age"."""
    prefix = slice_id.partition("_")[0]
    if prefix not in SCENARIO_OF_PREFIX:
        raise ConfigError(f"slice id {slice_id!r} belongs to no identity scenario")
    return SCENARIO_OF_PREFIX[prefix]


# --------------------------------------------------------------------- data
@dataclass(eq=False)
class PromptShiftData:
    """Everything PromptShift derives from the dataset, built once (no LLM involved).

    Interactions are split per user in time order into fit / valid / test
    (72/8/20); positives are ratings >= `positive_threshold` (None: every
    interaction is positive, as for implicit feedback) within each part.
    Eligible users have >= `min_fit_positives` fit positives, >= 1 test positive
    and an identity slice in every scenario (section 5.1). The prompt history
    H_u is the user's last `history_len` fit positives, oldest first. The slice
    table is built from all users' fit positives over the slices of every
    scenario; phi_bar_s is the mean mainstreamness over the eligible users.
    """

    dataset: Dataset
    scenarios: tuple[str, ...]
    positive_threshold: float | None
    history_len: int
    min_fit_positives: int
    fractions: tuple[float, float, float]
    slices: dict[str, pd.Series]
    table: SliceTable
    fit_positives: dict[str, list[str]]
    valid_positives: dict[str, set[str]]
    test_positives: dict[str, set[str]]
    eligible: list[str]
    scenario_means: dict[str, float]

    @classmethod
    def build(cls, dataset: Dataset, *, scenarios: Sequence[str] = SCENARIOS, positive_threshold: float | None = 4.0,
              history_len: int = 25, min_fit_positives: int = 25,
              fractions: tuple[float, float, float] = (0.72, 0.08, 0.20)) -> "PromptShiftData":
        scenarios = tuple(scenarios)
        if not scenarios or any(s not in SCENARIOS for s in scenarios):
            raise ConfigError(f"scenarios must be a non-empty subset of {SCENARIOS}, got {scenarios}")
        if history_len < 1:
            raise ConfigError(f"history_len must be >= 1, got {history_len}")
        split = chronological_split(dataset, tuple(fractions))

        def positives(frame: pd.DataFrame) -> pd.DataFrame:
            return frame if positive_threshold is None else frame[frame["rating"] >= positive_threshold]

        fit, valid, test = positives(split.fit), positives(split.valid), positives(split.test)
        fit_pos = {u: g["item_id"].tolist() for u, g in fit.groupby("user_id", sort=False)}
        valid_pos = {u: set(g["item_id"]) for u, g in valid.groupby("user_id", sort=False)}
        test_pos = {u: set(g["item_id"]) for u, g in test.groupby("user_id", sort=False)}
        slices = {s: identity_slices(dataset, s) for s in scenarios}
        memberships: dict[str, list[str]] = {}
        for s in scenarios:
            for g, users in slices[s].groupby(slices[s]).groups.items():
                memberships[str(g)] = [str(u) for u in users]
        all_users = set(dataset.users["user_id"]) | set(dataset.user_ids)
        table = SliceTable.build(fit["user_id"].to_numpy(), fit["item_id"].to_numpy(),
                                 dict(sorted(memberships.items())), dataset.item_ids, all_users=all_users)
        in_all = set.intersection(*(set(slices[s].index) for s in scenarios))
        eligible = [u for u in dataset.user_ids
                    if len(fit_pos.get(u, ())) >= max(min_fit_positives, 1) and test_pos.get(u) and u in in_all]
        data = cls(dataset, scenarios, positive_threshold, int(history_len), int(min_fit_positives),
                   tuple(fractions), slices, table, fit_pos, valid_pos, test_pos, eligible, {})
        data.scenario_means = {s: scenario_mainstreamness(data.mainstreamness(u, s) for u in eligible)
                               for s in scenarios}
        return data

    @property
    def config(self) -> dict:
        return {"dataset": self.dataset.name, "scenarios": list(self.scenarios),
                "positive_threshold": self.positive_threshold, "history_len": self.history_len,
                "min_fit_positives": self.min_fit_positives, "fractions": list(self.fractions)}

    @property
    def slice_names(self) -> tuple[str, ...]:
        """Slice ids in the order of the observation's `slice` index (the table's columns, "*" excluded)."""
        return self.table.slice_ids[:-1]

    def slice_means(self) -> dict[str, float]:
        """Slice id -> phi_bar_s of its scenario (what the adaptive reranker compares phi_bar_u with)."""
        return {g: self.scenario_means[scenario_of_slice(g)] for g in self.slice_names
                if scenario_of_slice(g) in self.scenario_means}

    def check_user(self, user: str) -> str:
        user = str(user)
        if user not in self.fit_positives:
            raise UnknownUserError(f"user {user!r} has no fit positives in {self.dataset.name!r}")
        return user

    def history(self, user: str) -> list[str]:
        """H_u: the last `history_len` fit positives, oldest first."""
        return self.fit_positives[self.check_user(user)][-self.history_len:]

    def history_titles(self, user: str) -> list[str]:
        items = self.dataset.items
        rows = self.dataset.indices(self.history(user))
        return [display_title(t, y) for t, y in zip(items["title"].to_numpy()[rows], items["year"].to_numpy()[rows])]

    def slice_of(self, user: str, scenario: str) -> str:
        try:
            return str(self.slices[scenario][str(user)])
        except KeyError:
            raise ConfigError(f"user {user!r} has no identity slice in scenario {scenario!r}") from None

    def mainstreamness(self, user: str, scenario: str) -> float:
        """phi_bar_u over H_u in the user's slice of `scenario`."""
        return mainstreamness(self.table, self.history(user), self.slice_of(user, scenario))

    def positives(self, user: str, part: str = "test") -> set[str]:
        if part not in ("test", "valid"):
            raise ConfigError(f"part must be 'test' or 'valid', got {part!r}")
        source = self.test_positives if part == "test" else self.valid_positives
        return set(source.get(str(user), set()))


# ------------------------------------------------------------ candidate lists
@dataclass
class CandidateList:
    """A generated list after catalogue matching.

    `item_ids[k]` is the matched catalogue id of `titles[k]` or None; a later
    title that matches an item already in the list is dropped, so ids are
    distinct. `in_history` counts entries that repeat the user's prompt history
    (dropped when `exclude_history`). `keys` identify entries for RBO: the item id, or "?" + the
    normalised title for an unmatched entry.
    """

    condition: str
    titles: list[str]
    item_ids: list[str | None]
    kinds: list[str]
    generated: GeneratedList
    dropped_duplicates: int = 0
    in_history: int = 0

    @classmethod
    def from_generated(cls, generated: GeneratedList, matcher: TitleMatcher, *, history: Sequence[str] = (),
                       exclude_history: bool = False) -> "CandidateList":
        """Match the titles; `exclude_history=True` drops items of the user's prompt history."""
        titles, ids, kinds, seen, dropped, hist = [], [], [], set(), 0, set(history)
        in_history = 0
        for match in matcher.match_many(generated.titles):
            if match.item_id is not None and match.item_id in seen:
                dropped += 1
                continue
            if match.item_id is not None and match.item_id in hist:
                in_history += 1
                if exclude_history:
                    continue
            if match.item_id is not None:
                seen.add(match.item_id)
            titles.append(match.title)
            ids.append(match.item_id)
            kinds.append(match.kind)
        return cls(generated.condition, titles, ids, kinds, generated, dropped, in_history)

    @property
    def keys(self) -> list[str]:
        return [i if i is not None else "?" + normalize_title(t) for i, t in zip(self.item_ids, self.titles)]

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in ("exact", "exact_title", "no_article", "fuzzy", "none")}
        for k in self.kinds:
            out[k] += 1
        out.update(matched=len(self.kinds) - out["none"], unmatched=out["none"], total=len(self.kinds),
                   dropped_duplicates=self.dropped_duplicates, in_history=self.in_history,
                   parse_error=int(self.generated.error is not None))
        return out

    def rows(self, dataset: Dataset) -> np.ndarray:
        """Catalogue indices, UNMATCHED (-1) for unmatched entries."""
        index = dataset.item_index
        return np.array([index[i] if i is not None else UNMATCHED for i in self.item_ids], dtype=np.int64)


def evaluate_ranking(data: PromptShiftData, slice_id: str, ranked: Sequence[int], candidates: CandidateList,
                     reference: CandidateList, relevant: set[str], *, k: int = 20, p: float = 0.9,
                     rho: float = RHO, unmatched: str = "zero") -> dict[str, float]:
    """The paper's per-user metrics of a reranked cue list (section 5.4).

    `ranked` are positions in `candidates` in the new order (the whole pool or
    a prefix); the top k are evaluated. Drift = 1 - RBO_p(L^0[:k], L[:k]);
    SliceShift = mean Delta phi(L[:k]) - mean Delta phi(L^0[:k]) in `slice_id`;
    Difficulty@k, HitRate@k, MRR@k and NDCG@k against T^C_u = `relevant`
    restricted to the matched candidate pool (NDCG's ideal uses T^C_u; every
    metric is 0 when the pool holds no held-out positive).
    """
    order = [int(s) for s in ranked][:k]
    top_ids = [candidates.item_ids[s] for s in order]
    top_keys = [candidates.keys[s] for s in order]
    pool = {i for i in candidates.item_ids if i is not None}
    t_pool = set(relevant) & pool
    ref_ids, ref_keys = reference.item_ids[:k], reference.keys[:k]
    ranking = [i if i is not None else "" for i in top_ids]
    return {
        "drift": drift(ref_keys, top_keys, p),
        "slice_shift": slice_shift(data.table, top_ids, ref_ids, slice_id, unmatched=unmatched),
        f"difficulty@{k}": difficulty_at_k(top_ids, t_pool, data.table, slice_id, k, rho=rho),
        f"hit_rate@{k}": hit_rate_at_k(ranking, t_pool, k),
        f"mrr@{k}": mrr_at_k(ranking, t_pool, k),
        f"ndcg@{k}": ndcg_at_k(ranking, t_pool, k),
        "pool_positives": float(len(t_pool)),
    }


# ---------------------------------------------------------------------- env
@dataclass
class Episode:
    user: str
    scenario: str
    slice_id: str
    cue: CandidateList
    reference: CandidateList
    paraphrases: list[CandidateList]
    usage: dict = field(default_factory=dict)


class PromptShiftEnv(gym.Env):
    """PromptShift audit of an LLM list recommender: rerank one cue-conditioned candidate pool.

    Episode: single step. `reset` draws a (user, scenario) pair with
    `self.np_random` (user uniformly among eligible users - >= 25 fit positives
    and >= 1 test positive - and scenario uniformly among `scenarios`), unless
    `options={"user_id": ..., "scenario": ...}` fixes them. The LLM lists
    L^0 (history-only), L^c (history + the scenario's identity-cue sentence)
    and L^{p,1..3} (paraphrases) for that user are generated once and cached
    in the env per (user, condition); the LLM itself loads at the first reset.

    Observation (Dict):
      candidates  Box(int64, N): catalogue index of the cue list's entry at each
                  LLM position, -1 when the title matched no catalogue item,
                  -2 for an empty slot (the LLM gave fewer than N distinct titles).
      ranks       Box(int64, N): the entry's original LLM rank 1..N, 0 for empty slots.
      slice       Discrete(#slices): index of the user's identity slice g_u in
                  `slice_names` (e.g. "gender_F", "age_older", "cross_M_young_adult").
      history     Box(int64, H): catalogue indices of the prompt history H_u, oldest first.
    The slice table (phi per item and slice) is `env.unwrapped.slice_table`.

    Action: Box([-1, 1], N) - a score per candidate slot. The env ranks the
    non-empty slots by descending score, ties by original rank, and keeps the
    top K (a reranking policy; `agents.rerankers` implements B0-B3).

    Reward: -|SliceShift| of the reranked top K (reward="slice_shift", default:
    the paper's goal is SliceShift -> 0 without any use of held-out data), or
    Difficulty@K against the user's test positives (reward="difficulty").

    Episode end: `terminated=True`, `truncated=False` after the one step.

    Info at step: `drift`, `slice_shift`, `difficulty@K`, `hit_rate@K`,
    `mrr@K`, `ndcg@K` of the reranked list (against L^0 and the test positives
    in the pool), `cue_drift` and `cue_slice_shift` of the unmodified cue list
    (B0), `paraphrase_drift` (mean over P1-P3 against L^0) with
    `paraphrase_drifts`, `delta_d` = cue_drift - paraphrase_drift, `matches`
    (match counts per condition), `tokens` (tokens generated during this
    episode's reset - 0 when every list came from the env's cache -, the cost
    of its five lists, and the env's running totals), and the reranked item
    ids and titles.

    Options: `llm` (bundled spec, GGUF path, ... or an `LLM`; default
    "qwen2.5-1.5b"), `n_candidates` N=30, `k` K=20, `scenarios`, `users`
    (restrict the pool of users), `reward`, `exclude_history` (drop generated
    items that repeat the prompt history; off, as in the paper), `llm_cache`
    (a response-cache path), `data` (a prebuilt `PromptShiftData`, shared
    between envs; it then fixes dataset, scenarios, positives and history).
    Construction loads the dataset and builds the slice table but neither
    loads the LLM nor generates anything.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, llm: str | LLM = DEFAULT_LLM, *, dataset: Dataset | str = "ml-100k", n_candidates: int = 30,
                 k: int = 20, scenarios: Sequence[str] = SCENARIOS, history_len: int = 25,
                 min_fit_positives: int = 25, positive_threshold: float | None = 4.0,
                 users: Sequence[str] | None = None, reward: str = "slice_shift", p: float = 0.9, rho: float = RHO,
                 match_threshold: float = 90.0, max_tokens: int | None = None, temperature: float = 0.0,
                 llm_seed: int | None = None, llm_cache: str | None = None, domain: str = "movies",
                 exclude_history: bool = False, data: PromptShiftData | None = None,
                 render_mode: str | None = None):
        if not 1 <= k <= n_candidates:
            raise ConfigError(f"need 1 <= k <= n_candidates, got k={k}, n_candidates={n_candidates}")
        if reward not in REWARDS:
            raise ConfigError(f"reward must be one of {REWARDS}, got {reward!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"unsupported render_mode {render_mode!r}")
        if data is None:
            ds = load_dataset(dataset) if isinstance(dataset, str) else dataset
            data = PromptShiftData.build(ds, scenarios=scenarios, positive_threshold=positive_threshold,
                                         history_len=history_len, min_fit_positives=min_fit_positives)
        self.data = data
        self.dataset = data.dataset
        self.scenarios = data.scenarios
        self.n_candidates, self.k, self.reward_kind, self.p, self.rho = int(n_candidates), int(k), reward, p, rho
        self.matcher = TitleMatcher(self.dataset.items, threshold=match_threshold)
        self.exclude_history = bool(exclude_history)
        self._llm_spec, self._llm_cache = llm, llm_cache
        self._llm: LLM | None = llm if isinstance(llm, LLM) else None
        self._gen_options = {"max_tokens": max_tokens, "temperature": temperature, "seed": llm_seed,
                             "domain": domain}
        self._generator: LLMListRecommender | None = None
        self._lists: dict[tuple[str, str], CandidateList] = {}
        self.render_mode = render_mode
        if users is None:
            self.users = list(data.eligible)
        else:
            wanted = [str(u) for u in users]
            bad = [u for u in wanted if u not in set(data.eligible)]
            if bad:
                raise ConfigError(f"users not eligible for PromptShift: {bad[:5]}")
            self.users = wanted
        if not self.users:
            raise ConfigError("no eligible users")
        self.slice_names = data.slice_names
        n_items = len(self.dataset.items)
        self.observation_space = spaces.Dict({
            "candidates": spaces.Box(EMPTY, n_items - 1, shape=(self.n_candidates,), dtype=np.int64),
            "ranks": spaces.Box(0, self.n_candidates, shape=(self.n_candidates,), dtype=np.int64),
            "slice": spaces.Discrete(len(self.slice_names)),
            "history": spaces.Box(UNMATCHED, n_items - 1, shape=(data.history_len,), dtype=np.int64),
        })
        self.action_space = spaces.Box(-1.0, 1.0, shape=(self.n_candidates,), dtype=np.float32)
        self.episode: Episode | None = None
        self._stepped = False
        self.generated_usage = {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0, "cached_calls": 0}

    # ------------------------------------------------------------ properties
    @property
    def slice_table(self) -> SliceTable:
        return self.data.table

    @property
    def llm(self) -> LLM:
        """The LLM, loaded on first use."""
        if self._llm is None:
            self._llm = load_llm(self._llm_spec, cache=self._llm_cache)
        return self._llm

    @property
    def llm_loaded(self) -> bool:
        return self._llm is not None

    @property
    def generator(self) -> LLMListRecommender:
        if self._generator is None:
            self._generator = LLMListRecommender(self.llm, n=self.n_candidates, meter_key="promptshift",
                                                 **self._gen_options)
        return self._generator

    @property
    def config(self) -> dict:
        llm = self._llm.identity if self._llm is not None else {"spec": str(self._llm_spec)}
        return {"data": self.data.config, "llm": llm, "n_candidates": self.n_candidates, "k": self.k,
                "reward": self.reward_kind, "p": self.p, "rho": self.rho, "matcher": self.matcher.config,
                "exclude_history": self.exclude_history,
                "generation": dict(self._gen_options)}

    @property
    def token_meter(self) -> TokenMeter | None:
        return self._llm.meter if self._llm is not None else None

    # ------------------------------------------------------------- lists
    def cached_list(self, user: str, condition: PromptCondition) -> CandidateList | None:
        return self._lists.get((str(user), condition.name))

    def preload(self, user: str, generated: GeneratedList) -> CandidateList:
        """Put an already generated list (e.g. from a result file) into the env's cache."""
        cand = self._match(str(user), generated)
        self._lists[(str(user), generated.condition)] = cand
        return cand

    def _match(self, user: str, generated: GeneratedList) -> CandidateList:
        return CandidateList.from_generated(generated, self.matcher, history=self.data.history(user),
                                            exclude_history=self.exclude_history)

    def lists_for(self, user: str, conditions: Sequence[PromptCondition]) -> tuple[list[CandidateList], dict]:
        """The user's lists for `conditions`, generating the missing ones in one batched call."""
        user = self.data.check_user(user)
        missing = [c for c in dict.fromkeys(conditions) if (user, c.name) not in self._lists]
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0, "cached_calls": 0}
        if missing:
            history = self.data.history_titles(user)
            for gen in self.generator.generate([(history, c) for c in missing]):
                self._lists[(user, gen.condition)] = self._match(user, gen)
                usage["prompt_tokens"] += gen.prompt_tokens
                usage["completion_tokens"] += gen.completion_tokens
                usage["calls"] += 1
                usage["cached_calls"] += int(gen.cached)
            for key in usage:
                self.generated_usage[key] += usage[key]
        return [self._lists[(user, c.name)] for c in conditions], usage

    # ----------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        user = options.get("user_id")
        scenario = options.get("scenario")
        if user is None:
            user = self.users[int(self.np_random.integers(len(self.users)))]
        if scenario is None:
            scenario = self.scenarios[int(self.np_random.integers(len(self.scenarios)))]
        user = str(user)
        if scenario not in self.scenarios:
            raise ConfigError(f"scenario {scenario!r} is not one of {self.scenarios}")
        if user not in set(self.data.eligible):
            raise ConfigError(f"user {user!r} is not eligible for PromptShift")
        slice_id = self.data.slice_of(user, scenario)
        conditions = [PromptCondition("history", slice_id), HISTORY_ONLY, *PARAPHRASE_CONDITIONS]
        lists, usage = self.lists_for(user, conditions)
        self.episode = Episode(user, scenario, slice_id, lists[0], lists[1], list(lists[2:]), usage)
        self._stepped = False
        return self._observation(), self._reset_info()

    def _observation(self) -> dict:
        ep = self.episode
        n = self.n_candidates
        rows = ep.cue.rows(self.dataset)[:n]
        candidates = np.full(n, EMPTY, dtype=np.int64)
        candidates[: len(rows)] = rows
        ranks = np.zeros(n, dtype=np.int64)
        ranks[: len(rows)] = np.arange(1, len(rows) + 1)
        history = np.full(self.data.history_len, UNMATCHED, dtype=np.int64)
        hist_rows = self.dataset.indices(self.data.history(ep.user))
        history[: len(hist_rows)] = hist_rows
        return {"candidates": candidates, "ranks": ranks, "slice": int(self.slice_names.index(ep.slice_id)),
                "history": history}

    def _reset_info(self) -> dict:
        ep = self.episode
        return {"user_id": ep.user, "scenario": ep.scenario, "slice_id": ep.slice_id,
                "cue_titles": list(ep.cue.titles), "cue_item_ids": list(ep.cue.item_ids),
                "history_item_ids": self.data.history(ep.user),
                "mainstreamness": self.data.mainstreamness(ep.user, ep.scenario),
                "scenario_mainstreamness": self.data.scenario_means[ep.scenario],
                "tokens": dict(ep.usage)}

    def order_from_action(self, action) -> list[int]:
        """Non-empty slots by descending score, ties broken by original rank."""
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (self.n_candidates,):
            raise ConfigError(f"action must have shape ({self.n_candidates},), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ConfigError("action scores must be finite")
        filled = min(len(self.episode.cue.item_ids), self.n_candidates)
        return sorted(range(filled), key=lambda s: (-action[s], s))

    def evaluate(self, order: Sequence[int], *, part: str = "test") -> dict[str, float]:
        """Metrics of a reranked order of the current episode's candidate pool (no episode end).

        `part="valid"` scores against validation positives (for choosing parameters).
        """
        if self.episode is None:
            raise RuntimeError("call reset() before evaluate()")
        ep = self.episode
        return evaluate_ranking(self.data, ep.slice_id, order, ep.cue, ep.reference,
                                self.data.positives(ep.user, part), k=self.k, p=self.p, rho=self.rho)

    def list_drift(self, candidates: CandidateList) -> float:
        """Drift of a list's top K against the current episode's history-only list L^0."""
        if self.episode is None:
            raise RuntimeError("call reset() before list_drift()")
        return drift(self.episode.reference.keys[: self.k], candidates.keys[: self.k], self.p)

    def step(self, action):
        if self.episode is None or self._stepped:
            raise RuntimeError("call reset() before step()")
        ep = self.episode
        order = self.order_from_action(action)
        metrics = self.evaluate(order)
        base = self.evaluate(list(range(len(ep.cue.item_ids))))
        para = [self.list_drift(pl) for pl in ep.paraphrases]
        para_drift = float(np.mean(para)) if para else float("nan")
        reward = -abs(metrics["slice_shift"]) if self.reward_kind == "slice_shift" else metrics[f"difficulty@{self.k}"]
        top = order[: self.k]
        info = {
            **metrics,
            "cue_drift": base["drift"], "cue_slice_shift": base["slice_shift"],
            "paraphrase_drift": para_drift, "paraphrase_drifts": para, "delta_d": base["drift"] - para_drift,
            "matches": {c.condition: c.counts() for c in (ep.cue, ep.reference, *ep.paraphrases)},
            "tokens": {"episode": dict(ep.usage), "lists": self._list_cost(ep),
                       "env_total": dict(self.generated_usage)},
            "reranked_item_ids": [ep.cue.item_ids[s] for s in top],
            "reranked_titles": [ep.cue.titles[s] for s in top],
            "user_id": ep.user, "scenario": ep.scenario, "slice_id": ep.slice_id,
        }
        self._stepped = True
        return self._observation(), float(reward), True, False, info

    @staticmethod
    def _list_cost(ep: Episode) -> dict:
        """What generating this episode's five lists cost, whenever they were generated."""
        lists = (ep.cue, ep.reference, *ep.paraphrases)
        return {"prompt_tokens": sum(c.generated.prompt_tokens for c in lists),
                "completion_tokens": sum(c.generated.completion_tokens for c in lists), "lists": len(lists)}

    def render(self):
        if self.episode is None:
            return ""
        ep = self.episode
        lines = [f"user {ep.user} | {ep.scenario}: {ep.slice_id}"]
        for n, (title, iid) in enumerate(zip(ep.cue.titles, ep.cue.item_ids), 1):
            lines.append(f"{n:2d}. {title}" + (f"  [{iid}]" if iid is not None else "  [unmatched]"))
        return "\n".join(lines)


__all__ = ["CandidateList", "DEFAULT_LLM", "EMPTY", "Episode", "PromptShiftData", "PromptShiftEnv", "UNMATCHED",
           "evaluate_ranking", "scenario_of_slice"]
