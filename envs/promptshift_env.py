"""`PromptShiftEnv`: PromptShift's identity-cue audit as a single-step `gymnasium.Env`.

A thin Gymnasium wrapper over `ctrlsim.recommenders.promptshift.engine.PromptShiftEngine`:
one episode is one (user, identity-cue scenario) pair of the PromptShift
protocol (Gan & Dong, sections 3-5); the agent reranks the cue-conditioned
candidate pool and `step` scores the reranked top K with the paper's metrics.
"""
from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ctrlsim.backends import LLM, check_llm_argument
from ctrlsim.data import Dataset, load_dataset
from ctrlsim.data.splits import SCENARIOS
from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import EMPTY_SLOT, UNMATCHED_SLOT
from ctrlsim.recommenders.promptshift.data import PromptShiftData
from ctrlsim.recommenders.promptshift.defaults import (
    AUTO,
    DEFAULT_LLM,
    HISTORY_LEN,
    MATCH_THRESHOLD,
    MIN_FIT_POSITIVES,
    N_CANDIDATES,
    RBO_P,
    RHO,
    TEMPERATURE,
    K,
)
from ctrlsim.recommenders.promptshift.engine import Episode, PromptShiftEngine

from .checks import check_options, check_positive_int, check_render_mode, check_reset, check_seed
from .registration import PlainSpec
from .rendering import supported, text_frame

REWARDS = ("slice_shift", "difficulty")
# Read-only views of `env.engine` that the env answers as its own attributes (`env.slice_table`,
# `env.llm_loaded`, ...): what rerankers (`Reranker.for_env`) and callers read off the env.
ENGINE_ATTRIBUTES = ("data", "users", "k", "n_candidates", "slice_names", "slice_means", "slice_table",
                     "llm", "llm_loaded", "token_meter")
Observation = dict[str, Any]


