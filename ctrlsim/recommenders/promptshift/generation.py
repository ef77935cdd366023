"""PromptShift's LLM list generator: prompts (section 5.2), list parsing, batched generation.

Every prompt condition shares the system message, the ordered history and the
request for N numbered candidates; they differ only in the task instruction
(history-only or one of the three identity-free paraphrases P1-P3) and in one
optional factual identity-cue sentence placed first:

    [The user's profile: gender is female.]
    Use the viewing history below to recommend movies this viewer is likely to enjoy.

    Viewing history:
    1. Toy Story (1995)
    ...

    Recommend 30 new movies that are not in the viewing history. Respond with ...

The paper fixes the system messages, instructions and cue sentences word for
word (quoted below; its typographic apostrophes are written as ASCII "'"). It
only describes the request ("a fixed request for 30 new candidates in a
numbered, prose-free format"), so `REQUEST` is our wording of it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from ctrlsim.backends.llm import LLM, Conversation
from ctrlsim.data.matching import normalize_title
from ctrlsim.data.splits import AGE_GROUPS, GENDER_NAMES
from ctrlsim.errors import ConfigError, LLMOutputError
from ctrlsim.recommenders.promptshift.defaults import N_CANDIDATES, TEMPERATURE, default_max_tokens

DOMAINS = ("movies", "music")

SYSTEM = {
    "movies": "You are a professional movie recommendation system.",
    "music": "You are a professional music recommendation system that recommends individual songs.",
}

# History-only instruction and the three identity-free paraphrase controls (direct, inferential, formal).
INSTRUCTIONS = {
    "movies": {
        "history": "Use the viewing history below to recommend movies this viewer is likely to enjoy.",
        "p1": "Choose movies this viewer is likely to enjoy based on the viewing history below.",
        "p2": "Infer this viewer's movie preferences from the viewing history below and recommend "
              "matching movies.",
        "p3": "Based on the demonstrated preferences in the viewing history below, please provide suitable "
              "movie recommendations for this viewer.",
    },
    "music": {
        "history": "Use the listening history below to recommend tracks this listener is likely to enjoy.",
        "p1": "Choose tracks this listener is likely to enjoy based on the listening history below.",
        "p2": "Infer this listener's track preferences from the listening history below and recommend "
              "matching tracks.",
        "p3": "Based on the demonstrated preferences in the listening history below, please provide suitable "
              "track recommendations for this listener.",
    },
}
PARAPHRASES = ("p1", "p2", "p3")

HISTORY_HEADER = {"movies": "Viewing history:", "music": "Listening history:"}
REQUEST = {
    "movies": ("Recommend {n} new movies that are not in the viewing history. Respond with a numbered list "
               "from 1 to {n}, one movie per line, formatted as \"<number>. <title> (<year>)\". "
               "Do not write anything else."),
    "music": ("Recommend {n} new tracks that are not in the listening history. Respond with a numbered list "
              "from 1 to {n}, one track per line, formatted as \"<number>. <artist> - <title>\". "
              "Do not write anything else."),
}

CUE_PREFIX = "The user's profile: "
_AGE_BY_SLUG = {label.replace(" ", "_").replace("-", "_"): label for label, _, _ in AGE_GROUPS}


def cue_sentence(slice_id: str) -> str:
    """The factual identity-cue sentence for a slice id.

    "gender_F" -> "The user's profile: gender is female."; "age_young_adult" ->
    "... age group is young adult."; "cross_F_young_adult" -> "... gender is
    female and age group is young adult."
    """
    kind, _, rest = slice_id.partition("_")
    try:
        if kind == "gender":
            return f"{CUE_PREFIX}gender is {GENDER_NAMES[rest]}."
        if kind == "age":
            return f"{CUE_PREFIX}age group is {_AGE_BY_SLUG[rest]}."
        if kind == "cross":
            gender, _, age = rest.partition("_")
            return f"{CUE_PREFIX}gender is {GENDER_NAMES[gender]} and age group is {_AGE_BY_SLUG[age]}."
    except KeyError:
        pass
    raise ConfigError(f"no identity-cue sentence for slice id {slice_id!r}")


@dataclass(frozen=True)
class PromptCondition:
    """One prompt condition: an instruction ("history", "p1", "p2", "p3") and an optional cue slice.

    The paper's identity-conditioned prompt keeps the history-only instruction
    and adds the cue: `PromptCondition("history", "gender_F")`.
    """

    instruction: str = "history"
    cue: str | None = None

    def __post_init__(self):
        if self.instruction not in INSTRUCTIONS["movies"]:
            raise ConfigError(f"unknown instruction {self.instruction!r}; "
                              f"choose from {list(INSTRUCTIONS['movies'])}")
        if self.cue is not None:
            cue_sentence(self.cue)  # validates the slice id

    @property
    def name(self) -> str:
        """"history", "p1".."p3", or "cue:<slice id>"."""
        if self.cue is None:
            return self.instruction
        return f"cue:{self.cue}" if self.instruction == "history" else f"{self.instruction}+cue:{self.cue}"

    @classmethod
    def from_name(cls, name: str) -> "PromptCondition":
        instruction, _, cue = name.partition("cue:")
        instruction = instruction.rstrip("+") or "history"
        return cls(instruction, cue or None)


HISTORY_ONLY = PromptCondition("history")
PARAPHRASE_CONDITIONS = tuple(PromptCondition(p) for p in PARAPHRASES)


def build_messages(history: Sequence[str], condition: PromptCondition, n: int = N_CANDIDATES, *,
                   domain: str = "movies") -> Conversation:
    """The chat for one user and condition; `history` are display titles, oldest first."""
    if domain not in DOMAINS:
        raise ConfigError(f"unknown domain {domain!r}; choose from {DOMAINS}")
    if n < 1:
        raise ConfigError(f"the list length must be >= 1, got {n}")
    if not history:
        raise ConfigError("the prompt needs a non-empty history")
    lines = []
    if condition.cue is not None:
        lines.append(cue_sentence(condition.cue))
    lines.append(INSTRUCTIONS[domain][condition.instruction])
    body = "\n".join(f"{k}. {title}" for k, title in enumerate(history, 1))
    user = "\n".join(lines) + f"\n\n{HISTORY_HEADER[domain]}\n{body}\n\n" + REQUEST[domain].format(n=n)
    return [{"role": "system", "content": SYSTEM[domain]}, {"role": "user", "content": user}]


# ------------------------------------------------------------------- parsing
_ITEM_LINE = re.compile(
    r"^\s*(?:\(?\d{1,3}\s*[.):\]]|\d{1,3}\s+-|[-*\u2022\u00b7\u2013\u2014+])\s*(?P<title>\S.*?)\s*$")
_YEAR_FIRST = re.compile(r"^(?P<year>(?:18|19|20)\d{2})\s*[\(\[:\-\u2013]\s*(?P<title>.+?)[\)\]]?$")
_YEAR_PAREN = re.compile(r"\((?:18|19|20)\d{2}\)")


def clean_title(text: str, domain: str = "movies") -> str:
    """A list entry reduced to "Title (Year)": markdown, quotes and any text after the year removed.

    For tracks ("music") a dash separates artist and title, so no text after a dash is cut.
    """
    text = text.strip().replace("**", "").replace("__", "").strip()
    m = _YEAR_FIRST.match(text)  # "1994 (Legends of the Fall)" -> "Legends of the Fall (1994)"
    if m:
        inner = m.group("title").strip()
        text = inner if _YEAR_PAREN.search(inner) else f"{inner} ({m.group('year')})"
    text = re.sub(r"^[\"\u201c](.+?)[\"\u201d]", r"\1", text).strip()  # '"Fargo" (1996)' -> 'Fargo (1996)'
    years = list(_YEAR_PAREN.finditer(text))
    if years:
        text = text[: years[0].end()]
    elif domain == "movies":  # "Title - a short reason" / "Title: reason" after a quoted title
        text = re.split(r"\s+[\u2013\u2014]\s+|\s+-\s+(?=[a-z])", text, maxsplit=1)[0]
    text = text.strip().strip("\"\u201c\u201d`").strip()  # single quotes stay: "'Til There Was You"
    return text.rstrip(" .,;:").strip()


def parse_numbered_list(text: str, domain: str = "movies") -> list[str]:
    """Titles of a numbered or bulleted list, in order ("1. Title (Year)", "1) Title", "- Title").

    Lines before and after the list (an introduction, a closing remark) are
    ignored. When no line is numbered or bulleted, lines that each carry a
    "(Year)" are taken as the list. No list at all raises `LLMOutputError`.
    Duplicates are kept (see `dedupe_titles`).
    """
    titles = []
    for line in text.splitlines():
        m = _ITEM_LINE.match(line)
        if m:
            title = clean_title(m.group("title"), domain)
            if title:
                titles.append(title)
    if not titles:
        lines = [line.strip() for line in text.splitlines()]
        plain = [clean_title(line, domain) for line in lines
                 if _YEAR_PAREN.search(line) or _YEAR_FIRST.match(line)]
        plain = [t for t in plain if t]
        if len(plain) >= 2:
            titles = plain
    if not titles:
        raise LLMOutputError("no numbered list of titles in the LLM reply", text)
    return titles


def dedupe_titles(titles: Sequence[str]) -> list[str]:
    """First occurrence of each title (compared after normalisation, year ignored)."""
    seen, out = set(), []
    for t in titles:
        key = normalize_title(t)
        if key and key not in seen:
            seen.add(key)
            out.append(t)
    return out


# ----------------------------------------------------------------- generator
@dataclass
class GeneratedList:
    """One generated candidate list: parsed titles (deduplicated, at most N), the reply and its cost.

    `error` holds the parse error when the reply had no list (then `titles` is
    empty); callers record it rather than lose it.
    """

    condition: str
    titles: list[str]
    text: str
    prompt_tokens: int | None  # None: the LLM's server did not report it (unknown, never 0)
    completion_tokens: int | None
    raw_count: int = 0
    error: str | None = None
    cached: bool = False
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"condition": self.condition, "titles": list(self.titles), "text": self.text,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "raw_count": self.raw_count, "error": self.error}


class LLMListGenerator:
    """Asks an LLM for N-title candidate lists under PromptShift's prompt conditions.

    It returns titles as the LLM wrote them, not catalogue items: matching them
    to catalogue ids is the protocol engine's job
    (`ctrlsim.recommenders.promptshift.engine.PromptShiftEngine`).

    Greedy decoding by default (the paper holds decoding fixed across
    conditions). `max_tokens` defaults to 16 per title + 32, enough for N
    "Title (Year)" lines, and generation stops at line N+1. Tokens of every
    call are charged to the LLM's meter under `meter_key`.
    """

    def __init__(self, llm: LLM, *, n: int = N_CANDIDATES, domain: str = "movies",
                 max_tokens: int | None = None, temperature: float = TEMPERATURE, seed: int | None = None,
                 meter_key: str | None = "promptshift"):
        if n < 1:
            raise ConfigError(f"n must be >= 1, got {n}")
        if domain not in DOMAINS:
            raise ConfigError(f"unknown domain {domain!r}; choose from {DOMAINS}")
        self.llm, self.n, self.domain = llm, int(n), domain
        self.max_tokens = int(max_tokens) if max_tokens is not None else default_max_tokens(self.n)
        self.temperature, self.seed, self.meter_key = float(temperature), seed, meter_key

    @property
    def config(self) -> dict:
        return {"llm": self.llm.identity, "n": self.n, "domain": self.domain, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "seed": self.seed}

    def messages(self, history: Sequence[str], condition: PromptCondition) -> Conversation:
        return build_messages(history, condition, self.n, domain=self.domain)

    def generate(self, requests: Sequence[tuple[Sequence[str], PromptCondition]]) -> list[GeneratedList]:
        """One list per (history titles, condition) request, in one batched chat call."""
        if not requests:
            return []
        convs = [self.messages(h, c) for h, c in requests]
        keys = [self.meter_key] * len(convs) if self.meter_key else None
        replies = self.llm.chat(convs, max_tokens=self.max_tokens, temperature=self.temperature,
                                seed=self.seed, stop=[f"\n{self.n + 1}."], keys=keys)
        out = []
        for (_, cond), reply in zip(requests, replies):
            try:
                parsed = parse_numbered_list(reply.text, self.domain)
                error = None
            except LLMOutputError as exc:
                parsed, error = [], str(exc)
            out.append(GeneratedList(cond.name, dedupe_titles(parsed)[: self.n], reply.text,
                                     reply.prompt_tokens, reply.completion_tokens, len(parsed), error,
                                     reply.cached))
        return out


__all__ = ["DOMAINS", "GeneratedList", "HISTORY_ONLY", "INSTRUCTIONS", "LLMListGenerator", "PARAPHRASES",
           "PARAPHRASE_CONDITIONS", "PromptCondition", "REQUEST", "SYSTEM", "build_messages", "clean_title",
           "cue_sentence", "dedupe_titles", "parse_numbered_list"]
