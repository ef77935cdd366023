"""LLM persona probes (CtrlBench-Rec §3.2 Stage 2, Appendix B, D.2), decided in one batched call.

Each probe is a static persona plus a short-term memory of its last M rounds (the slates it
saw with title and tags, what it liked, skipped and searched) and, by default, the task goal
(`target_visible=False` hides it; the runner records which). Each round it answers with JSON
`{"like": [positions], "search": "query or empty"}`, which becomes the env action. With
`DecisionSettings(negative_feedback=True)` (issue 48) the reply may also press "not interested",
`{"like": [2], "not_interested": [3]}`, which becomes the action's `feedback` (an env made with
`negative_feedback=True` takes it; docs/responsiveness.md).

`LLMPopulationPolicy.act` asks the LLM ONCE for all live probes of a population step
(`llm.chat(list_of_conversations)`); each conversation starts with the same system text
(role, goal, rules, reply format), so prefix caches are reused, and the per-probe persona,
memory and slate follow. Where the runtime supports constrained decoding the reply is held
to a JSON schema; otherwise it is parsed leniently. A reply that still cannot be used (prose,
no "like", out-of-range or repeated positions) makes that probe skip the
round and counts in its `parse_failures`; it never stops the run.

Failures of the call itself follow `ctrlsim.errors`: if the batched call fails with a probe
failure (`PROBE_FAILURES`, e.g. one probe's prompt beyond the context), each probe is retried
alone and those whose own call fails that way are reported for dropping. Any other error --
the server or runtime unavailable (`BackendUnavailableError`), a malformed server reply, a
model that cannot load, a bug -- propagates from `act`, so the episode and its unit fail
(and a rerun retries them) instead of finishing with every probe dropped.

Tokens: each reply's prompt and completion tokens are charged to the probe's stable id
(`Persona.probe_id`) on the meter passed in (the episode's own meter, which the env reads).

The package: `settings` (how probes decide, and its checks), `prompting` (a probe's state and
the conversations it is asked), `questions` (the yes/no question heads), `policy` (the batched
policy). Every name is importable from `ctrlsim.agents.llm_probe` as before.
"""
from __future__ import annotations

from .policy import SKIP_REPLY, LLMPopulationPolicy
from .prompting import LLMProbe, RoundMemory, display_item
from .settings import (
    ANSWERS,
    CONVERSATION_MODES,
    DECISION_HEADS,
    DEFAULT_DECISION,
    DEFAULT_THRESHOLD,
    EVALUATION_ALLOW_SEARCH,
    EVALUATION_MEMORY_ROUNDS,
    EVALUATION_TEMPERATURE,
    PROMPT_VARIANTS,
    DecisionSettings,
    check_decision,
    decision_identity,
)

__all__ = ["ANSWERS", "CONVERSATION_MODES", "DECISION_HEADS", "DEFAULT_DECISION", "DEFAULT_THRESHOLD",
           "EVALUATION_ALLOW_SEARCH", "EVALUATION_MEMORY_ROUNDS", "EVALUATION_TEMPERATURE", "PROMPT_VARIANTS",
           "SKIP_REPLY", "DecisionSettings", "LLMPopulationPolicy", "LLMProbe", "RoundMemory",
           "check_decision", "decision_identity", "display_item"]
