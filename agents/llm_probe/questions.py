"""The question heads of LLM probes ("yesno", "twostep"; issue 42): yes/no questions per slate item,
read from the next-token probabilities instead of a generated reply. Like-only: no search, no
negative-feedback buttons (`check_decision` refuses both)."""
from __future__ import annotations

import json
from typing import Mapping

import numpy as np
from ctrlsim.envs.phases import is_steering, steers_away

from ctrlsim.errors import PROBE_FAILURES
from ctrlsim.seeding import derive_rng

from .. import prompts
from ..replies import Decision
from .prompting import ProbePrompts, display_item
from .settings import ANSWERS, decision_identity


class QuestionHeads(ProbePrompts):
    """`LLMPopulationPolicy`'s question heads (its `act` sends a question head's probes here)."""

    MAX_EXAMPLES = 3  # failed replies kept per probe, for the record

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
        return np.asarray(passed.all(axis=1) & np.isfinite(per_item).all(axis=1), dtype=bool)

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
