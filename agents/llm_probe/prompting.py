"""What an LLM probe is shown: its state (persona, memory, counters) and the decision conversations
built from it (`ProbePrompts`, the base of `LLMPopulationPolicy`). The texts are `ctrlsim.agents.prompts`."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ctrlsim.envs.phases import is_steering, steers_away

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset, item_text

from .. import prompts
from ..persona import Persona
from ..replies import Decision
from .settings import DecisionSettings


@dataclass
class RoundMemory:
    round: int
    source: str
    shown: list[str]
    liked: list[str]
    query: str
    dismissed: list[str] = field(default_factory=list)  # marked not interested (with the button)


@dataclass
class LLMProbe:
    """One probe's persona, memory and counters."""

    persona: Persona
    memory: deque = field(default_factory=deque)
    parse_failures: int = 0
    failure_examples: list[str] = field(default_factory=list)
    decisions: int = 0
    searches: int = 0
    searches_refused: int = 0
    replies: dict = field(default_factory=dict)  # round (1-based) -> the raw decision reply
    turns: list = field(default_factory=list)  # "append" mode: the messages after the system text
    turn_rounds: int = 0  # rounds the appended conversation holds
    dismissals: int = 0  # items marked not interested (with the button)
    feedback_conflicts: int = 0  # positions both liked and marked: the like won


def display_item(dataset: Dataset, item_id: str, *, tags: bool = True) -> str:
    """"Title (Year), (Tag, Tag)": the item text without any description (prompts stay short)."""
    row = dataset.items.iloc[dataset.item_index[item_id]]
    return item_text(row["title"], row["year"], row["tags"] if tags else ())


class ProbePrompts:
    """The probes of one population and the conversations they are asked (see `LLMPopulationPolicy`,
    which documents the arguments)."""

    def __init__(self, llm, dataset: Dataset, agents: Mapping[str, Persona], *, target: Sequence[str],
                 settings: DecisionSettings | None = None, seed: int = 0, meter: TokenMeter | None = None):
        settings = settings if settings is not None else DecisionSettings()
        self.llm, self.dataset, self.settings, self.seed = llm, dataset, settings, seed
        self.meter = meter if meter is not None else TokenMeter()
        memory = max(settings.memory_rounds, 1)
        self.probes = {a: LLMProbe(p, deque(maxlen=memory)) for a, p in agents.items()}
        self.target = tuple(target)
        self.nouns = prompts.domain_nouns(dataset.name)
        self.use_schema = settings.constrained and bool(getattr(llm, "supports_json_schema", False))
        self.buttons = settings.negative_feedback  # offer "not interested" (the json head only)

    def system_text(self, slate_size: int, info: Mapping | None = None) -> str:
        """The shared system text; the goal (or its away wording) only where shown and `info` steers."""
        goal = ""
        if self.settings.target_visible and self.target and is_steering(info):
            template = prompts.GOAL_AWAY if steers_away(info) else prompts.GOAL_VISIBLE
            goal = template.format(target=" / ".join(self.target), **self.nouns)
        if self.settings.prompt_variant == "logic":
            goal += prompts.GOAL_LOGIC.format(**self.nouns)
        if self.settings.decision != "json":
            return prompts.DECISION_SYSTEM_QUESTIONS.format(goal=goal, slate_size=slate_size,
                                                            answer_format=prompts.ANSWER_FORMAT, **self.nouns)
        if self.buttons:
            template = prompts.DECISION_SYSTEM_BUTTONS if self.settings.allow_search \
                else prompts.DECISION_SYSTEM_BUTTONS_NO_SEARCH
        else:
            template = prompts.DECISION_SYSTEM if self.settings.allow_search \
                else prompts.DECISION_SYSTEM_NO_SEARCH
        return template.format(goal=goal, slate_size=slate_size, **self.nouns)

    def user_text(self, probe: LLMProbe, info: Mapping, budget: int,
                  template: str = prompts.DECISION_USER) -> str:
        persona = probe.persona
        behaviour = "; ".join(display_item(self.dataset, i) for i in persona.behaviour) or "none yet"
        memory = ""
        if self.settings.memory_rounds and probe.memory:
            memory = prompts.MEMORY_HEADER + "".join(
                prompts.MEMORY_ROUND.format(
                    round=m.round, source=m.source, shown="; ".join(m.shown),
                    liked="; ".join(m.liked) or prompts.MEMORY_NONE,
                    searched=(prompts.MEMORY_SEARCHED.format(query=m.query) if m.query else "")
                    + _buttons_text(m))
                for m in probe.memory)
        slate = "\n".join(f"{n}. {display_item(self.dataset, i)}"
                          for n, i in enumerate(info["slate_item_ids"], start=1)) or "(nothing)"
        return template.format(
            name=persona.name, bio=persona.bio, interests=", ".join(persona.interests) or "-",
            behaviour=behaviour, memory=memory, round=int(info["round"]) + 1, budget=budget,
            source=info.get("slate_source", "recommender"), slate=slate, **self.nouns)

    def round_text(self, info: Mapping, budget: int) -> str:
        """An appended round's user turn: the round and its slate (the persona is already above)."""
        slate = "\n".join(f"{n}. {display_item(self.dataset, i)}"
                          for n, i in enumerate(info["slate_item_ids"], start=1)) or "(nothing)"
        return prompts.APPEND_ROUND.format(round=int(info["round"]) + 1, budget=budget,
                                           source=info.get("slate_source", "recommender"), slate=slate,
                                           **self.nouns)

    def conversation(self, agent: str, info: Mapping, slate_size: int, budget: int) -> list[dict]:
        probe = self.probes[agent]
        system = {"role": "system", "content": self.system_text(slate_size, info)}
        if self.settings.conversation == "append" and probe.turns \
                and probe.turn_rounds < self.settings.append_rounds:
            return [system, *probe.turns, {"role": "user", "content": self.round_text(info, budget)}]
        probe.turns, probe.turn_rounds = [], 0  # (re)start: persona, memory summary, current slate
        return [system, {"role": "user", "content": self.user_text(probe, info, budget)}]

    def _remember(self, probe: LLMProbe, info: Mapping, shown_ids: list[str], decision: Decision) -> None:
        if not self.settings.memory_rounds:
            return
        shown = [display_item(self.dataset, i) for i in shown_ids]
        source = info.get("slate_source", "recommender")
        liked = [display_item(self.dataset, shown_ids[p], tags=False) for p in decision.likes]
        dismissed = [display_item(self.dataset, shown_ids[p], tags=False) for p in decision.not_interested]
        probe.memory.append(RoundMemory(int(info["round"]) + 1, source, shown, liked, decision.query,
                                        dismissed))


def _buttons_text(memory: RoundMemory) -> str:
    """A remembered round's "not interested" marks ("" where none was made, as always without them)."""
    return prompts.MEMORY_DISMISSED.format(items="; ".join(memory.dismissed)) if memory.dismissed else ""
