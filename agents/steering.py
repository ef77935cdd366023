"""SteerEval steering interventions as policies: observation/info in, steered profile out.

Templates and prompts are SteerEval's (§4.1 and appendix B), verbatim. Every policy has
`act(observation, info) -> str` where `info` is what `SteerEvalEnv.reset` returned
(tag name, the tag's phrase for templates, tag kind, direction, original profile).

Where the paper prints two phrasings of a template (§4.1 and appendix B differ for the
decrease templates) the §4.1 wording is used, because §4.1 states it is the one the
experiments ran. The rewrite request for a genre increase is not printed; it mirrors
the genre decrease template ("the user *wants* to see Mystery movies"), the same way
the trigger pair mirrors itself. See docs/steereval.md.
"""
from __future__ import annotations

import re

from ctrlsim.backends import LLM
from ctrlsim.errors import ConfigError

# (tag kind, direction, emphasis) -> template; "{tag}" is the tag's phrase.
TEMPLATES = {
    ("genre", "increase", "default"): "Please show the user movies that satisfy: {tag}.",
    ("genre", "decrease", "default"): "The user *does not want* to see {tag} movies.",
    ("trigger", "increase", "default"): "The user *wants* to see movies where {tag}.",
    ("trigger", "decrease", "default"): "The user *does not want* to see movies where {tag}.",
    ("genre", "increase", "stronger"): "Please show the user movies *only* {tag} movies.",
    ("genre", "increase", "weaker"): "Please show the user movies *more* {tag} movies.",
    ("genre", "decrease", "weaker"): "Please show the user movies *less* {tag} movies.",
    ("genre", "decrease", "stronger"): "Please show the user movies *no* {tag} movies.",
    ("trigger", "increase", "stronger"): "The user wants to see *only* movies where {tag}.",
    ("trigger", "increase", "weaker"): "The user wants to see *more* movies where {tag}.",
    ("trigger", "decrease", "weaker"): "The user wants to see *less* movies where {tag}.",
    ("trigger", "decrease", "stronger"): "The user wants to see *no* movies where {tag}.",
}
EMPHASES = ("default", "stronger", "weaker")

# The rewrite request ("Modify the user profile to show that <request>"): the template's
# "The user ..." sentence with a lower-case "the"; the genre increase mirrors its decrease.
REWRITE_REQUESTS = {
    ("genre", "increase"): "the user *wants* to see {tag} movies.",
    ("genre", "decrease"): "the user *does not want* to see {tag} movies.",
    ("trigger", "increase"): "the user *wants* to see movies where {tag}.",
    ("trigger", "decrease"): "the user *does not want* to see movies where {tag}.",
}

LLM_APPEND_PROMPT = (
    "You are helping a user update how they describe their movie preferences by rephrasing their changed "
    "preferences into a single sentence. This sentence will be appended to their original description.\n"
    "Guidelines:\n"
    "- Write exactly *one* sentence. The sentence must start with \"The user\".\n"
    "- Do not include any \"REQUEST\" in the response. Only give the rephrased sentence.\n"
    "- Use natural language.\n\n"
    "For example:\n"
    "REQUEST: The user *does not want* to see movies where [the dog dies].\n"
    "The user *does not want* to see any movies where a dog dies.\n\n"
    "REQUEST: {request}"
)

REWRITE_PROMPT = (
    "Modify the user profile to show that {request}\n"
    "Keep all the profile as similar as possible for all other preferences.\n\n"
    "ORIGINAL PROFILE: {profile}\n"
    "UPDATED PROFILE:"
)


def _kind(tag_kind: str) -> str:
    """Genres use the genre templates; every other tag source (triggers, genome tags) the "where" ones."""
    return "genre" if tag_kind == "genre" else "trigger"


def template_sentence(tag: str, tag_kind: str, direction: str, emphasis: str = "default") -> str:
    key = (_kind(tag_kind), direction, emphasis)
    if key not in TEMPLATES:
        raise ConfigError(f"no template for {key}; emphasis must be one of {EMPHASES}")
    return TEMPLATES[key].format(tag=tag)


def rewrite_prompt(tag: str, tag_kind: str, direction: str, profile: str) -> str:
    key = (_kind(tag_kind), direction)
    if key not in REWRITE_REQUESTS:
        raise ConfigError(f"direction must be 'increase' or 'decrease', got {direction!r}")
    return REWRITE_PROMPT.format(request=REWRITE_REQUESTS[key].format(tag=tag), profile=profile.strip())


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def first_sentence(text: str) -> str:
    """The first sentence of `text` (up to the first ., ! or ? followed by white space)."""
    text = " ".join(text.split())
    match = _SENTENCE_END.search(text)
    return text[:match.start()].strip() if match else text.strip()


