"""LLM persona probes (CtrlBench-Rec §3.2 Stage 2, Appendix B, D.2), decided in one batched call.

Each probe is a static persona plus a short-term memory of its last M rounds (the slates it
saw with title and tags, what it liked, skipped and searched) and, by default, the task goal
(`target_visible=False` hides it; the runner records which). Each round it answers with JSON
`{"like": [positions], "search": "query or empty"}`, which becomes the env action.

`LLMPopulationPolicy.act` asks the LLM ONCE for all live probes of a population step
(`llm.chat(list_of_conversations)`); each conversation starts with the same system text
(role, goal, rules, reply format), so prefix caches are reused, and the per-probe persona,
memory and slate follow. Where the runtime supports constrained decoding the reply is held
to a JSON schema; otherwise it is parsed leniently. A reply that still cannot be used (prose,
no "like", out-of-range or repeated positions) makes that probe skip the round and counts
in its `parse_failures`; it never stops the run.

Failures of the call itself follow `ctrlsim.errors`: if the batched call fails with a probe
failure (`PROBE_FAILURES`, e.g. one probe's prompt beyond the context), each probe is retried
alone and those whose own call fails that way are reported for dropping. Any other error --
the server or runtime unavailable (`BackendUnavailableError`), a malformed server reply, a
model that cannot load, a bug -- propagates from `act`, so the episode and its unit fail
(and a rerun retries them) instead of finishing with every probe dropped.

Tokens: each reply's prompt and completion tokens are charged to the probe's stable id
(`Persona.probe_id`) on the meter passed in (the episode's own meter, which the env reads).
"""
from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from ctrlsim.envs.phases import is_steering, steers_away

from ctrlsim.backends import TokenMeter
from ctrlsim.data import Dataset, item_text
from ctrlsim.errors import PROBE_FAILURES, ConfigError, LLMOutputError
from ctrlsim.seeding import derive_rng, derive_seed

from . import prompts
from .persona import Persona
from .replies import Decision, decision_schema, parse_decision

SKIP_REPLY = '{"like": [], "search": ""}'  # the decision taken without asking when a slate is empty

PROMPT_VARIANTS = ("default", "logic")
CONVERSATION_MODES = ("memory", "append")
# How a probe turns a slate into likes (issue 42): "json" generates `{"like": [...]}` (the paper-like
# setting); "yesno" asks one yes/no question per item and reads P(yes) from the next-token
# probabilities; "twostep" asks two per item (fits the persona? one of the goal's items?) and likes
# an item when both pass. docs/probe-validity.md has the measurements that chose the default.
DECISION_HEADS = ("json", "yesno", "twostep")
DEFAULT_DECISION = "twostep"
# P(yes) at or above which a question head likes an item: chosen on the development targets for
# qwen2.5-0.5b with twostep (benchmarks/probe_validity.py, docs/probe-validity.md).
DEFAULT_THRESHOLD = 0.4
ANSWERS = ("yes", "no")


