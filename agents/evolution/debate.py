"""Debate phase: a two-round group discussion inside every cluster of two or more probes.

Round 1: each member states its preferences and representative behaviour. Round 2: each
member reads everyone's round-1 statements and negotiates toward one group profile, quoting
the others (Appendix D.3 "Interactive debate", Appendix E). One round across ALL clusters is
ONE batched `llm.chat` call, so the debate costs two calls per generation however many
clusters there are. When sampling, each speaker's turn has its own seed, derived from the
phase's seed, the round and the speaker's probe id (unique in a generation), so it is the same
whether its cluster debates alone or with the others. The transcript (who said what, in which
round) is kept for the merge agent and written to the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ctrlsim.data import Dataset
from ctrlsim.seeding import derive_seed

from ..persona import Persona
from . import prompts as P


@dataclass(frozen=True)
class Turn:
    round: int
    probe_id: str
    name: str
    text: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GenerationSettings:
    """How the loop's own LLM calls (debate, merge) are made; a seed makes sampled replies cacheable.

    When sampling (temperature > 0) with a seed, each conversation gets its own seed derived from
    this one and what names the conversation (`conversation_seeds`), so the conversations of a
    batch do not share their draws; greedy calls use this one seed for the whole batch."""

    max_tokens: int = 160
    temperature: float = 0.0
    seed: int | None = None

    def conversation_seeds(self, *names: Sequence[str | int]) -> int | list[int] | None:
        """The `seed` argument of a batched `chat`: one seed per conversation, derived from `seed`
        and that conversation's keys (`names[n]`, e.g. ("round", 1, probe id)), when sampling with
        a seed; otherwise `seed` itself for the whole batch."""
        if self.temperature > 0 and self.seed is not None:
            return [derive_seed(self.seed, *keys) for keys in names]
        return self.seed


def behaviour_lines(persona: Persona, dataset: Dataset, *, with_ids: bool, limit: int | None = None) -> str:
    """The behaviour stream, one item a line: "id: Title (Year), (Genres)" or the text alone."""
    items = list(persona.behaviour)[-limit:] if limit else list(persona.behaviour)
    if not items:
        return "  (none yet)"
    texts = dataset.items["text"].to_numpy()[dataset.indices(items)]
    return "\n".join(f"  {i}: {t}" if with_ids else f"  {t}" for i, t in zip(items, texts))


def _interests(persona: Persona) -> str:
    return ", ".join(persona.interests) or "not stated"


def run_debate(
    llm,
    groups: Sequence[Sequence[Persona]],
    dataset: Dataset,
    nouns: dict[str, str],
    settings: GenerationSettings | None = None,
    *,
    behaviour_limit: int = 8,
    key_prefix: str = "debate",
) -> list[list[Turn]]:
    """Two debate rounds for every group with two or more members; one transcript per group
    (empty for a single-member group). Each round is one batched chat call."""
    settings = settings or GenerationSettings()
    transcripts: list[list[Turn]] = [[] for _ in groups]
    speakers = [(n, p) for n, g in enumerate(groups) if len(g) >= 2 for p in g]
    if not speakers:
        return transcripts
    system = {"role": "system", "content": P.DEBATE_SYSTEM.format(**nouns)}
    keys = [f"{key_prefix}/{p.probe_id}" for _, p in speakers]
    round1 = []
    for n, persona in speakers:
        others = ", ".join(o.name for o in groups[n] if o.probe_id != persona.probe_id)
        round1.append(
            [
                system,
                {
                    "role": "user",
                    "content": P.DEBATE_ROUND1.format(
                        name=persona.name,
                        bio=persona.bio,
                        interests=_interests(persona),
                        others=others,
                        behaviour=behaviour_lines(persona, dataset, with_ids=False, limit=behaviour_limit),
                        **nouns,
                    ),
                },
            ]
        )
    replies1 = llm.chat(
        round1,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        seed=settings.conversation_seeds(*[("round", 1, p.probe_id) for _, p in speakers]),
        keys=keys,
    )
    for (n, persona), reply in zip(speakers, replies1):
        transcripts[n].append(Turn(1, persona.probe_id, persona.name, reply.text.strip()))
    round2 = []
    for n, persona in speakers:
        statements = "\n".join(
            P.STATEMENT.format(name=t.name, probe_id=t.probe_id, text=t.text) for t in transcripts[n]
        )
        round2.append(
            [
                system,
                {
                    "role": "user",
                    "content": P.DEBATE_ROUND2.format(
                        name=persona.name,
                        bio=persona.bio,
                        interests=_interests(persona),
                        statements=statements,
                    ),
                },
            ]
        )
    replies2 = llm.chat(
        round2,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        seed=settings.conversation_seeds(*[("round", 2, p.probe_id) for _, p in speakers]),
        keys=keys,
    )
    for (n, persona), reply in zip(speakers, replies2):
        transcripts[n].append(Turn(2, persona.probe_id, persona.name, reply.text.strip()))
    return transcripts


def format_transcript(turns: Sequence[Turn]) -> str:
    """The debate log as the merge agent reads it."""
    if not turns:
        return "(no discussion: single member)"
    return "\n".join(f"[round {t.round}] {t.name} ({t.probe_id}): {t.text}" for t in turns)
