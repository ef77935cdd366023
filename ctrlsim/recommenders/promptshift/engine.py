"""PromptShift's protocol engine: generated lists, matched to the catalogue, cached, and scored.

The engine is the one place where a user's five lists come from (L^0, the
identity-cued L^c of a scenario, and the paraphrase controls P1-P3): it asks
the `LLMListGenerator` for the ones it has not seen yet (one batched call),
matches their titles to catalogue items with a `TitleMatcher`, keeps them per
(user, prompt condition), and scores any reordering of a cued pool with the
shared metric hook `ctrlsim.metrics.promptshift.evaluate_ranking`. The
Gymnasium env (`ctrlsim.envs.promptshift_env`), validation selection
(`selection`) and the table runner (`ctrlsim.experiments.promptshift.runner`)
all drive it.

What it knows of a user it asks `PromptShiftData.user` once, as a
`UserProfile` (history, prompt titles, slices, mainstreamness, held-out
positives), and reads only that afterwards; an `Episode` carries its user's
profile, so scoring it needs no further look-up.

Any other list generator (an object with `generate(requests)` and a `config`
dict, e.g. the LLM-free `ctrlsim.recommenders.promptshift.dial.DialListGenerator`)
can stand in for the LLM: `PromptShiftEngine(data, None, generator=...)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from ctrlsim.backends import LLM, TokenMeter, check_llm_argument, resolve_llm
from ctrlsim.data.matching import MATCH_KINDS, TitleMatcher, normalize_title
from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import EMPTY_SLOT, UNMATCHED_SLOT, SliceTable, evaluate_ranking
from ctrlsim.metrics.ranking import drift
from ctrlsim.recommenders.promptshift.data import PARTS, PromptShiftData, UserProfile
from ctrlsim.recommenders.promptshift.defaults import (
    DEFAULT_LLM,
    MATCH_THRESHOLD,
    N_CANDIDATES,
    RBO_P,
    RHO,
    TEMPERATURE,
    UNMATCHED_POLICIES,
    K,
)
from ctrlsim.recommenders.promptshift.generation import (
    DOMAINS,
    HISTORY_ONLY,
    PARAPHRASE_CONDITIONS,
    GeneratedList,
    LLMListGenerator,
    PromptCondition,
)


class ListGenerator(Protocol):
    """What the engine asks for lists: `LLMListGenerator`, or a stand-in such as the dial generator."""

    @property
    def config(self) -> dict: ...

    def generate(self, requests: Sequence[tuple[Sequence[str], PromptCondition]]) -> list[GeneratedList]: ...


@dataclass
class CandidateList:
    """A generated list after catalogue matching.

    `item_ids[k]` is the matched catalogue id of `titles[k]` or None; a later
    title that matches an item already in the list is dropped, so ids are
    distinct. `in_history` counts entries that repeat the user's prompt
    history (dropped when `exclude_history`). `keys` identify entries for RBO:
    the item id, or "?" + the normalised title for an unmatched entry.
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
        titles, ids, kinds, seen, hist = [], [], [], set(), set(history)
        dropped = in_history = 0
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
        out = {k: 0 for k in MATCH_KINDS}
        for k in self.kinds:
            out[k] += 1
        out.update(matched=len(self.kinds) - out["none"], unmatched=out["none"], total=len(self.kinds),
                   dropped_duplicates=self.dropped_duplicates, in_history=self.in_history,
                   parse_error=int(self.generated.error is not None))
        return out

    def slots(self, item_row: dict[str, int], n: int) -> np.ndarray:
        """The first `n` entries as slice-table rows: UNMATCHED_SLOT for unmatched, EMPTY_SLOT padding."""
        out = np.full(n, EMPTY_SLOT, dtype=np.int64)
        rows = [item_row[i] if i is not None else UNMATCHED_SLOT for i in self.item_ids[:n]]
        out[: len(rows)] = rows
        return out