@dataclass(frozen=True)
class DecisionSettings:
    """How LLM probes decide.

    memory_rounds:  M, rounds of short-term memory shown in the prompt.
    target_visible: whether the goal (the target tags) is in the prompt.
    prompt_variant: "default", or "logic" (Appendix D.8: favour long-tail items).
    temperature:    sampling temperature; 0 (greedy) by default because llama.cpp decodes greedy
                    batches as parallel sequences over the shared prefix (several times faster on
                    CPU); the paper's agents sample at 1.0 (`--preset paper`), seeded per round and probe.
    max_tokens:     reply budget (a decision is ~15-30 tokens of JSON).
    constrained:    use JSON-schema decoding where the runtime supports it.
    allow_search:   offer the search tool. Off, the prompt and schema name only likes (Appendix B's
                    a_t in L_t or a skip) and a query the model writes anyway is dropped and counted
                    (`searches_refused`), so the probe can only steer through the recommender.
    conversation:   "memory" (the paper-like setting): each round is a fresh [system, user] prompt with
                    the persona, the last M rounds summarised and the current slate. "append": the
                    probe's conversation grows by turns (the round's slate as a user turn, its reply as
                    an assistant turn), so with KV prefix reuse a round evaluates only its new tokens;
                    the probe then sees every earlier slate and its own JSON replies, not a summary.
    append_rounds:  rounds an appended conversation holds before it starts again as a memory-style
                    prompt (keeps prompts within the context; the restart re-evaluates one prompt).
    decision:       the decision head, one of `DECISION_HEADS`: "json" (one generated reply per slate)
                    or a question head ("yesno", "twostep": yes/no questions per item read from the
                    next-token probabilities, no generation; no search; "memory" conversations).
    threshold:      a question head likes an item when P(yes) >= threshold (each question's, for
                    "twostep"). At temperature T > 0 it likes with probability
                    sigmoid((logit P(yes) - logit threshold) / T) instead, seeded per round, probe
                    and item, which tends to the threshold rule as T -> 0.
    """

    memory_rounds: int = 2
    target_visible: bool = True
    prompt_variant: str = "default"
    temperature: float = 0.0
    max_tokens: int = 48
    constrained: bool = True
    allow_search: bool = True
    conversation: str = "memory"
    append_rounds: int = 10
    decision: str = "json"
    threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self):
        check_decision(self.decision, self.threshold, conversation=self.conversation)
        if self.conversation not in CONVERSATION_MODES:
            raise ConfigError(f"conversation must be one of {CONVERSATION_MODES}, got {self.conversation!r}")
        if self.append_rounds < 1:
            raise ConfigError(f"append_rounds must be >= 1, got {self.append_rounds}")
        if self.memory_rounds < 0:
            raise ConfigError(f"memory_rounds must be >= 0, got {self.memory_rounds}")
        if self.prompt_variant not in PROMPT_VARIANTS:
            raise ConfigError(f"prompt_variant must be one of {PROMPT_VARIANTS}, got {self.prompt_variant!r}")
        if self.temperature < 0 or self.max_tokens < 8:
            raise ConfigError(f"temperature must be >= 0 and max_tokens >= 8, got {self.temperature}, "
                              f"{self.max_tokens}")


