"""Every prompt the LLM probes use, each naming the CtrlBench-Rec section it follows.

The paper gives the roles and rules of its prompts but not their wording (its
templates live in its code release), so the texts below are ours; what each one
must contain comes from the section named in its comment.

Prompt layout for batching: a decision conversation is `[system, user]` where the
system message holds only text shared by every probe of a population step (the
role, the task goal, the rules, the reply format), so llama.cpp reuses its KV prefix
and vLLM its prefix cache; everything that differs per probe (persona, memory,
current slate) comes after it, in the user message.

Placeholders are `str.format` fields; `{domain}` is the catalogue's noun ("movies").
"""
from __future__ import annotations

from ctrlsim.envs.roster import catalogue_noun

# --------------------------------------------------------------------------- profile generation
# §3.2 Stage 1 (User Profile Expert) and Appendix C "Initialization": demographics plus a seed
# behaviour stream of L_init in [4, 6] items become a structured persona; Appendix F shows the
# fields (name, bio, interests). The behaviour (seed item ids) is copied from the data, not
# written by the model, so a small model cannot invent an id.
PROFILE_SYSTEM = (
    "You are a user profile expert. From a person's demographics and the {domain} they liked, you "
    "write a short, realistic persona of that person as a single JSON object and nothing else."
)

PROFILE_USER = (
    "Demographics: {demographics}\n"
    "{domain_title} this person liked, oldest first:\n{items}\n\n"
    "Write their persona as JSON with these keys:\n"
    '  "name": a plausible first name,\n'
    '  "bio": one or two short sentences in the third person: who they are and what {domain} they enjoy,\n'
    '  "interests": up to 5 short phrases naming what they like (genres, themes, styles).\n'
    'Reply with the JSON object only, for example: '
    '{{"name": "...", "bio": "...", "interests": ["...", "..."]}}'
)

# The retry after an unusable reply (issue: one retry, then a template persona).
PROFILE_RETRY = (
    "That reply was not the JSON object asked for. Reply again with only a JSON object with the keys "
    '"name" (string), "bio" (string) and "interests" (list of at most 5 strings).'
)

# A template persona (when the LLM fails twice) takes its bio from `ctrlsim.envs.roster.template_bio`:
# demographics plus the seed items' most frequent tags, no LLM text at all.

# --------------------------------------------------------------------------- decisions
# §3.2 Stage 2 "Multi-turn interactive alignment" and Appendix B "Agent Probe": each round the
# agent reads the recommendation list L_t and picks a_t in L_t ∪ {skip}; Appendix D.2 names the
# tools (like, and the paper's search / skip), with short-term memory only, loaded together with the
# profile prompt. Appendix B's relevance constraint ("interactions must satisfy relevance
# constraints, precluding degenerate strategies like random clicks on unrelated items") is rule 1.
_DECISION_ROLE = (
    "You play one user of a {domain_singular} recommender website. You are shown your persona, what "
    "happened in your last rounds, and the {slate_size} {domain} the website shows you now.\n"
    "{goal}"
    "Each round you may:\n"
    "- like any of the shown {domain} (give their numbers), or none of them (a skip)"
)
_DECISION_SEARCH_TOOL = (
    ";\n- optionally type a short search query; then the next list shows search results instead of "
    "recommendations"
)
_DECISION_RULES = (
    ".\nRules:\n"
    "1. Like only {domain} that fit your persona. Never like {domain} unrelated to your interests, "
    "even to reach the goal.\n"
    "2. Liking a {domain_singular} tells the website what to recommend next.\n"
)
DECISION_SYSTEM = (
    _DECISION_ROLE + _DECISION_SEARCH_TOOL + _DECISION_RULES
    + 'Reply with one JSON object and nothing else, for example {{"like": [2], "search": ""}}. "like" lists '
    'the numbers of the {domain} you like ([] to skip); "search" is a few words to search for, or "" to '
    "keep getting recommendations."
)
# The evaluation setting of Appendix B (a_t in L_t or a skip; `allow_search=False`): no search tool.
DECISION_SYSTEM_NO_SEARCH = (
    _DECISION_ROLE + _DECISION_RULES
    + 'Reply with one JSON object and nothing else, for example {{"like": [2]}}. "like" lists the numbers '
    "of the {domain} you like ([] to skip)."
)
# Negative feedback (issue 48, `DecisionSettings.negative_feedback`, json head only): "not interested"
# on shown items, the explicit control real recommender sites offer most. Offered only where the env
# takes it; the like-only texts above are unchanged without it. "dislike" and "block" are not offered:
# every box here reads a dislike as it reads "not interested", and small probe models pressed block
# on a tag of the very items they liked in the same reply (docs/responsiveness.md).
_DECISION_BUTTONS = (
    ";\n- mark shown {domain} you do not want as not interested (give their numbers), so the website "
    "shows fewer like them"
)
_BUTTONS_REPLY = '"not_interested" lists the numbers of the {domain} you do not want ([] for none).'
DECISION_SYSTEM_BUTTONS = (
    _DECISION_ROLE + _DECISION_SEARCH_TOOL + _DECISION_BUTTONS + _DECISION_RULES
    + 'Reply with one JSON object and nothing else, for example {{"like": [2], "not_interested": [3], '
    '"search": ""}}. "like" lists the numbers of the {domain} you like ([] to skip); ' + _BUTTONS_REPLY
    + ' "search" is a few words to search for, or "" to keep getting recommendations.'
)
DECISION_SYSTEM_BUTTONS_NO_SEARCH = (
    _DECISION_ROLE + _DECISION_BUTTONS + _DECISION_RULES
    + 'Reply with one JSON object and nothing else, for example {{"like": [2], "not_interested": [3]}}. '
    '"like" lists the numbers of the {domain} you like ([] to skip); ' + _BUTTONS_REPLY
)
# The question heads (below): no search tool, no JSON; the answer is one word per question.
DECISION_SYSTEM_QUESTIONS = _DECISION_ROLE + _DECISION_RULES + "{answer_format}"

