"""Merge phase: the User Merge Expert turns each cluster into one super probe (Appendix G).

Input per cluster: the members' profiles (behaviour as "id: Title (Year), (Genres)"), the
debate transcript and the target tag list as the anchor. Output: a bio, the top-5 interests
and the behaviour filtered to the new persona. The prompt asks the model to keep the items with
a target tag as much as possible, as the paper's public code does, and the behaviour is what
the model kept (ids that exist among the members' items). `force_target_items=True`
(`EvolutionSettings.force_target_items`) adds back every member target item the model dropped,
the rule this module used to apply always; `FusionOutcome.added_target_items` lists what was
added (empty when not forced) and the loop's generation summary counts them, since super probes
that start with target-heavy histories could owe their advantage to that rule rather than to
debate and merge. A one-member cluster is only filtered. An unusable reply gets one retry; if
that fails too the cluster is represented by its best member, flagged (`FLAG_MERGE_FALLBACK`,
`valid=False`). All merges of a generation go out in one batched call (filters in a second
one); retries in one more per kind. When sampling, each conversation has its own seed, derived
from the phase's seed, the kind of call and the new probe's id (unique in a generation and the
same when a cluster is fused on its own, `cluster_unit`).

`select_best` is the KMeans-Fusion baseline's fusion: keep each cluster's best member.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from ctrlsim.data import Dataset
from ctrlsim.errors import LLMOutputError

from ..persona import MAX_INTERESTS, Persona
from ..replies import extract_json_object
from . import prompts as P
from .debate import GenerationSettings, Turn, behaviour_lines, format_transcript

FLAG_MERGE_FALLBACK = "merge_fallback_best_member"
FLAG_FILTER_FALLBACK = "filter_fallback_unchanged"
RETRY_ECHO_CHARS = 600


@dataclass
class FusionOutcome:
    """What fusion made of one cluster, with the evidence (raw replies, problems) for the run folder."""

    persona: Persona
    members: tuple[str, ...]
    kind: str  # "merge", "filter" or "select"
    valid: bool = True
    retried: bool = False
    replies: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    added_target_items: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "persona": self.persona.to_dict(),
            "members": list(self.members),
            "kind": self.kind,
            "valid": self.valid,
            "retried": self.retried,
            "replies": self.replies,
            "problems": self.problems,
            "added_target_items": list(self.added_target_items),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "FusionOutcome":
        return cls(
            persona=Persona.from_dict(data["persona"]),
            members=tuple(data["members"]),
            kind=data["kind"],
            valid=data["valid"],
            retried=data["retried"],
            replies=list(data["replies"]),
            problems=list(data["problems"]),
            added_target_items=tuple(data["added_target_items"]),
        )


def member_score(
    persona: Persona, target_items: set[str], recent_likes: Sequence[str]
) -> tuple[int, int, int]:
    """Rank key for "best member": target items liked in the last interaction phase, then target
    items in the whole behaviour, then likes in the last phase."""
    return (
        sum(1 for i in recent_likes if i in target_items),
        sum(1 for i in persona.behaviour if i in target_items),
        len(recent_likes),
    )


def best_member(
    members: Sequence[Persona], target_items: set[str], recent_likes: Mapping[str, Sequence[str]]
) -> Persona:
    """The member with the highest `member_score`; the earliest member wins ties."""
    scores = [member_score(p, target_items, recent_likes.get(p.probe_id, ())) for p in members]
    return members[max(range(len(members)), key=lambda n: (scores[n], -n))]


def _union_behaviour(members: Sequence[Persona]) -> list[str]:
    return list(dict.fromkeys(i for p in members for i in p.behaviour))


def _item_list(value, text: str) -> list[str]:
    if not isinstance(value, list):
        raise LLMOutputError('"behaviour" is not a list', text)
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            continue
        # Small models write "123: Title (Year)"; the id is what comes before the colon.
        out.append(str(v).split(":", 1)[0].strip())
    return out


def distil_behaviour(
    chosen: Sequence[str], allowed: Sequence[str], target_items: set[str], *, force_target_items: bool = False
) -> tuple[list[str], list[str]]:
    """Chosen ids that exist among `allowed`, in `allowed` order; with `force_target_items`, also
    every allowed target item the model dropped. Returns (behaviour, target items added back:
    always empty unless forced)."""
    chosen_set = set(chosen)
    if not force_target_items:
        return [i for i in allowed if i in chosen_set], []
    added = [i for i in allowed if i in target_items and i not in chosen_set]
    keep = chosen_set | set(added)
    return [i for i in allowed if i in keep], added


def parse_merge_reply(
    text: str, allowed: Sequence[str], target_items: set[str], *, force_target_items: bool = False
) -> tuple[dict, list[str]]:
    """{"name", "bio", "interests", "behaviour"} from a merge reply, and the target items added back
    (`distil_behaviour`); raises LLMOutputError if unusable."""
    obj = extract_json_object(text)
    if obj is None:
        raise LLMOutputError("no JSON object", text)
    bio = obj.get("bio")
    if not isinstance(bio, str) or sum(any(c.isalpha() for c in w) for w in bio.split()) < 3:
        # A list of years or ids is not a bio (small models write "1996, 1997, 1998").
        raise LLMOutputError('"bio" is missing or has fewer than three words', text)
    interests = obj.get("interests")
    if not isinstance(interests, list) or not [s for s in interests if isinstance(s, str) and s.strip()]:
        raise LLMOutputError('"interests" is not a non-empty list of strings', text)
    behaviour, added = distil_behaviour(
        _item_list(obj.get("behaviour"), text), allowed, target_items, force_target_items=force_target_items
    )
    if not behaviour:
        raise LLMOutputError("no behaviour item is one of the members' items", text)
    name = obj.get("name") if isinstance(obj.get("name"), str) and obj.get("name").strip() else ""
    clean = [s.strip() for s in interests if isinstance(s, str) and s.strip()][:MAX_INTERESTS]
    return {"name": name.strip(), "bio": bio.strip(), "interests": clean, "behaviour": behaviour}, added


def parse_filter_reply(
    text: str, allowed: Sequence[str], target_items: set[str], *, force_target_items: bool = False
) -> tuple[list[str], list[str]]:
    obj = extract_json_object(text)
    if obj is None:
        raise LLMOutputError("no JSON object", text)
    behaviour, added = distil_behaviour(
        _item_list(obj.get("behaviour"), text), allowed, target_items, force_target_items=force_target_items
    )
    if not behaviour:
        raise LLMOutputError("no behaviour item is one of the listed items", text)
    return behaviour, added


def _profile_block(persona: Persona, dataset: Dataset) -> str:
    return P.MEMBER_PROFILE.format(
        probe_id=persona.probe_id,
        name=persona.name,
        bio=persona.bio,
        interests=", ".join(persona.interests) or "not stated",
        behaviour=behaviour_lines(persona, dataset, with_ids=True),
    )


def _chat_json(
    llm, conversations, schema: dict, settings: GenerationSettings, keys, max_tokens: int, seed_names
):
    """One batched call; `seed_names[n]` names conversation n's own seed when sampling."""
    kwargs = {"json_schema": schema} if getattr(llm, "supports_json_schema", False) else {}
    return llm.chat(
        conversations,
        max_tokens=max_tokens,
        temperature=settings.temperature,
        seed=settings.conversation_seeds(*seed_names),
        keys=keys,
        **kwargs,
    )