class PromptShiftEnv(PlainSpec, gym.Env[Observation, np.ndarray]):
    """PromptShift audit of an LLM list generator: rerank one cue-conditioned candidate pool.

    Episode: single step. `reset` draws a (user, scenario) pair with
    `self.np_random` (user uniformly among the env's users - by default every
    eligible user: >= 25 fit positives and >= 1 test positive - and scenario
    uniformly among `scenarios`), unless `options={"user_id": ..., "scenario": ...}`
    fixes them. The engine generates (once per user and condition) the lists
    L^0 (history-only), L^c (history + the scenario's identity-cue sentence)
    and L^{p,1..3} (paraphrases); the LLM itself loads at the first reset.

    Observation (Dict):
      candidates  Box(int64, N): catalogue index of the cue list's entry at each
                  LLM position, UNMATCHED_SLOT (-1) when the title matched no
                  catalogue item, EMPTY_SLOT (-2) for an empty slot (the LLM gave
                  fewer than N distinct titles).
      ranks       Box(int64, N): the entry's original LLM rank 1..N, 0 for empty slots.
      slice       Discrete(#slices): index of the user's identity slice g_u in
                  `slice_names` (e.g. "gender_F", "age_older", "cross_M_young_adult").
      history     Box(int64, H): catalogue indices of the prompt history H_u, oldest first.
    The slice table (phi per item and slice) is `env.unwrapped.slice_table`.

    Action: Box([-1, 1], N) - a score per candidate slot. The env ranks the
    non-empty slots by descending score, ties by original rank, and keeps the
    top K (a reranking policy; `ctrlsim.recommenders.promptshift.rerankers` implements B0-B3).

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
    episode's reset - 0 when every list came from the engine's cache -, the
    cost of its five lists, and the running totals), and the reranked item
    ids and titles.

    Options: `llm` (a model spec such as "qwen2.5-0.5b", a GGUF path, or an
    `LLM`; default "qwen2.5-1.5b"), `n_candidates` N=30, `k` K=20,
    `scenarios`, `users` (the users U the env draws from; phi_bar_s is
    averaged over them), `reward`, `exclude_history` (drop generated items that
    repeat the prompt history; off, as in the paper), `llm_cache` (a
    response-cache path), `data` (a prebuilt `PromptShiftData`, shared between
    envs; it then fixes dataset, scenarios, positives and history). Render
    mode "ansi" returns the cue list as text, "rgb_array" an image of it (an unsupported mode is
    warned about at construction, and renders None). Construction loads the dataset
    and builds the slice table but neither loads the LLM nor generates anything.

    Attributes: `engine` (the `PromptShiftEngine`), and the engine's `ENGINE_ATTRIBUTES`
    read through the env: `data`, `users`, `k`, `n_candidates`, `slice_names`, `slice_means`
    (slice id -> phi_bar_s over the env's users, what the adaptive reranker B3 needs),
    `slice_table`, `llm` (loads it), `llm_loaded`, `token_meter`.
    Stepping before `reset` or twice in one episode, and rendering before the first
    `reset`, raise `ResetNeededError`.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 1}

    def __init__(self, llm: str | LLM = DEFAULT_LLM, *, dataset: Dataset | str = "ml-100k",
                 n_candidates: int = N_CANDIDATES, k: int = K, scenarios: Sequence[str] = SCENARIOS,
                 history_len: int = HISTORY_LEN, min_fit_positives: int = MIN_FIT_POSITIVES,
                 positive_threshold: float | str | None = AUTO, users: Sequence[str] | None = None,
                 reward: str = "slice_shift", p: float = RBO_P, rho: float = RHO,
                 match_threshold: float = MATCH_THRESHOLD, max_tokens: int | None = None,
                 temperature: float = TEMPERATURE,
                 llm_seed: int | None = None, llm_cache: str | None = None, domain: str | None = None,
                 exclude_history: bool = False, data: PromptShiftData | None = None,
                 render_mode: str | None = None):
        check_render_mode(render_mode, self.metadata, type(self).__name__)
        check_llm_argument(llm)  # before the data is built: a wrong type fails at once
        n_candidates, k = check_positive_int("n_candidates", n_candidates), check_positive_int("k", k)
        if reward not in REWARDS:
            raise ConfigError(f"reward must be one of {REWARDS}, got {reward!r}")
        if k > n_candidates:
            raise ConfigError(f"need 1 <= k <= n_candidates, got k={k}, n_candidates={n_candidates}")
        if data is None:
            ds = load_dataset(dataset) if isinstance(dataset, str) else dataset
            data = PromptShiftData.build(ds, scenarios=scenarios, positive_threshold=positive_threshold,
                                         history_len=history_len, min_fit_positives=min_fit_positives)
        self.engine = PromptShiftEngine(
            data, llm, users=users, n_candidates=n_candidates, k=k, p=p, rho=rho,
            match_threshold=match_threshold, max_tokens=max_tokens, temperature=temperature,
            llm_seed=llm_seed, llm_cache=llm_cache, domain=domain, exclude_history=exclude_history)
        self.render_mode = render_mode
        self.reward_kind = reward
        n, n_items = self.engine.n_candidates, len(data.dataset.items)
        self.observation_space = spaces.Dict({
            "candidates": spaces.Box(EMPTY_SLOT, n_items - 1, shape=(n,), dtype=np.int64),
            "ranks": spaces.Box(0, n, shape=(n,), dtype=np.int64),
            "slice": spaces.Discrete(len(data.slice_names)),
            "history": spaces.Box(UNMATCHED_SLOT, n_items - 1, shape=(data.history_len,), dtype=np.int64),
        })
        self.action_space = spaces.Box(-1.0, 1.0, shape=(n,), dtype=np.float32)
        self.episode: Episode | None = None
        self._stepped = False

    # ------------------------------------------------------------ attributes
    def __getattr__(self, name: str) -> Any:
        # Called only when normal lookup fails. `engine` is read from __dict__ so a half-built or
        # unpickling env (no engine yet) raises AttributeError instead of recursing.
        engine = self.__dict__.get("engine")
        if name in ENGINE_ATTRIBUTES and engine is not None:
            return getattr(engine, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *ENGINE_ATTRIBUTES})

    @property
    def config(self) -> dict:
        return {**self.engine.config, "reward": self.reward_kind}

    # ----------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        super().reset(seed=check_seed(seed))
        options = check_options(options, ("user_id", "scenario"))
        user, scenario = options.get("user_id"), options.get("scenario")
        if user is None:
            user = self.users[int(self.np_random.integers(len(self.users)))]
        if scenario is None:
            scenarios = self.data.scenarios
            scenario = scenarios[int(self.np_random.integers(len(scenarios)))]
        self.episode = ep = self.engine.episode(str(user), scenario)
        self._stepped = False
        info = {"user_id": ep.user, "scenario": ep.scenario, "slice_id": ep.slice_id,
                "cue_titles": list(ep.cue.titles), "cue_item_ids": list(ep.cue.item_ids),
                "history_item_ids": list(ep.profile.history), "mainstreamness": ep.mainstreamness,
                "scenario_mainstreamness": ep.scenario_mainstreamness, "tokens": dict(ep.usage)}
        return self._observation(ep), info

    def _observation(self, ep: Episode) -> Observation:
        candidates = self.engine.candidate_slots(ep)
        filled = int((candidates != EMPTY_SLOT).sum())
        ranks = np.zeros(self.n_candidates, dtype=np.int64)
        ranks[:filled] = np.arange(1, filled + 1)
        return {"candidates": candidates, "ranks": ranks, "slice": int(self.slice_names.index(ep.slice_id)),
                "history": self.engine.history_slots(ep.user)}

    def order_from_action(self, action) -> list[int]:
        """Non-empty slots by descending score, ties broken by original rank."""
        action = np.asarray(action)
        if action.shape != (self.n_candidates,) or not np.issubdtype(action.dtype, np.number):
            raise ConfigError(f"action must be {self.n_candidates} numbers, got shape {action.shape} "
                              f"of {action.dtype}")
        action = action.astype(np.float64)
        if not np.all(np.isfinite(action)):
            raise ConfigError("action scores must be finite")
        episode = check_reset(self.episode, "order_from_action")
        filled = min(len(episode.cue.item_ids), self.n_candidates)
        return sorted(range(filled), key=lambda s: (-action[s], s))

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict]:
        ep = check_reset(self.episode, "step", ended=self._stepped)
        order = self.order_from_action(action)
        metrics = self.engine.evaluate(ep, order)
        if self.reward_kind == "slice_shift":
            reward = -abs(metrics["slice_shift"])
        else:
            reward = metrics[f"difficulty@{self.k}"]
        top = order[: self.k]
        info = {
            **metrics, **self.engine.prompt_effect(ep),
            "matches": {c.condition: c.counts() for c in ep.lists},
            "tokens": {"episode": dict(ep.usage), "lists": ep.list_cost(),
                       "env_total": dict(self.engine.generated_usage)},
            "reranked_item_ids": [ep.cue.item_ids[s] for s in top],
            "reranked_titles": [ep.cue.titles[s] for s in top],
            "user_id": ep.user, "scenario": ep.scenario, "slice_id": ep.slice_id,
        }
        self._stepped = True
        return self._observation(ep), float(reward), True, False, info

    def render(self) -> str | np.ndarray | None:
        if not supported(self):
            return None
        ep = check_reset(self.episode, "render")
        lines = [f"user {ep.user} | {ep.scenario}: {ep.slice_id}"]
        for n, (title, iid) in enumerate(zip(ep.cue.titles, ep.cue.item_ids), 1):
            lines.append(f"{n:2d}. {title}" + (f"  [{iid}]" if iid is not None else "  [unmatched]"))
        if self.render_mode == "rgb_array":
            return text_frame("\n".join(lines), 1 + self.engine.n_candidates)
        return "\n".join(lines)


__all__ = ["PromptShiftEnv", "REWARDS"]