@dataclass
class Episode:
    """One (user, identity-cue scenario) pair: the user's profile, lists and mainstreamness."""

    profile: UserProfile
    scenario: str
    slice_id: str
    cue: CandidateList
    reference: CandidateList
    paraphrases: list[CandidateList]
    mainstreamness: float
    scenario_mainstreamness: float
    usage: dict = field(default_factory=dict)

    @property
    def user(self) -> str:
        return self.profile.user

    @property
    def lists(self) -> tuple[CandidateList, ...]:
        return (self.cue, self.reference, *self.paraphrases)

    def list_cost(self) -> dict:
        """What generating this episode's five lists cost, whenever they were generated
        (`unknown_lists`, only when non-zero: lists whose token counts were not reported)."""
        cost = {"prompt_tokens": sum(c.generated.prompt_tokens or 0 for c in self.lists),
                "completion_tokens": sum(c.generated.completion_tokens or 0 for c in self.lists),
                "lists": len(self.lists)}
        unknown = sum(_unknown(c.generated) for c in self.lists)
        return {**cost, "unknown_lists": unknown} if unknown else cost


def _usage() -> dict:
    return {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0, "cached_calls": 0}


def _unknown(gen) -> bool:
    """Whether a generated list's token counts are unknown (its server sent none)."""
    return gen.prompt_tokens is None or gen.completion_tokens is None