def check_decision(decision: str, threshold: float, *, allow_search: bool = False,
                   conversation: str = "memory") -> None:
    """A `ConfigError` for an unknown head, a threshold outside (0, 1), or a question head asked to
    search or to append conversations, before any model loads. (`DecisionSettings` itself lets a
    question head carry `allow_search=True`, its default: such a head simply never searches; the
    runners' configs, where a user asks for search, refuse the combination.)"""
    if decision not in DECISION_HEADS:
        raise ConfigError(f"decision must be one of {DECISION_HEADS}, got {decision!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not 0.0 < float(threshold) < 1.0:
        raise ConfigError("decision threshold must be a probability strictly between 0 and 1, "
                          f"got {threshold!r}")
    if decision != "json" and allow_search:
        raise ConfigError(f"decision {decision!r} asks yes/no questions and has no search tool; "
                          "use --decision json to allow search")
    if decision != "json" and conversation != "memory":
        raise ConfigError(f"decision {decision!r} needs conversation 'memory' (got {conversation!r})")


def decision_identity(settings: "DecisionSettings") -> dict:
    """The decision head and its threshold, as records, configs and cache keys name them."""
    return {"decision": settings.decision,
            "threshold": None if settings.decision == "json" else float(settings.threshold)}


# The evaluation setting every Task 1-3 score is measured under, shared by `ctrlsim ctrlbench`
# (every method, `--roster` included) and `ctrlsim evolve`'s evaluation of its super probes, so one
# roster gets one score: M = 2 rounds of memory, greedy decoding, no search (Appendix B).
EVALUATION_MEMORY_ROUNDS = 2
EVALUATION_TEMPERATURE = 0.0
EVALUATION_ALLOW_SEARCH = False


@dataclass
class RoundMemory:
    round: int
    source: str
    shown: list[str]
    liked: list[str]
    query: str


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


def display_item(dataset: Dataset, item_id: str, *, tags: bool = True) -> str:
    """"Title (Year), (Tag, Tag)": the item text without any description (prompts stay short)."""
    row = dataset.items.iloc[dataset.item_index[item_id]]
    return item_text(row["title"], row["year"], row["tags"] if tags else ())


class LLMPopulationPolicy:
    """Decides for every live probe of a `PopulationEnv` with one batched `chat` per step.

    agents:   env agent name -> persona (the env's roster, in the same order).
    target:   the target tags (shown when `settings.target_visible`, in steer rounds only where the
              infos carry a "phase": baseline and release prompts have no goal).
    seed:     run seed; each round's sampling seed derives from (seed, round), and when sampling
              (temperature > 0) each probe's from (seed, round, probe id).
    meter:    where each probe's tokens are charged under its `probe_id`.
    """

    MAX_EXAMPLES = 3  # failed replies kept per probe, for the record

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

    # ------------------------------------------------------------------ prompts
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
                    searched=prompts.MEMORY_SEARCHED.format(query=m.query) if m.query else "")
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

    # ------------------------------------------------------------------ acting
    def act(self, observations: Mapping[str, dict], infos: Mapping[str, dict], *, slate_size: int,
            budget: int) -> tuple[dict[str, dict], dict[str, str]]:
        """Actions for the given agents, and agent -> reason for those whose LLM call failed with a
        probe failure (`PROBE_FAILURES`); any other error of the call propagates."""
        agents = list(observations)
        if not agents:
            return {}, {}
        round_no = int(infos[agents[0]]["round"])
        if self.settings.decision != "json":
            return self._act_questions(agents, infos, slate_size, budget, round_no)
        actions = {}
        convs = {a: self.conversation(a, infos[a], slate_size, budget) for a in agents}
        for agent in [a for a in agents if not infos[a]["slate_item_ids"]]:
            # Nothing to choose from (a search found nothing): skip without asking the LLM.
            actions[agent] = self._decide(agent, SKIP_REPLY, infos[agent], slate_size)
            self._append_turn(agent, convs[agent], SKIP_REPLY)
        asking = [a for a in agents if a not in actions]
        completions, failed = self._chat(asking, [convs[a] for a in asking], slate_size, round_no) \
            if asking else ({}, {})
        for agent, completion in completions.items():
            self.meter.add(completion.prompt_tokens, completion.completion_tokens,
                           key=self.probes[agent].persona.probe_id, cached=completion.cached)
            self.probes[agent].replies[int(infos[agent]["round"]) + 1] = completion.text
            actions[agent] = self._decide(agent, completion.text, infos[agent], slate_size)
            self._append_turn(agent, convs[agent], completion.text)
        return actions, failed

    # ------------------------------------------------------------------ question heads
    def questions(self, agent: str, info: Mapping, slate_size: int, budget: int) -> list[list[dict]]:
        """The head's yes/no conversations for `agent`'s slate, item by item (for "twostep" the fit
        question, then the goal question where the goal is shown): all share one prefix."""
        probe = self.probes[agent]
        system = {"role": "system", "content": self.system_text(slate_size, info)}
        context = self.user_text(probe, info, budget, prompts.DECISION_CONTEXT)
        asks = [template for _, template in self._question_templates(info)]
        target = " / ".join(self.target)
        out = []
        for n, item in enumerate(info["slate_item_ids"], start=1):
            text = display_item(self.dataset, item)
            for ask in asks:
                question = ask.format(position=n, item=text, target=target, **self.nouns)
                out.append([system, {"role": "user", "content": context + question}])
        return out

    def _question_templates(self, info: Mapping | None = None) -> tuple[tuple[str, str], ...]:
        """(kind, template) of each question asked per item, in order; the kind names its logged P."""
        if self.settings.decision == "yesno":
            return (("like", prompts.QUESTION_LIKE),)
        fit = ("fit", prompts.QUESTION_FIT)
        goal_shown = self.settings.target_visible and bool(self.target) and is_steering(info)
        goal = ("goal", prompts.QUESTION_AVOID if steers_away(info) else prompts.QUESTION_GOAL)
        return (fit, goal) if goal_shown else (fit,)

    def _act_questions(self, agents: list[str], infos: Mapping[str, dict], slate_size: int, budget: int,
                       round_no: int) -> tuple[dict[str, dict], dict[str, str]]:
        """Each live probe's questions in one `choose` call of its own: its questions share its whole
        context (persona, goal, memory, slate), which one batch across probes would share only up to
        the system text; a probe whose call fails with a probe failure is reported."""
        actions: dict[str, dict] = {}
        failed: dict[str, str] = {}
        purpose = decision_identity(self.settings)
        for a in agents:
            convs = self.questions(a, infos[a], slate_size, budget)
            try:
                reading = self.llm.choose(convs, choices=ANSWERS, purpose=purpose) if convs else None
            except PROBE_FAILURES as exc:
                failed[a] = f"LLM call failed: {type(exc).__name__}: {exc}"
                continue
            p_yes = reading.probabilities[:, 0] if reading is not None else np.empty(0)
            if reading is not None:
                tokens = reading.prompt_tokens
                self.meter.add(None if any(t is None for t in tokens) else sum(tokens), len(tokens),
                               key=self.probes[a].persona.probe_id, cached=all(reading.cached))
            actions[a] = self._decide_questions(a, np.asarray(p_yes, dtype=float), infos[a], slate_size,
                                                round_no)
        return actions, failed

    def question_likes(self, p_yes: np.ndarray, n_items: int, draws: np.ndarray | None = None) -> np.ndarray:
        """Liked flags per item from the head's P(yes) (item-major; "twostep": fit then goal per item):
        P(yes) >= threshold for every question of the item, or at T > 0 a draw per question under
        sigmoid((logit P - logit threshold) / T)."""
        per_item = np.asarray(p_yes, dtype=float).reshape(n_items, -1) if n_items else np.empty((0, 1))
        if draws is None or self.settings.temperature <= 0:
            passed = per_item >= self.settings.threshold
        else:
            logit = np.log(np.clip(per_item, 1e-12, 1.0)) - np.log(np.clip(1.0 - per_item, 1e-12, 1.0))
            edge = np.log(self.settings.threshold) - np.log1p(-self.settings.threshold)
            chance = 1.0 / (1.0 + np.exp(-(logit - edge) / self.settings.temperature))
            passed = draws.reshape(per_item.shape) < chance
        return passed.all(axis=1) & np.isfinite(per_item).all(axis=1)

    def _decide_questions(self, agent: str, p_yes: np.ndarray, info: Mapping, slate_size: int,
                          round_no: int) -> dict:
        probe = self.probes[agent]
        shown_ids = list(info["slate_item_ids"])
        probe.decisions += 1
        draws = None
        if self.settings.temperature > 0 and p_yes.size:
            rng = derive_rng(self.seed, "question-draws", round_no, probe.persona.probe_id)
            draws = rng.random(p_yes.size)
        liked = self.question_likes(p_yes, len(shown_ids), draws)
        if p_yes.size and not np.isfinite(p_yes).all():  # no mass on yes or no: that item is not liked
            probe.parse_failures += 1
            if len(probe.failure_examples) < self.MAX_EXAMPLES:
                probe.failure_examples.append("no probability on 'yes' or 'no' for some question")
        kinds = [kind for kind, _ in self._question_templates(info)]
        per_item = p_yes.reshape(len(shown_ids), -1) if shown_ids else np.empty((0, len(kinds)))
        probe.replies[int(info["round"]) + 1] = json.dumps(
            {f"p_{kind}": [float(x) if np.isfinite(x) else None for x in per_item[:, k]]
             for k, kind in enumerate(kinds)})
        decision = Decision(tuple(int(i) for i in np.flatnonzero(liked)))
        self._remember(probe, info, shown_ids, decision)
        likes = np.zeros(slate_size, dtype=np.int8)
        likes[list(decision.likes)] = 1
        return {"likes": likes, "query": ""}

    def _append_turn(self, agent: str, conversation: list[dict], reply: str) -> None:
        """"append" mode: the round's prompt and the probe's reply become its conversation so far."""
        if self.settings.conversation == "append":
            probe = self.probes[agent]
            probe.turns = [*conversation[1:], {"role": "assistant", "content": reply}]
            probe.turn_rounds += 1

    def _seeds(self, agents: list[str], round_no: int) -> list[int]:
        """Each agent's sampling seed this round. Sampling (temperature > 0): the probe's own seed,
        from (run seed, round, probe id), so its draw replays and does not depend on which probes
        share the batch. Greedy: the round's one seed (what greedy replies were cached under)."""
        if self.settings.temperature > 0:
            return [derive_seed(self.seed, "decision-round", round_no, self.probes[a].persona.probe_id)
                    for a in agents]
        return [derive_seed(self.seed, "decision-round", round_no)] * len(agents)

    def _chat(self, agents: list[str], convs: list[list[dict]], slate_size: int, round_no: int):
        kwargs: dict[str, Any] = {"max_tokens": self.settings.max_tokens,
                                  "temperature": self.settings.temperature}
        if self.use_schema:
            kwargs["json_schema"] = decision_schema(slate_size, search=self.settings.allow_search)
        seeds = self._seeds(agents, round_no)
        # One int when every probe shares the seed (greedy): the keys of replies cached before.
        batch_seed: int | list[int] = seeds if self.settings.temperature > 0 else seeds[0]
        try:
            return dict(zip(agents, self.llm.chat(convs, seed=batch_seed, **kwargs))), {}
        except PROBE_FAILURES:
            pass  # one probe's own failure: find out which by retrying one by one
        # Anything else (server unavailable, bad server reply, a bug) has propagated: the step fails.
        done, failed = {}, {}
        for agent, conv, seed in zip(agents, convs, seeds):
            try:
                done[agent] = self.llm.chat([conv], seed=seed, **kwargs)[0]
            except PROBE_FAILURES as exc:
                failed[agent] = f"LLM call failed: {type(exc).__name__}: {exc}"
        return done, failed

    def _decide(self, agent: str, text: str, info: Mapping, slate_size: int) -> dict:
        probe = self.probes[agent]
        shown_ids = list(info["slate_item_ids"])
        probe.decisions += 1
        try:
            decision = parse_decision(text, len(shown_ids))
        except LLMOutputError as exc:
            probe.parse_failures += 1
            if len(probe.failure_examples) < self.MAX_EXAMPLES:
                probe.failure_examples.append(str(exc)[:300])
            decision = Decision(())
        if decision.query and not self.settings.allow_search:
            probe.searches_refused += 1
            decision = Decision(decision.likes)
        probe.searches += bool(decision.query)
        self._remember(probe, info, shown_ids, decision)
        likes = np.zeros(slate_size, dtype=np.int8)
        likes[list(decision.likes)] = 1
        return {"likes": likes, "query": decision.query}

    def _remember(self, probe: LLMProbe, info: Mapping, shown_ids: list[str], decision: Decision) -> None:
        if not self.settings.memory_rounds:
            return
        shown = [display_item(self.dataset, i) for i in shown_ids]
        source = info.get("slate_source", "recommender")
        liked = [display_item(self.dataset, shown_ids[p], tags=False) for p in decision.likes]
        probe.memory.append(RoundMemory(int(info["round"]) + 1, source, shown, liked, decision.query))

    # ------------------------------------------------------------------ record
    def probe_stats(self, agent: str) -> dict:
        probe = self.probes[agent]
        return {"decisions": probe.decisions, "parse_failures": probe.parse_failures,
                "searches": probe.searches, "searches_refused": probe.searches_refused,
                "failure_examples": list(probe.failure_examples)}

    def reply(self, agent: str, round_no: int) -> str | None:
        """The raw decision reply of `agent` in round `round_no` (1-based), None if it was not asked."""
        return self.probes[agent].replies.get(round_no)