# Decision heads that read next-token probabilities (`DecisionSettings.decision`, issue 42): one
# question per slate item, answered "yes" or "no". The conversation is the JSON head's, with the reply
# format replaced by the question, so every item's question shares the persona, goal, memory and
# slate prefix and only the last line differs. "yesno" asks one question; "twostep" asks whether the
# item fits the persona and, separately, whether liking it moves toward the goal.
ANSWER_FORMAT = "Answer each question with yes or no."
QUESTION_LIKE = "\nQuestion: do you like {domain_singular} {position}, {item}? Answer yes or no."
QUESTION_FIT = ("\nQuestion: does {domain_singular} {position}, {item}, fit your persona and interests? "
                "Answer yes or no.")
QUESTION_GOAL = ("\nQuestion: is {domain_singular} {position}, {item}, one of the {target} {domain} of your "
                 "goal? Answer yes or no.")
# The goal question of a round that steers away from the target (`GOAL_AWAY`): "yes" = not a target.
QUESTION_AVOID = ("\nQuestion: is {domain_singular} {position}, {item}, free of {target}, so that liking it "
                  "does not bring more {target} {domain}? Answer yes or no.")

# The task goal (Appendix B: the policy is conditioned on the target set T). Shown by default;
# `target_visible=False` leaves it out (the reference code never shows it; the paper's Task 2/3
# variants do), and results record which.
GOAL_VISIBLE = (
    "Your goal: help the website discover as many different {target} {domain} as possible, by liking "
    "{domain} that fit your persona and that steer its recommendations towards {target}.\n"
)

# Steering away (ctrlbench's suppression task, issue 47): the probe wants to see fewer of the target's
# items; it keeps liking what fits its persona, minus the target.
GOAL_AWAY = (
    "Your goal: make the website show you fewer {target} {domain}. Like {domain} that fit your persona "
    "and are not {target}, and never like {target} {domain}, so its recommendations move away from "
    "{target}.\n"
)

# Appendix D.8, CtrlBench-Rec (Logic): super probes get a restructured decision logic that
# favours items with long-tail potential ("oriented interest expansion" instead of preference
# matching). Appended to the goal.
GOAL_LOGIC = (
    "Prefer lesser-known {domain} that still fit your persona: they open parts of the catalogue the "
    "website rarely recommends. Expand your interests step by step instead of repeating the obvious picks.\n"
)

# The per-probe part (user message): persona (§3.2 static profile), short-term memory of the last
# M rounds (§3.2 dynamic memory, Appendix D.2), then the current list L_t.
DECISION_CONTEXT = (
    "Your persona: {name}. {bio}\n"
    "Your interests: {interests}\n"
    "{domain_title} you liked before: {behaviour}\n"
    "{memory}"
    "Round {round} of {budget}. The website now shows ({source}):\n{slate}"
)
DECISION_USER = DECISION_CONTEXT + "\nWhich do you like?"

# "append" conversations (DecisionSettings.conversation): each later round is one more user turn
# after the probe's own earlier replies, so only the round and the slate are new text.
APPEND_ROUND = "Round {round} of {budget}. The website now shows ({source}):\n{slate}\nWhich do you like?"

MEMORY_HEADER = "Your last rounds:\n"
MEMORY_ROUND = "- Round {round} ({source}) showed: {shown}. You liked: {liked}.{searched}\n"
MEMORY_SEARCHED = " You then searched for \"{query}\"."
MEMORY_NONE = "nothing"
# A remembered round's "not interested" marks (only where the probe made any).
MEMORY_DISMISSED = " You marked not interested: {items}."

# --------------------------------------------------------------------------- naive baseline
# Only for benchmarks/llm_probe_throughput.py: the "naive loop" each probe sends on its own. Same
# information as a decision conversation, but the probe's own text first (no prefix to share) and
# a free-text answer that is parsed for numbers.
NAIVE_DECISION = (
    "{probe_text}\n\n{task_text}\nAnswer in a sentence with the numbers of the {domain} you like."
)


def domain_nouns(dataset_name: str) -> dict[str, str]:
    """The catalogue's noun for prompts: movies for MovieLens, products for Amazon, items otherwise."""
    plural, singular = catalogue_noun(dataset_name)
    return {"domain": plural, "domain_singular": singular, "domain_title": plural.capitalize()}


# Prompts an evolution never sends (its episodes have no phases and no buttons): the evolution's cache
# key (`agents.evolution.methods.prompt_digest`) leaves them out, so adding them changed no
# evolution's identity.
NOT_IN_EVOLUTION = ("GOAL_AWAY", "QUESTION_AVOID", "_DECISION_BUTTONS", "_BUTTONS_REPLY",
                    "DECISION_SYSTEM_BUTTONS", "DECISION_SYSTEM_BUTTONS_NO_SEARCH", "MEMORY_DISMISSED")
