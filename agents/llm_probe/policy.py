"""`LLMPopulationPolicy`: every live probe of a population step decided in one batched LLM call."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np
from ctrlsim.envs.feedback import NOT_INTERESTED

from ctrlsim.errors import PROBE_FAILURES, LLMOutputError
from ctrlsim.seeding import derive_seed

from ..replies import Decision, decision_schema, parse_decision
from .questions import QuestionHeads

SKIP_REPLY = '{"like": [], "search": ""}'  # the decision taken without asking when a slate is empty


class LLMPopulationPolicy(QuestionHeads):
    """Decides for every live probe of a `PopulationEnv` with one batched `chat` per step.

    agents:   env agent name -> persona (the env's roster, in the same order).
    target:   the target tags (shown when `settings.target_visible`, in steer rounds only where the
              infos carry a "phase": baseline and release prompts have no goal).
    settings: `DecisionSettings`; with `negative_feedback` the json head's actions also carry
              `feedback` (per position 1 = not interested, else 0), which needs an env made with
              `negative_feedback=True`.
    seed:     run seed; each round's sampling seed derives from (seed, round), and when sampling
              (temperature > 0) each probe's from (seed, round, probe id).
    meter:    where each probe's tokens are charged under its `probe_id`.
    """

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
            kwargs["json_schema"] = decision_schema(slate_size, search=self.settings.allow_search,
                                                    buttons=self.buttons)
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
            decision = parse_decision(text, len(shown_ids), buttons=self.buttons)
        except LLMOutputError as exc:
            probe.parse_failures += 1
            if len(probe.failure_examples) < self.MAX_EXAMPLES:
                probe.failure_examples.append(str(exc)[:300])
            decision = Decision(())
        if decision.query and not self.settings.allow_search:
            probe.searches_refused += 1
            decision = replace(decision, query="")
        probe.searches += bool(decision.query)
        self._remember(probe, info, shown_ids, decision)
        likes = np.zeros(slate_size, dtype=np.int8)
        likes[list(decision.likes)] = 1
        action: dict[str, Any] = {"likes": likes, "query": decision.query}
        if self.buttons:  # only where offered, so like-only actions stay as they were
            probe.dismissals += len(decision.not_interested)
            probe.feedback_conflicts += len(decision.conflicts)
            feedback = np.zeros(slate_size, dtype=np.int8)
            feedback[list(decision.not_interested)] = NOT_INTERESTED
            action["feedback"] = feedback
        return action

    # ------------------------------------------------------------------ record
    def probe_stats(self, agent: str) -> dict:
        probe = self.probes[agent]
        stats = {"decisions": probe.decisions, "parse_failures": probe.parse_failures,
                 "searches": probe.searches, "searches_refused": probe.searches_refused,
                 "failure_examples": list(probe.failure_examples)}
        if self.buttons:
            stats |= {"dismissals": probe.dismissals, "feedback_conflicts": probe.feedback_conflicts}
        return stats

    def reply(self, agent: str, round_no: int) -> str | None:
        """The raw decision reply of `agent` in round `round_no` (1-based), None if it was not asked."""
        return self.probes[agent].replies.get(round_no)
