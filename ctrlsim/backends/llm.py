"""The LLM interface every runtime implements.

`chat` generates, `rate` scores 0-5 as the expected value over the digit-token
probabilities after an assistant prefix such as "Rating: " (the only rating
method that separates liked from disliked items on small models), and
`rate_by_generation` is SteerEval's generate-and-parse rating, kept for
faithful reproduction. All three go through the token meter and the optional
response cache; runtimes implement `_generate` and `_digit_logprobs`, and `_choice_logprobs`
where they can read next-token probabilities (`choose`, the question decision heads).
`chat` takes one seed per conversation when asked (`seed=[...]`): the base class then calls
`_generate` once per group of conversations with identical parameters, so every runtime sees
one `GenerationParams` (one seed) per call.

With a response cache, a fresh result is stored and then the value the cache holds is used: the
first stored value of a key wins (`ctrlsim.backends.cache`), so when another run sharing the cache
stored its reply for the same call first, this run uses that reply (and its token counts), and a
rerun from the cache replays exactly what the first run used.
"""
from __future__ import annotations

import json
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence, TypeVar

import numpy as np

from ctrlsim.backends.cache import ResponseCache, cache_key
from ctrlsim.backends.meter import TokenMeter
from ctrlsim.backends.token_scores import (  # noqa: F401 - re-exported: the interface's arithmetic
    RATING_DIGITS,
    choice_probabilities_from_logprobs,
    expected_rating,
    parse_first_number,
)
from ctrlsim.errors import CacheCorruptionWarning, ConfigError, ModelError

Message = dict  # {"role": "system"|"user"|"assistant", "content": str}
Conversation = list[Message]

RATING_PREFIX = "Rating: "