def fuse_clusters(
    llm,
    groups: Sequence[Sequence[Persona]],
    transcripts: Sequence[Sequence[Turn]],
    dataset: Dataset,
    *,
    target_tags: Sequence[str],
    target_items: set[str],
    recent_likes: Mapping[str, Sequence[str]],
    new_ids: Sequence[str],
    nouns: dict[str, str],
    settings: GenerationSettings | None = None,
    max_tokens: int = 384,
    key_prefix: str = "merge",
    schema_groups: Sequence[Sequence[Persona]] | None = None,
    force_target_items: bool = False,
) -> list[FusionOutcome]:
    """Merge every multi-member group and filter every single-member group (see module docstring;
    `force_target_items` adds back the target items the model dropped).

    `schema_groups` (default: `groups`) are the clusters whose behaviour defines the reply schema
    (allowed item ids, list length): fusing one cluster of a generation on its own with the whole
    generation here asks the LLM exactly what the batched call over all clusters asks it."""
    settings = settings or GenerationSettings()
    scope = list(groups if schema_groups is None else schema_groups)
    targets = ", ".join(target_tags) or "(none)"
    outcomes: list[FusionOutcome | None] = [None] * len(groups)
    jobs = {"merge": [], "filter": []}
    for n, group in enumerate(groups):
        jobs["merge" if len(group) >= 2 else "filter"].append(n)
    union = {n: _union_behaviour(g) for n, g in enumerate(groups)}

    def conversation(n: int) -> list[dict]:
        if n in jobs["merge"]:
            profiles = "\n\n".join(_profile_block(p, dataset) for p in groups[n])
            return [
                {"role": "system", "content": P.MERGE_SYSTEM.format(**nouns)},
                {
                    "role": "user",
                    "content": P.MERGE_USER.format(
                        targets=targets, profiles=profiles, transcript=format_transcript(transcripts[n])
                    ),
                },
            ]
        return [
            {"role": "system", "content": P.FILTER_SYSTEM.format(**nouns)},
            {
                "role": "user",
                "content": P.FILTER_USER.format(
                    targets=targets, profile=_profile_block(groups[n][0], dataset)
                ),
            },
        ]

    def accept(n: int, text: str) -> FusionOutcome:
        group = groups[n]
        members = tuple(p.probe_id for p in group)
        if n in jobs["merge"]:
            fields, added = parse_merge_reply(
                text, union[n], target_items, force_target_items=force_target_items
            )
            persona = Persona(
                probe_id=new_ids[n],
                name=fields["name"] or f"Group {new_ids[n]}",
                bio=fields["bio"],
                interests=tuple(fields["interests"]),
                behaviour=tuple(fields["behaviour"]),
                source="merge",
            )
            return FusionOutcome(persona, members, "merge", added_target_items=tuple(added))
        behaviour, added = parse_filter_reply(
            text, union[n], target_items, force_target_items=force_target_items
        )
        persona = replace(group[0], probe_id=new_ids[n], behaviour=tuple(behaviour))
        return FusionOutcome(persona, members, "filter", added_target_items=tuple(added))

    for kind, schema_fn, retry in (
        ("merge", P.merge_schema, P.MERGE_RETRY),
        ("filter", P.filter_schema, P.FILTER_RETRY),
    ):
        todo = jobs[kind]
        if not todo:
            continue
        in_scope = [_union_behaviour(g) for g in scope if (len(g) >= 2) == (kind == "merge")]
        allowed_ids = sorted({i for ids in in_scope for i in ids})
        schema = schema_fn(allowed_ids, max(len(ids) for ids in in_scope))
        convs = {n: conversation(n) for n in todo}
        keys = [f"{key_prefix}/{new_ids[n]}" for n in todo]
        seed_names = [(kind, new_ids[n]) for n in todo]
        replies = _chat_json(llm, [convs[n] for n in todo], schema, settings, keys, max_tokens, seed_names)
        failed: dict[int, tuple[str, str]] = {}
        for n, reply in zip(todo, replies):
            try:
                outcomes[n] = accept(n, reply.text)
                outcomes[n].replies.append(reply.text)
            except LLMOutputError as exc:
                failed[n] = (reply.text, str(exc).split("; reply was")[0])
        if failed:
            # The failed reply goes back cut short: a runaway reply would otherwise fill the context.
            retry_convs = [
                convs[n]
                + [
                    {"role": "assistant", "content": failed[n][0][:RETRY_ECHO_CHARS]},
                    {"role": "user", "content": retry.format(problem=failed[n][1])},
                ]
                for n in failed
            ]
            retry_replies = _chat_json(
                llm,
                retry_convs,
                schema,
                settings,
                [f"{key_prefix}/{new_ids[n]}" for n in failed],
                max_tokens,
                [(kind, "retry", new_ids[n]) for n in failed],
            )
            for n, reply in zip(list(failed), retry_replies):
                first_text, first_problem = failed[n]
                try:
                    outcome = accept(n, reply.text)
                    outcome.problems.append(first_problem)
                except LLMOutputError as exc:
                    outcome = _fallback(n, groups[n], kind, target_items, recent_likes, new_ids[n])
                    outcome.problems += [first_problem, str(exc).split("; reply was")[0]]
                outcome.retried = True
                outcome.replies += [first_text, reply.text]
                outcomes[n] = outcome
    return outcomes  # type: ignore[return-value]


