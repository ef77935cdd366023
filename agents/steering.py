"""SteerEval steering interventions as policies: observation/info in, steered profile out.

Templates and prompts are SteerEval's (§4.1 and appendix B). Every policy has
`act(observation, info) -> str` where `info` is what `SteerEvalEnv.reset`
returned (tag name, tag kind, direction, original profile).
"""
from __future__ import annotations

from ctrlsim.backends import LLM
from ctrlsim.errors import ConfigError

# (tag kind, direction, emphasis) -> template; "{tag}" is the tag name.
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
    "Modify the user profile to show that {request_body}\n"
    "Keep all the profile as similar as possible for all other preferences.\n\n"
    "ORIGINAL PROFILE: {profile}\n"
    "UPDATED PROFILE:"
)


def template_sentence(tag: str, tag_kind: str, direction: str, emphasis: str = "default") -> str:
    kind = "genre" if tag_kind == "genre" else "trigger"
    key = (kind, direction, emphasis)
    if key not in TEMPLATES:
        raise ConfigError(f"no template for {key}; emphasis must be one of {EMPHASES}")
    return TEMPLATES[key].format(tag=tag)


def _scenario(info: dict) -> tuple[str, str, str, str]:
    return info["tag_name"], info["tag_kind"], info["direction_name"], info["original_profile"]


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
        self._sentences: dict[tuple[str, str], str] = {}

    def sentence(self, tag: str, kind: str, direction: str) -> str:
        key = (tag, direction)
        if key not in self._sentences:
            request = template_sentence(tag, kind, direction)
            reply = self.llm.chat([[{"role": "user", "content": LLM_APPEND_PROMPT.format(request=request)}]],
                                  max_tokens=self.max_tokens, temperature=0.0)[0].text.strip()
            # Keep the first sentence; the prompt asks for exactly one.
            first = reply.split("\n")[0].strip()
            self._sentences[key] = first if first else request
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
        sentence = template_sentence(tag, kind, direction)
        body = sentence[len("The user "):] if sentence.startswith("The user ") else sentence
        request_body = f"the user {body}" if sentence.startswith("The user ") else \
            f"the user wants this: {sentence}"
        prompt = REWRITE_PROMPT.format(request_body=request_body, profile=profile.strip())
        reply = self.llm.chat([[{"role": "user", "content": prompt}]], max_tokens=self.max_tokens,
                              temperature=0.0)[0].text.strip()
        return reply.removeprefix("UPDATED PROFILE:").strip()


INTERVENTIONS = {"template-append": TemplateAppend, "llm-append": LLMAppend, "llm-rewrite": LLMRewrite}