class PromptShiftEngine:
    """Generates, matches, caches and scores PromptShift's lists for one LLM over a set of users U.

    `users` is U, the users the protocol runs (default: every eligible user);
    phi_bar_s, the scenario mean B3 compares a user's mainstreamness with, is
    averaged over them (section 4.4). The LLM (a spec or an `LLM`) loads on
    first use; construction never generates anything. `domain` picks the
    prompts ("movies" or "music"; default: the dataset's).

    `generator` (an object with `generate(requests)` and `config`) replaces the
    LLM: it writes every list, no LLM is ever loaded (`llm` is ignored and may
    be None; `llm_loaded` stays False) and `config` records the generator's
    config under "generator" in place of the LLM identity.
    """

    def __init__(self, data: PromptShiftData, llm: str | LLM | None = DEFAULT_LLM, *,
                 users: Sequence[str] | None = None, n_candidates: int = N_CANDIDATES, k: int = K,
                 p: float = RBO_P, rho: float = RHO, match_threshold: float = MATCH_THRESHOLD,
                 max_tokens: int | None = None, temperature: float = TEMPERATURE,
                 llm_seed: int | None = None, llm_cache: str | None = None, domain: str | None = None,
                 exclude_history: bool = False, unmatched: str = UNMATCHED_POLICIES[0],
                 generator: ListGenerator | None = None):
        if not 1 <= k <= n_candidates:
            raise ConfigError(f"need 1 <= k <= n_candidates, got k={k}, n_candidates={n_candidates}")
        if not 0 < p < 1:
            raise ConfigError(f"p must be in (0, 1), got {p}")
        if unmatched not in UNMATCHED_POLICIES:
            raise ConfigError(f"unmatched must be one of {UNMATCHED_POLICIES}, got {unmatched!r}")
        domain = data.domain if domain is None else domain
        if domain not in DOMAINS:
            raise ConfigError(f"unknown domain {domain!r}; choose from {DOMAINS}")
        self.data = data
        self.users = list(data.eligible) if users is None else data.check_eligible(users)
        if not self.users:
            raise ConfigError("no eligible users")
        self.n_candidates, self.k, self.p, self.rho = int(n_candidates), int(k), float(p), float(rho)
        self.domain, self.unmatched, self.exclude_history = domain, unmatched, bool(exclude_history)
        self.matcher = TitleMatcher(data.dataset.items, threshold=match_threshold)
        # Each user's data is asked of `data` once; phi_bar_s averages over the profiles of U.
        self._profiles: dict[str, UserProfile] = {u: data.user(u) for u in self.users}
        self.scenario_means = data.scenario_means(self._profiles[u] for u in self.users)
        self.slice_means = data.slice_means(self.scenario_means)
        self._injected = generator is not None
        if generator is not None:
            if not callable(getattr(generator, "generate", None)) or not hasattr(generator, "config"):
                raise ConfigError(f"generator must have a generate(requests) method and a config, "
                                  f"got {type(generator).__name__}")
            llm = ""
        elif llm is None:
            raise ConfigError("llm may be None only when a list generator is given (generator=...)")
        check_llm_argument(llm)
        self._llm: LLM | None = None if isinstance(llm, str) else llm
        self._llm_spec: str = llm if isinstance(llm, str) else ""
        self._llm_cache = llm_cache
        self.max_tokens, self.temperature, self.llm_seed = max_tokens, float(temperature), llm_seed
        self._generator: ListGenerator | None = generator
        self._generated: dict[tuple[str, str], GeneratedList] = {}
        self._matched: dict[tuple[str, str], CandidateList] = {}
        self.generated_usage = _usage()

    # ------------------------------------------------------------ properties
    @property
    def slice_table(self) -> SliceTable:
        return self.data.table

    @property
    def slice_names(self) -> tuple[str, ...]:
        return self.data.slice_names

    @property
    def llm(self) -> LLM:
        """The LLM, loaded on first use (an engine given a list generator has none)."""
        if self._injected:
            raise ConfigError("this engine's lists come from its list generator; it has no LLM")
        if self._llm is None:
            self._llm = resolve_llm(self._llm_spec, cache=self._llm_cache)
        return self._llm

    @property
    def llm_loaded(self) -> bool:
        return self._llm is not None

    @property
    def token_meter(self) -> TokenMeter | None:
        return self._llm.meter if self._llm is not None else None

    @property
    def generator(self) -> ListGenerator:
        """The list generator given at construction, else an `LLMListGenerator` over the LLM."""
        if self._generator is None:
            self._generator = LLMListGenerator(self.llm, n=self.n_candidates, domain=self.domain,
                                               max_tokens=self.max_tokens, temperature=self.temperature,
                                               seed=self.llm_seed, meter_key="promptshift")
        return self._generator

    @property
    def config(self) -> dict:
        """The engine's settings; with a list generator, its config stands where the LLM's identity does."""
        source: dict
        if self._injected:
            source = {"generator": dict(self.generator.config)}
        else:
            source = {"llm": self._llm.identity if self._llm is not None else {"spec": self._llm_spec}}
        out = {"data": self.data.config, **source, "n_candidates": self.n_candidates, "k": self.k,
               "p": self.p, "rho": self.rho, "matcher": self.matcher.config, "domain": self.domain,
               "exclude_history": self.exclude_history, "unmatched": self.unmatched}
        if not self._injected:  # the LLM's decoding settings; a list generator has its own config
            out["generation"] = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                                 "seed": self.llm_seed}
        return out

    def profile(self, user: str) -> UserProfile:
        """The user's `UserProfile`, asked of the data once (any user with fit positives)."""
        user = str(user)
        if user not in self._profiles:
            self._profiles[user] = self.data.user(user)
        return self._profiles[user]

    # ----------------------------------------------------------------- lists
    def set_match_threshold(self, threshold: float) -> None:
        """Match every list again with another fuzzy threshold (no LLM call)."""
        if threshold != self.matcher.threshold:
            self.matcher = TitleMatcher(self.data.dataset.items, threshold=threshold)
            self._matched.clear()

    def preload(self, user: str, generated: GeneratedList) -> CandidateList:
        """Put an already generated list (e.g. from a result file) into the cache."""
        user = self.profile(user).user
        self._generated[(user, generated.condition)] = generated
        self._matched.pop((user, generated.condition), None)
        return self._candidates(user, generated.condition)

    def cached_list(self, user: str, condition: PromptCondition) -> CandidateList | None:
        if (str(user), condition.name) not in self._generated:
            return None
        return self._candidates(str(user), condition.name)

    def _candidates(self, user: str, condition: str) -> CandidateList:
        key = (user, condition)
        if key not in self._matched:
            self._matched[key] = CandidateList.from_generated(
                self._generated[key], self.matcher, history=self.profile(user).history,
                exclude_history=self.exclude_history)
        return self._matched[key]

    def lists_for(self, user: str, conditions: Sequence[PromptCondition]) -> tuple[list[CandidateList], dict]:
        """The user's lists for `conditions`, generating the missing ones in one batched call."""
        profile = self.profile(user)
        user = profile.user
        missing = [c for c in dict.fromkeys(conditions) if (user, c.name) not in self._generated]
        usage = _usage()
        if missing:
            history = list(profile.history_titles)
            for gen in self.generator.generate([(history, c) for c in missing]):
                self._generated[(user, gen.condition)] = gen
                usage["prompt_tokens"] += gen.prompt_tokens or 0
                usage["completion_tokens"] += gen.completion_tokens or 0
                usage["calls"] += 1
                usage["cached_calls"] += int(gen.cached)
                if _unknown(gen):  # only when non-zero, so ordinary records keep their bytes
                    usage["unknown_calls"] = usage.get("unknown_calls", 0) + 1
            for key in usage:
                self.generated_usage[key] = self.generated_usage.get(key, 0) + usage[key]
        return [self._candidates(user, c.name) for c in conditions], usage

    def episode(self, user: str, scenario: str) -> Episode:
        """The user's lists for one identity-cue scenario (generated where missing)."""
        user = str(user)
        if scenario not in self.data.scenarios:
            raise ConfigError(f"scenario {scenario!r} is not one of {self.data.scenarios}")
        if user not in set(self.users):
            raise ConfigError(f"user {user!r} is not among this engine's PromptShift users")
        profile = self.profile(user)
        slice_id = profile.slice_of(scenario)
        conditions = [PromptCondition("history", slice_id), HISTORY_ONLY, *PARAPHRASE_CONDITIONS]
        lists, usage = self.lists_for(user, conditions)
        return Episode(profile, scenario, slice_id, lists[0], lists[1], list(lists[2:]),
                       profile.mainstreamness[scenario], self.scenario_means[scenario], usage)

    def user_conditions(self, user: str) -> list[PromptCondition]:
        """Every prompt condition a user runs: L^0, P1-P3 and one cue per scenario."""
        profile = self.profile(user)
        cues = [PromptCondition("history", profile.slice_of(s)) for s in self.data.scenarios]
        return [HISTORY_ONLY, *PARAPHRASE_CONDITIONS, *cues]

    # --------------------------------------------------------------- scoring
    def candidate_slots(self, episode: Episode) -> np.ndarray:
        """The cued pool as N slice-table rows in LLM order (the env's `candidates` observation)."""
        return episode.cue.slots(self.data.dataset.item_index, self.n_candidates)

    def history_slots(self, user: str) -> np.ndarray:
        """H_u as slice-table rows, oldest first, padded with UNMATCHED_SLOT to `history_len`."""
        out = np.full(self.data.history_len, UNMATCHED_SLOT, dtype=np.int64)
        rows = self.data.dataset.indices(self.profile(user).history)
        out[: len(rows)] = rows
        return out

    def evaluate(self, episode: Episode, order: Sequence[int], *, part: str = "test") -> dict[str, float]:
        """Metrics of a reordering of the cued pool (`order`: slots, best first) against L^0.

        `part="valid"` scores against the validation positives (for choosing parameters).
        """
        if part not in PARTS:
            raise ConfigError(f"part must be one of {PARTS}, got {part!r}")
        cue, ref = episode.cue, episode.reference
        slots = [int(s) for s in order]
        bad = [s for s in slots if not 0 <= s < len(cue.item_ids)]
        if bad:
            raise ConfigError(f"order names slots {bad[:5]} outside the pool of {len(cue.item_ids)}")
        keys = cue.keys
        return evaluate_ranking(self.slice_table, episode.slice_id, [cue.item_ids[s] for s in slots],
                                ref.item_ids, episode.profile.positives(part), pool=cue.item_ids,
                                ranking_keys=[keys[s] for s in slots], reference_keys=ref.keys, k=self.k,
                                p=self.p, rho=self.rho, unmatched=self.unmatched)

    def list_drift(self, episode: Episode, candidates: CandidateList) -> float:
        """Drift of a list's top K against the episode's history-only list L^0."""
        return drift(episode.reference.keys[: self.k], candidates.keys[: self.k], self.p)

    def prompt_effect(self, episode: Episode) -> dict:
        """Cue Drift and SliceShift of the unmodified cue list (B0), and the paraphrase controls' Drift."""
        base = self.evaluate(episode, range(len(episode.cue.item_ids)))
        para = [self.list_drift(episode, pl) for pl in episode.paraphrases]
        para_drift = float(np.mean(para)) if para else float("nan")
        return {"cue_drift": base["drift"], "cue_slice_shift": base["slice_shift"],
                "paraphrase_drift": para_drift, "paraphrase_drifts": para,
                "delta_d": base["drift"] - para_drift}


__all__ = ["CandidateList", "Episode", "ListGenerator", "PromptShiftEngine"]