def _with_flag(flags: tuple[str, ...], flag: str) -> tuple[str, ...]:
    return flags if flag in flags else flags + (flag,)


def _fallback(
    n: int,
    group: Sequence[Persona],
    kind: str,
    target_items: set[str],
    recent_likes: Mapping[str, Sequence[str]],
    new_id: str,
) -> FusionOutcome:
    members = tuple(p.probe_id for p in group)
    if kind == "merge":
        best = best_member(group, target_items, recent_likes)
        persona = replace(best, probe_id=new_id, flags=_with_flag(best.flags, FLAG_MERGE_FALLBACK))
    else:
        persona = replace(group[0], probe_id=new_id, flags=_with_flag(group[0].flags, FLAG_FILTER_FALLBACK))
    return FusionOutcome(persona, members, kind, valid=False)


def select_best(
    groups: Sequence[Sequence[Persona]], *, target_items: set[str], recent_likes: Mapping[str, Sequence[str]]
) -> list[FusionOutcome]:
    """KMeans-Fusion (§4.1 baseline 3): each cluster keeps its top-performing member, unchanged
    (its probe id included: it is the same agent)."""
    return [
        FusionOutcome(
            best_member(group, target_items, recent_likes), tuple(p.probe_id for p in group), "select"
        )
        for group in groups
    ]