@dataclass
class Completion:
    """One generated reply and what it cost. A count the runtime did not report (an OpenAI-compatible
    server without `usage`) is None, unknown, never 0; the cache stores and replays it as null."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str = "stop"
    cached: bool = False

    FIELDS = ("text", "prompt_tokens", "completion_tokens", "finish_reason")  # what the cache stores

    def to_dict(self) -> dict:
        return {"text": self.text, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "finish_reason": self.finish_reason}


@dataclass
class DigitScores:
    """Log-probabilities of the digit tokens at the rated position, and the prompt length (None
    when the runtime did not report it)."""

    logprobs: np.ndarray  # (len(RATING_DIGITS),), -inf where a digit got no mass
    prompt_tokens: int | None


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    json_schema: str | None = None  # canonical JSON text of the schema the reply must match

    def reproducible(self) -> bool:
        return self.temperature == 0.0 or self.seed is not None

    def cache_params(self) -> dict:
        """The parameters that identify a reply; an absent schema is left out so older cache keys hold."""
        params = dict(self.__dict__)
        if params["json_schema"] is None:
            del params["json_schema"]
        return params

    @property
    def schema(self) -> dict | None:
        return None if self.json_schema is None else json.loads(self.json_schema)


def canonical_schema(json_schema: dict | None) -> str | None:
    """The schema as sorted-key JSON text (hashable, stable across dict orderings), or None."""
    if json_schema is None:
        return None
    if not isinstance(json_schema, dict):
        raise ConfigError(f"json_schema must be a dict (a JSON Schema), got {type(json_schema).__name__}")
    try:
        return json.dumps(json_schema, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"json_schema is not JSON-serialisable: {exc}") from exc


def per_conversation_seeds(seed: int | Sequence[int] | None, n: int) -> list[int | None]:
    """`chat`'s `seed` as one seed per conversation: None or one int for all `n`, or a sequence of
    exactly `n` ints (`ConfigError` naming both lengths otherwise)."""
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed)] * n
    if isinstance(seed, (str, bytes, bool)) or not isinstance(seed, (Sequence, np.ndarray)):
        raise ConfigError(f"seed must be None, an int or a sequence of ints (one per conversation), "
                          f"got {type(seed).__name__}")
    seeds = list(seed)
    if len(seeds) != n:
        raise ConfigError(f"got {len(seeds)} seeds for {n} conversations "
                          "(give one seed per conversation, or one int)")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise ConfigError(f"every per-conversation seed must be an int, got {s!r}")
    return [int(s) for s in seeds]


def validate_conversations(conversations: Sequence[Conversation]) -> list[Conversation]:
    """A batch of conversations, each a non-empty list of {"role", "content"} messages."""
    if isinstance(conversations, dict) or (conversations and isinstance(conversations[0], dict)):
        raise ConfigError("expected a batch (list) of conversations; wrap a single conversation in a list")
    out = []
    for n, conv in enumerate(conversations):
        if not conv:
            raise ConfigError(f"conversation {n} is empty")
        for msg in conv:
            if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant") \
                    or not isinstance(msg.get("content"), str):
                raise ConfigError(f"conversation {n}: malformed message {msg!r}")
        out.append([{"role": m["role"], "content": m["content"]} for m in conv])
    return out


T = TypeVar("T")


@dataclass
class ChoiceReading:
    """What `LLM.choose` read: P(answer) rows renormalised over the answers (NaN where no answer got
    any mass), and per conversation its prompt tokens (None: unknown) and whether it was cached."""

    probabilities: np.ndarray
    prompt_tokens: list[int | None]
    cached: list[bool]

RATE_FIELDS = ("logprobs", "prompt_tokens")  # what the cache stores for one `rate` position
NO_MASS = -1e30  # a digit's stored log-prob when it got no mass (JSON has no -inf); read back as -inf


def _has_fields(fields: tuple[str, ...]):
    """A check for cached values: a dict with exactly `fields`."""
    def check(value) -> bool:
        return isinstance(value, dict) and set(value) == set(fields)
    return check


def _scores_from_cache(value: dict) -> DigitScores:
    """A cached `rate` value as `DigitScores`; a stored no-mass digit is -inf again, as when fresh."""
    logprobs = np.array(value["logprobs"], dtype=np.float64)
    return DigitScores(np.where(logprobs <= NO_MASS, -np.inf, logprobs), value["prompt_tokens"])


def _all_filled(slots: list[T | None]) -> list[T]:
    """The results once cache hits and fresh replies have filled every slot."""
    filled = [value for value in slots if value is not None]
    if len(filled) != len(slots):
        raise ModelError(f"the runtime returned {len(slots) - len(filled)} result(s) too few")
    return filled


class LLM(ABC):
    """Base class: batching, caching and metering around a runtime's two primitives."""

    runtime: str = "abstract"
    #: Whether `chat(..., json_schema=...)` constrains decoding on this runtime.
    supports_json_schema: bool = False

    def __init__(self, model_id: str, *, meter: TokenMeter | None = None, cache: ResponseCache | None = None):
        self.model_id = model_id
        self.meter = meter if meter is not None else TokenMeter()
        self.cache = cache

    @property
    def identity(self) -> dict:
        """What actually ran; recorded with every result."""
        return {"runtime": self.runtime, "model": self.model_id}

    # -------------------------------------------------------------- runtimes
    @abstractmethod
    def _generate(self, conversations: list[Conversation], params: GenerationParams) -> list[Completion]:
        """Generate one completion per conversation."""

    @abstractmethod
    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        """Digit log-probs at the first position after the assistant turn starts with `prefix`."""

    def _choice_logprobs(self, conversations: list[Conversation], prefix: str,
                         choices: tuple[str, ...]) -> list[DigitScores]:
        """Log-probs of each answer word at the first position after `prefix` (runtimes that can read
        next-token probabilities override this)."""
        raise ConfigError(f"the {self.runtime} runtime ({self.model_id}) cannot read next-token answer "
                          "probabilities; use a decision head that generates (--decision json)")

    # ------------------------------------------------------------ public API
    def chat(self, conversations: Sequence[Conversation], *, max_tokens: int = 256, temperature: float = 0.0,
             top_p: float = 1.0, seed: int | Sequence[int] | None = None, stop: Sequence[str] = (),
             keys: Sequence[str | None] | None = None, json_schema: dict | None = None) -> list[Completion]:
        """Generate a reply for each conversation. `keys` charge each call's tokens to a meter key.

        `seed` is None (unseeded: sampled replies are not cached), one int for the whole batch, or
        a sequence with one int per conversation. With one int every conversation samples from the
        same seed, so at temperature > 0 identical conversations get identical replies (their draws
        are shared). With a sequence each conversation has its own `GenerationParams` and its own
        cache key, computed with its own seed (a sequence of equal seeds gives exactly the keys of
        that one int); conversations whose params are identical still go to the runtime together,
        one call per group (`_generate_each`), and the replies come back in the batch's order. A
        conversation's seeded reply then depends on its prompt and its own seed, not on what else
        is in the batch. At temperature 0 pass one int: the seed does not change a greedy reply,
        and a sequence would split the batch into single-conversation calls.

        `json_schema` (a JSON Schema dict) constrains decoding so every reply is JSON matching it;
        runtimes without constrained decoding (`supports_json_schema` False) raise `ConfigError`.
        A reply cut off by `max_tokens` can still be incomplete JSON (its finish_reason is "length").
        """
        conversations = validate_conversations(conversations)
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
        if temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {temperature}")
        schema_text = canonical_schema(json_schema)
        if schema_text is not None and not self.supports_json_schema:
            raise ConfigError(f"the {self.runtime} runtime ({self.model_id}) cannot constrain replies to a "
                              "JSON schema; check `supports_json_schema` before passing json_schema")
        params = [GenerationParams(max_tokens, float(temperature), float(top_p), s, tuple(stop), schema_text)
                  for s in per_conversation_seeds(seed, len(conversations))]
        keys = self._keys(keys, len(conversations))
        results: list[Completion | None] = [None] * len(conversations)
        # Position -> cache key, for the reproducible calls only (unseeded sampling is never cached).
        cache_keys = {i: cache_key(self.cache_identity(), "chat", conv, p.cache_params())
                      for i, (conv, p) in enumerate(zip(conversations, params)) if p.reproducible()}
        cacheable = list(cache_keys)
        for n, value in self._cached([cache_keys[i] for i in cacheable], Completion.FIELDS).items():
            results[cacheable[n]] = Completion(**value, cached=True)
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            fresh = self._generate_each([conversations[i] for i in todo], [params[i] for i in todo])
            if len(fresh) != len(todo):
                raise ModelError(f"the runtime returned {len(fresh)} replies for {len(todo)} conversations")
            for i, completion in zip(todo, fresh):
                results[i] = completion
            store = {cache_keys[i]: completion.to_dict() for i, completion in zip(todo, fresh)
                     if i in cache_keys}
            if self.cache is not None and store:
                # What the cache holds is what this call returns (another run's reply may be first).
                held = self.cache.put_many(store, valid=_has_fields(Completion.FIELDS))
                for i in todo:
                    if i in cache_keys:
                        results[i] = Completion(**held[cache_keys[i]], cached=False)
        completions = _all_filled(results)
        for completion, key in zip(completions, keys):
            self.meter.add(completion.prompt_tokens, completion.completion_tokens, key=key,
                           cached=completion.cached)
        return completions

    def _generate_each(self, conversations: list[Conversation],
                       params: list[GenerationParams]) -> list[Completion]:
        """One completion per conversation, each under its own params (`params[n]` for
        `conversations[n]`): one `_generate` call per group of identical params, groups in order of
        first appearance, replies in the conversations' order. A runtime that sends every
        conversation as a request of its own may override this to send all groups together."""
        groups: dict[GenerationParams, list[int]] = {}
        for n, p in enumerate(params):
            groups.setdefault(p, []).append(n)
        out: list[Completion | None] = [None] * len(conversations)
        for p, members in groups.items():
            fresh = self._generate([conversations[n] for n in members], p)
            if len(fresh) != len(members):
                raise ModelError(f"the runtime returned {len(fresh)} replies for {len(members)} "
                                 "conversations")
            for n, completion in zip(members, fresh):
                out[n] = completion
        return _all_filled(out)

    def rate(self, conversations: Sequence[Conversation], *, prefix: str = RATING_PREFIX,
             keys: Sequence[str | None] | None = None) -> np.ndarray:
        """Expected 0-5 rating per conversation from the digit-token distribution after `prefix`.

        The conversation should end with a user message asking for a 0-5
        rating. One scored position counts as one completion token.
        """
        filled, _ = self._scored("rate", conversations, {"prefix": prefix},
                                 lambda convs: self._digit_logprobs(convs, prefix), keys)
        return np.array([expected_rating(s.logprobs) for s in filled], dtype=np.float64)

    def choose(self, conversations: Sequence[Conversation], *, choices: Sequence[str] = ("yes", "no"),
               prefix: str = "", keys: Sequence[str | None] | None = None,
               purpose: dict | None = None) -> "ChoiceReading":
        """P(answer) per conversation and answer word, renormalised over `choices`, read from the
        next-token distribution after the assistant turn starts with `prefix` (no generation; rows
        of shape (len(conversations), len(choices))). One scored position counts as one completion
        token. Cached like `rate`, under the answers, the prefix and `purpose` (what the reading
        decides, e.g. a probe's decision head and threshold: a different purpose is a different key)."""
        choices = tuple(str(c) for c in choices)
        if len(choices) < 2 or len(set(c.strip().lower() for c in choices)) != len(choices) \
                or not all(c.strip() for c in choices):
            raise ConfigError(f"choices must be at least two distinct non-empty words, got {list(choices)}")
        params = {"prefix": prefix, "choices": list(choices), **({"purpose": purpose} if purpose else {})}
        scores, cached = self._scored("choice", conversations, params,
                                      lambda convs: self._choice_logprobs(convs, prefix, choices), keys)
        probabilities = choice_probabilities_from_logprobs(np.array([s.logprobs for s in scores])) \
            if scores else np.empty((0, len(choices)))
        return ChoiceReading(probabilities, [s.prompt_tokens for s in scores], cached)

    def rate_by_generation(self, conversations: Sequence[Conversation], *, rng: np.random.Generator,
                           max_tokens: int = 16, lowest: float = 0.0, jitter: float = 1e-6,
                           keys: Sequence[str | None] | None = None) -> tuple[np.ndarray, list[str]]:
        """SteerEval's rating: greedy reply, first number parsed; no number -> `lowest`.

        A tiny seeded jitter breaks ties (the release used an unseeded one).
        Returns the scores and the raw replies (so unparsable replies can be logged).
        """
        replies = self.chat(conversations, max_tokens=max_tokens, temperature=0.0, keys=keys)
        parsed = [parse_first_number(r.text) for r in replies]
        scores = np.array([lowest if p is None else p for p in parsed], dtype=np.float64)
        return scores + rng.uniform(0, jitter, size=len(scores)), [r.text for r in replies]

    def _scored(self, kind: str, conversations: Sequence[Conversation], params: dict, compute,
                keys: Sequence[str | None] | None) -> tuple[list[DigitScores], list[bool]]:
        """Scores of one next-token position per conversation (and whether each came from the cache):
        cached ones first, `compute` for the rest, what the cache holds used; metered as one
        completion token each."""
        conversations = validate_conversations(conversations)
        keys = self._keys(keys, len(conversations))
        scores: list[DigitScores | None] = [None] * len(conversations)
        cached_flags = [False] * len(conversations)
        cache_keys = self._cache_keys(kind, conversations, params)
        for i, value in self._cached(cache_keys, RATE_FIELDS).items():
            scores[i] = _scores_from_cache(value)
            cached_flags[i] = True
        todo = [i for i, s in enumerate(scores) if s is None]
        if todo:
            fresh = compute([conversations[i] for i in todo])
            if len(fresh) != len(todo):
                raise ModelError(f"the runtime returned {len(fresh)} scores for {len(todo)} conversations")
            for i, s in zip(todo, fresh):
                scores[i] = s
            if self.cache is not None:
                # What the cache holds is what this call uses (another run's scores may be first).
                store = {cache_keys[i]: {"logprobs": [float(x) if np.isfinite(x) else NO_MASS
                                                      for x in s.logprobs],
                                         "prompt_tokens": s.prompt_tokens} for i, s in zip(todo, fresh)}
                held = self.cache.put_many(store, valid=_has_fields(RATE_FIELDS))
                for i in todo:
                    scores[i] = _scores_from_cache(held[cache_keys[i]])
        filled = _all_filled(scores)
        for s, key, cached in zip(filled, keys, cached_flags):
            self.meter.add(s.prompt_tokens, 1, key=key, cached=cached)
        return filled, cached_flags

    # --------------------------------------------------------------- helpers
    @staticmethod
    def _keys(keys, n: int) -> list[str | None]:
        if keys is None:
            return [None] * n
        keys = list(keys)
        if len(keys) != n:
            raise ConfigError(f"got {len(keys)} meter keys for {n} conversations")
        return keys

    def _cache_keys(self, kind: str, conversations: list[Conversation], params: dict) -> list[str]:
        return [cache_key(self.cache_identity(), kind, conv, params) for conv in conversations]

    def _cached(self, cache_keys: list[str], fields: tuple[str, ...]) -> dict[int, dict]:
        """Cached values by position; a value without exactly `fields` is a miss (and is recomputed)."""
        if self.cache is None:
            return {}
        found = self.cache.get_many(cache_keys)
        has_fields = _has_fields(fields)
        good = {i: found[k] for i, k in enumerate(cache_keys) if k in found and has_fields(found[k])}
        malformed = sum(1 for k in cache_keys if k in found) - len(good)
        if malformed:
            warnings.warn(CacheCorruptionWarning(
                f"cache file {getattr(self.cache, 'path', self.cache)}: {malformed} stored value(s) lack the "
                f"fields {list(fields)}; they will be recomputed and overwritten"), stacklevel=3)
        return good

    def cache_identity(self) -> str:
        """Identity string for cache keys: runtime plus model (subclasses add file hashes)."""
        return f"{self.runtime}:{self.model_id}"

    def close(self) -> None:  # noqa: B027 - releasing is optional; most runtimes need nothing
        """Release the model (optional)."""
