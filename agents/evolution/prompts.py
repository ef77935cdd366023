"""Prompts of the evolution loop's debate and merge phases, each naming the section it follows.

The paper describes these prompts (Appendix D.3 "Interactive debate" and "Merge", Appendix E's
two-round discussion, Appendix G's User Merge Expert structure: CONTEXT, SYNTHESIS PROCESS,
target_tag_list as the attentional anchor) but does not print their wording, so the texts are
ours. As in `ctrlsim.agents.prompts`, the system message holds only what every conversation of
a batch shares (role, rules, reply format) so runtimes reuse the KV prefix; everything that
differs per conversation comes in the user message. Placeholders are `str.format` fields.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- debate
# Appendix D.3 "Interactive debate" and Appendix E: round 1 - each agent individually states its
# personal preferences and representative behaviour stream.
DEBATE_SYSTEM = (
    "You are one member of a small group of {domain} fans. The group must agree on one shared profile "
    "that describes all of you. Speak in the first person, as your persona, in at most four sentences. "
    "Do not invent {domain}: mention only titles you were given."
)

DEBATE_ROUND1 = (
    "Your persona: {name}. {bio}\n"
    "Your interests: {interests}\n"
    "{domain_title} you liked (your behaviour):\n{behaviour}\n\n"
    "Round 1 of the group discussion with {others}. State your personal preferences and name the two "
    "or three {domain} above that best represent your taste."
)

# Appendix D.3 and Appendix E: round 2 - agents debate and negotiate specific differences (the paper's
# examples: technique vs emotion, comedy vs tragedy), citing each other's statements, to form one
# unified group profile.
DEBATE_ROUND2 = (
    "Your persona: {name}. {bio}\n"
    "Your interests: {interests}\n\n"
    "Round 1 statements of the group:\n{statements}\n\n"
    "Round 2. Negotiate toward one group profile: quote or name at least one other member, say where "
    "your tastes agree and where they differ, and propose what the shared profile should keep."
)

STATEMENT = '- {name} ({probe_id}): "{text}"'

# --------------------------------------------------------------------------- merge
# Appendix G, User Merge Expert Agent: CONTEXT establishes the expert identity; SYNTHESIS PROCESS
# defines the atomic operations (bio synthesis, interest filtering to the top 5, behaviour
# distillation); target_tag_list is the attentional anchor: items with a target tag are kept "as much
# as possible" (the wording of the paper's public code; the loop adds dropped ones back only when
# `EvolutionSettings.force_target_items` is set).
# Input (Appendix D.3 "Merge"): the members' original profiles, behaviour written as
# "id: Title (Year), (Genres)", and the debate log L_j.
MERGE_SYSTEM = (
    "CONTEXT: You are the User Merge Expert. A group of {domain} users has discussed their tastes. You "
    "synthesise ONE super user profile that represents the whole group and keeps what matters for the "
    "target tags.\n"
    "SYNTHESIS PROCESS:\n"
    "1. Bio synthesis: write a bio of two or three sentences in the third person that unites the "
    "members' consensus and drops contradictions.\n"
    "2. Interest filtering: keep the top 5 interests shared by the group, most important first.\n"
    "3. Behaviour distillation: from the members' behaviour, keep the item ids that fit the new "
    "profile; drop noisy or contradictory ones; keep the items that have a tag from target_tag_list "
    "as much as possible.\n"
    'Reply with one JSON object and nothing else: {{"name": "...", "bio": "...", "interests": '
    '["...", ...], "behaviour": ["item id", ...]}}'
)

MERGE_USER = (
    "target_tag_list: {targets}\n\n"
    "MEMBER PROFILES:\n{profiles}\n\n"
    "DEBATE LOG:\n{transcript}\n\n"
    "Write the super user profile as JSON. Use only item ids that appear in the members' behaviour."
)

MEMBER_PROFILE = "[{probe_id}] {name}. {bio}\nInterests: {interests}\nBehaviour:\n{behaviour}"

# Appendix D.3 / reference behaviour: a cluster with one member has nobody to merge with, so the
# expert only filters its behaviour to the persona (keeping target-tag items as much as possible).
FILTER_SYSTEM = (
    "CONTEXT: You are the User Merge Expert. You clean one {domain} user's behaviour: keep the item ids "
    "that fit the user's profile, drop noisy or contradictory ones, and keep the items that have a tag "
    "from target_tag_list as much as possible.\n"
    'Reply with one JSON object and nothing else: {{"behaviour": ["item id", ...]}}'
)

FILTER_USER = (
    "target_tag_list: {targets}\n\n"
    "PROFILE:\n{profile}\n\n"
    "Reply with the kept item ids as JSON. Use only item ids listed in the behaviour above."
)

# The one retry after an unusable reply (issue: one retry, then the best member's profile, flagged).
MERGE_RETRY = (
    "That reply was not usable ({problem}). Reply again with only the JSON object "
    '{{"name": string, "bio": string, "interests": [at most 5 strings], "behaviour": [item ids from the '
    "members' behaviour]}}."
)

FILTER_RETRY = (
    "That reply was not usable ({problem}). Reply again with only the JSON object "
    '{{"behaviour": [item ids from the behaviour above]}}.'
)


def _item_array(item_ids, max_items: int) -> dict:
    # maxItems matters: under a grammar, small models otherwise repeat one id until max_tokens.
    items = (
        {"type": "string", "enum": sorted(set(item_ids))} if item_ids else {"type": "string", "maxLength": 16}
    )
    return {"type": "array", "items": items, "maxItems": max_items}


def merge_schema(item_ids=(), max_items: int = 30) -> dict:
    """JSON schema of a merge reply (constrained decoding where the runtime supports it); `item_ids`,
    when given, restricts behaviour entries to ids that exist in the batch; `max_items` caps the list
    (the largest member union of the batch)."""
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 60},
            "bio": {"type": "string", "maxLength": 400},
            "interests": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 5},
            "behaviour": _item_array(item_ids, max_items),
        },
        "required": ["name", "bio", "interests", "behaviour"],
        "additionalProperties": False,
    }


def filter_schema(item_ids=(), max_items: int = 30) -> dict:
    """JSON schema of a singleton filter reply."""
    return {
        "type": "object",
        "properties": {"behaviour": _item_array(item_ids, max_items)},
        "required": ["behaviour"],
        "additionalProperties": False,
    }
