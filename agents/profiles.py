"""The User Profile Expert (CtrlBench-Rec §3.2 Stage 1, Appendix C): users -> LLM-written personas.

For each user: demographics (age, gender, occupation where the dataset has them) and the
first L_init liked items (L_init drawn in [4, 6] from the run seed and the user id) go into one
prompt; the LLM answers with a JSON persona (name, bio, up to five interests). The behaviour is
the seed item ids themselves, copied from the data. All users of a call share ONE batched
`chat` (in chunks, for a progress bar).

Unusable JSON gets one retry (the failed reply and a reminder appended to the conversation);
a second failure yields a template persona from the seed items' tags, with `source="template"`
and the flag `invalid_json_fallback`. Finished personas are cached per (user, LLM, seed,
settings) in a SQLite store, with the tokens their generation cost, so a rerun reports the same
setup tokens without calling the model.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ctrlsim.envs.roster import seed_items, template_bio, top_tags, user_attributes

from ctrlsim.backends.cache import SqliteStore
from ctrlsim.data import Dataset, item_text
from ctrlsim.errors import ConfigError, LLMOutputError
from ctrlsim.seeding import derive_rng, derive_seed

from . import prompts
from .persona import MAX_INTERESTS, Persona
from .replies import extract_json_object

MAX_BIO_CHARS = 300  # about two sentences; keeps every later decision prompt short
FALLBACK_FLAG = "invalid_json_fallback"
RETRY_FLAG = "retried_invalid_json"
PROFILE_PROMPT_VERSION = 2  # bump when the prompt changes, so cached personas are not reused

PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "bio": {"type": "string", "maxLength": MAX_BIO_CHARS},
        "interests": {"type": "array", "items": {"type": "string", "maxLength": 60},
                      "maxItems": MAX_INTERESTS},
    },
    "required": ["name", "bio", "interests"],
    "additionalProperties": False,
}


class ProfileStore(SqliteStore):
    """Generated personas: key -> {"persona": {...}, "tokens": int or null} as JSON (null: the LLM's
    server did not report the counts of a call that wrote the persona, so its tokens are unknown)."""

    table = "profiles"

    def encode(self, value: Any) -> str:
        return json.dumps(value)

    def decode(self, stored: str) -> Any:
        """The stored value, checked: a malformed one raises `ValueError`, so the store deletes it (with a
        warning) and the persona is written again, instead of failing every episode that uses it."""
        value = json.loads(stored)
        if not isinstance(value, dict) or not {"persona", "tokens"} <= set(value):
            raise ValueError("a cached persona is {\"persona\": {...}, \"tokens\": n}")
        tokens = value["tokens"]
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
            raise ValueError(f"cached persona tokens must be a count, got {tokens!r}")
        Persona.from_dict(value["persona"])
        return value


@dataclass(frozen=True)
class ProfileSettings:
    """How personas are generated (greedy by default: batched as parallel sequences; temperature > 0
    samples each user's persona with its own seed, derived from the run seed and the user id)."""

    l_init: tuple[int, int] = (4, 6)
    min_rating: float = 4.0
    temperature: float = 0.0
    max_tokens: int = 160
    batch_size: int = 16

    def __post_init__(self):
        low, high = self.l_init
        if not 1 <= low <= high:
            raise ConfigError(f"l_init must satisfy 1 <= low <= high, got {self.l_init}")
        if self.temperature < 0 or self.max_tokens < 16 or self.batch_size < 1:
            raise ConfigError(f"bad profile settings: {self}")


def seed_length(seed: int, user_id: str, l_init: tuple[int, int]) -> int:
    """L_init for a user: drawn in [low, high] from (seed, user), so it does not depend on who else runs."""
    low, high = l_init
    return int(derive_rng(seed, "l_init", str(user_id)).integers(low, high + 1))


def probe_id_for(user_id: str) -> str:
    return f"user-{user_id}"


def parse_profile(text: str) -> dict:
    """{"name", "bio", "interests"} from a reply; raises `LLMOutputError` when unusable."""
    obj = extract_json_object(text)
    if obj is None:
        raise LLMOutputError("no JSON object in the profile reply", text)
    name, bio, interests = obj.get("name"), obj.get("bio"), obj.get("interests", [])
    if not isinstance(bio, str) or not bio.strip():
        raise LLMOutputError('the profile has no non-empty "bio" string', text)
    if not isinstance(name, str) or not name.strip():
        raise LLMOutputError('the profile has no non-empty "name" string', text)
    if isinstance(interests, str):
        interests = [p for p in interests.split(",")]
    if not isinstance(interests, list):
        raise LLMOutputError('"interests" is not a list', text)
    clean = [str(i).strip() for i in interests if isinstance(i, (str, int, float)) and str(i).strip()]
    return {"name": name.strip(), "bio": " ".join(bio.split()), "interests": clean[:MAX_INTERESTS]}


class ProfileGenerator:
    """Writes personas for users of `dataset` with `llm` (see module docstring)."""

    def __init__(self, dataset: Dataset, llm, *, settings: ProfileSettings = ProfileSettings(),
                 store: ProfileStore | str | Path | None = None, rich_in: Sequence[str] = ()):
        self.dataset, self.llm, self.settings = dataset, llm, settings
        self.rich_in = tuple(rich_in)  # seed histories rich in these tags (`envs.roster.seed_items`)
        self.store = ProfileStore(store) if isinstance(store, (str, Path)) else store
        self.nouns = prompts.domain_nouns(dataset.name)

    # ------------------------------------------------------------------ inputs
    def seed_items(self, user_id: str, seed: int) -> list[str]:
        length = seed_length(seed, user_id, self.settings.l_init)
        return seed_items(self.dataset, str(user_id), length, self.settings.min_rating, self.rich_in)

    def conversation(self, user_id: str, items: Sequence[str]) -> list[dict]:
        attrs = user_attributes(self.dataset, str(user_id))
        rows = self.dataset.items.iloc[self.dataset.indices(items)]
        lines = "\n".join(f"- {item_text(r.title, r.year, r.tags)}" for r in rows.itertuples())
        demographics = ", ".join(f"{k} {v}" for k, v in attrs.items() if v is not None) or "unknown"
        return [{"role": "system", "content": prompts.PROFILE_SYSTEM.format(**self.nouns)},
                {"role": "user",
                 "content": prompts.PROFILE_USER.format(demographics=demographics, items=lines,
                                                        **self.nouns)}]

    def cache_key(self, user_id: str, seed: int) -> str:
        key = {"user": str(user_id), "dataset": self.dataset.name, "llm": self.llm.cache_identity(),
               "seed": seed, "settings": asdict(self.settings), "prompt": PROFILE_PROMPT_VERSION}
        if self.settings.temperature > 0:
            key["sampling"] = "per-user seed"  # sampled personas stored before shared one seed per batch
        if self.rich_in:  # a different seed history (keys of ordinary personas stay as they were)
            key["rich_in"] = list(self.rich_in)
        return json.dumps(key, sort_keys=True)

    # ------------------------------------------------------------------ output
    def template_persona(self, user_id: str, items: Sequence[str], flags: Sequence[str] = ()) -> Persona:
        """A persona without LLM text: demographics + the seed items' tags."""
        attrs = user_attributes(self.dataset, str(user_id))
        return Persona(probe_id=probe_id_for(user_id), name=f"User {user_id}",
                       bio=template_bio(self.dataset, attrs, items),
                       interests=tuple(top_tags(self.dataset, items, MAX_INTERESTS)), behaviour=tuple(items),
                       attributes=attrs, source="template", flags=tuple(flags))

    def generate(self, user_ids: Sequence[str], seed: int,
                 progress: Callable[[int], None] | None = None) -> tuple[list[Persona], list[int | None]]:
        """Personas for `user_ids` (in order) and the tokens each one's generation cost (None where a
        call's counts were not reported: unknown, never 0)."""
        user_ids = [str(u) for u in user_ids]
        keys = [self.cache_key(u, seed) for u in user_ids]
        found = self.store.get_many(keys) if self.store is not None else {}
        todo = [n for n, k in enumerate(keys) if k not in found]
        if progress and len(todo) < len(keys):
            progress(len(keys) - len(todo))
        size = self.settings.batch_size
        for start in range(0, len(todo), size):
            chunk = todo[start:start + size]
            made = self._generate([user_ids[n] for n in chunk], seed)
            fresh = {keys[n]: value for n, value in zip(chunk, made)}
            if self.store is not None:  # the stored persona wins (another run may have written it first)
                fresh = self.store.put_many(fresh)
            found.update(fresh)
            if progress:
                progress(len(chunk))
        values = [found[k] for k in keys]
        return [Persona.from_dict(v["persona"]) for v in values], \
            [None if v["tokens"] is None else int(v["tokens"]) for v in values]

    def _chat(self, conversations: list[list[dict]], user_ids: list[str], seed: int, attempt: int):
        use_schema = bool(getattr(self.llm, "supports_json_schema", False))
        # Greedy: one seed for the whole batch, from (run seed, attempt) only (the key cached
        # replies were stored under). Sampling: each user's own seed, from (run seed, attempt,
        # user), so users do not share their draws. Either way a reply depends on its own prompt
        # and seed, not on which other users share the batch.
        call_seed: int | list[int] = derive_seed(seed, "profiles", attempt)
        if self.settings.temperature > 0:
            call_seed = [derive_seed(seed, "profiles", attempt, str(u)) for u in user_ids]
        return self.llm.chat(conversations, max_tokens=self.settings.max_tokens,
                             temperature=self.settings.temperature, seed=call_seed,
                             json_schema=PROFILE_SCHEMA if use_schema else None)

    def _generate(self, user_ids: list[str], seed: int) -> list[dict]:
        items = {u: self.seed_items(u, seed) for u in user_ids}
        convs = {u: self.conversation(u, items[u]) for u in user_ids}
        tokens: dict[str, int | None] = dict.fromkeys(user_ids, 0)
        parsed: dict[str, dict] = {}
        replies: dict[str, str] = {}
        for attempt in (0, 1):
            pending = [u for u in user_ids if u not in parsed]
            if not pending:
                break
            batch = [convs[u] if attempt == 0 else convs[u] + [
                {"role": "assistant", "content": replies[u]},
                {"role": "user", "content": prompts.PROFILE_RETRY}] for u in pending]
            for user, completion in zip(pending, self._chat(batch, pending, seed, attempt)):
                spent = tokens[user]
                counts = (completion.prompt_tokens, completion.completion_tokens)
                # One call without counts makes the persona's tokens unknown (None), never 0.
                tokens[user] = None if spent is None or None in counts else spent + sum(counts)
                replies[user] = completion.text
                try:
                    parsed[user] = {**parse_profile(completion.text), "retried": attempt > 0}
                except LLMOutputError:
                    continue
        out = []
        for user in user_ids:
            if user in parsed:
                fields = parsed[user]
                persona = Persona(probe_id=probe_id_for(user), name=fields["name"], bio=fields["bio"],
                                  interests=tuple(fields["interests"]), behaviour=tuple(items[user]),
                                  attributes=user_attributes(self.dataset, user), source="llm",
                                  flags=(RETRY_FLAG,) if fields["retried"] else ())
            else:
                persona = self.template_persona(user, items[user], flags=(FALLBACK_FLAG,))
            out.append({"persona": persona.to_dict(), "tokens": tokens[user]})
        return out