_QUESTION = re.compile(r"^(is|are|does|do|has|have)\s+(.*?)\??$", re.I)
_PRONOUN_SUBJECTS = ("someone", "somebody", "anyone", "there")
_DETERMINERS = ("a", "an", "the", "any", "their", "his", "her")


def _third_person(verb: str) -> str:
    if verb in ("have",):
        return "has"
    if re.search(r"(s|sh|ch|x|z|o)$", verb):
        return verb + "es"
    if re.search(r"[^aeiou]y$", verb):
        return verb[:-1] + "ies"
    return verb + "s"


def trigger_phrase(tag: str) -> str:
    """A trigger question turned into the clause the templates need ("movies where {tag}").

    DoesTheDogDie names topics as questions; SteerEval renames them algorithmically:
    "Does the dog die?" -> "the dog dies", "Is there cannibalism?" -> "there is cannibalism",
    "Is the fourth wall broken?" -> "the fourth wall is broken", "Are there babies or unborn
    children?" -> "there are babies or unborn children", "Does someone say "I'll kill
    myself"?" -> "someone says "I'll kill myself"". A tag that is not a question is kept
    (with a lower-case first letter, as it follows "movies where").
    """
    text = tag.strip()
    match = _QUESTION.match(text)
    if not match:
        return text[:1].lower() + text[1:]
    aux, rest = match.group(1).lower(), match.group(2).strip()
    words = rest.split()
    if not words:
        return text
    if aux in ("is", "are"):
        if words[0].lower() == "there":
            return f"there {aux} {' '.join(words[1:])}".strip()
        subject_len = 1 if words[0].lower() in _PRONOUN_SUBJECTS else max(len(words) - 1, 1)
        subject, predicate = words[:subject_len], words[subject_len:]
        clause = " ".join([*subject, aux, *predicate])
    else:  # does/do/has/have + subject (a pronoun, or a determiner and a noun) + verb ...
        subject_len = 2 if words[0].lower() in _DETERMINERS and len(words) > 2 else 1
        subject, verb, tail = words[:subject_len], words[subject_len:subject_len + 1], words[subject_len + 1:]
        if aux in ("has", "have"):
            verb = ["has", *verb]
        elif verb:
            verb = [_third_person(verb[0])]
        clause = " ".join([*subject, *verb, *tail])
    return clause[:1].lower() + clause[1:]


def _scenario(info: dict) -> tuple[str, str, str, str]:
    return info.get("tag_phrase", info["tag_name"]), info["tag_kind"], info["direction_name"], \
        info["original_profile"]


class TemplateAppend:
    """Append the paper's template sentence (with an emphasis variant) to the profile."""

    name = "template-append"

    def __init__(self, emphasis: str = "default"):
        if emphasis not in EMPHASES:
            raise ConfigError(f"emphasis must be one of {EMPHASES}, got {emphasis!r}")
        self.emphasis = emphasis

    def act(self, observation: dict, info: dict) -> str:
        tag, kind, direction, profile = _scenario(info)
        return f"{profile.rstrip()} {template_sentence(tag, kind, direction, self.emphasis)}"


class LLMAppend:
    """An LLM rephrases the template into one sentence, written once per (tag, direction) and
    reused for every user (as in the release), then appended."""

    name = "llm-append"

    def __init__(self, llm: LLM, max_tokens: int = 60):
        self.llm, self.max_tokens = llm, max_tokens
        self._sentences: dict[tuple[str, str, str], str] = {}

    def sentence(self, tag: str, kind: str, direction: str) -> str:
        key = (tag, kind, direction)
        if key not in self._sentences:
            request = template_sentence(tag, kind, direction)
            reply = self.llm.chat([[{"role": "user", "content": LLM_APPEND_PROMPT.format(request=request)}]],
                                  max_tokens=self.max_tokens, temperature=0.0)[0].text
            # The prompt asks for exactly one sentence: keep the first (an empty reply keeps the request).
            self._sentences[key] = first_sentence(reply) or request
        return self._sentences[key]

    def act(self, observation: dict, info: dict) -> str:
        tag, kind, direction, profile = _scenario(info)
        return f"{profile.rstrip()} {self.sentence(tag, kind, direction)}"


class LLMRewrite:
    """An LLM rewrites the whole profile to include the change (appendix B prompt)."""

    name = "llm-rewrite"

    def __init__(self, llm: LLM, max_tokens: int = 320):
        self.llm, self.max_tokens = llm, max_tokens

    def act(self, observation: dict, info: dict) -> str:
        tag, kind, direction, profile = _scenario(info)
        prompt = rewrite_prompt(tag, kind, direction, profile)
        reply = self.llm.chat([[{"role": "user", "content": prompt}]], max_tokens=self.max_tokens,
                              temperature=0.0)[0].text.strip()
        return reply.removeprefix("UPDATED PROFILE:").strip()


INTERVENTIONS = {"template-append": TemplateAppend, "llm-append": LLMAppend, "llm-rewrite": LLMRewrite}
