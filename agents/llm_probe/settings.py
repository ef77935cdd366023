"""How LLM probes decide (`DecisionSettings`), the checks on it, and the shared evaluation setting."""
from __future__ import annotations

from dataclasses import dataclass

from ctrlsim.errors import ConfigError

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
    negative_feedback: offer the "json" head the "not interested" button (issue 48): the reply may
                    also list slate positions "not_interested" (docs/responsiveness.md). Offered only
                    where the env takes it (`play_population` turns it off for an env made without
                    `negative_feedback=True`). Off, prompts, schema and actions are the like-only
                    ones. The question heads stay like-only: with them it is a `ConfigError`.
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
    negative_feedback: bool = False

    def __post_init__(self):
        check_decision(self.decision, self.threshold, conversation=self.conversation,
                       negative_feedback=self.negative_feedback)
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
                   conversation: str = "memory", negative_feedback: bool = False) -> None:
    """A `ConfigError` for an unknown head, a threshold outside (0, 1), or a question head asked to
    search, to append conversations or to press the negative-feedback buttons, before any model
    loads. (`DecisionSettings` itself lets a question head carry `allow_search=True`, its default:
    such a head simply never searches; the runners' configs, where a user asks for search, refuse
    the combination.)"""
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
    if not isinstance(negative_feedback, bool):
        raise ConfigError(f"negative_feedback must be True or False, got {negative_feedback!r}")
    if decision != "json" and negative_feedback:
        raise ConfigError(f"decision {decision!r} asks yes/no questions about likes and has no "
                          "negative-feedback buttons; use --decision json with --negative-feedback")


def decision_identity(settings: DecisionSettings) -> dict:
    """The decision head and its threshold, as records, configs and cache keys name them (and
    `negative_feedback: True` where the button is offered; absent otherwise, as before)."""
    identity: dict = {"decision": settings.decision,
                      "threshold": None if settings.decision == "json" else float(settings.threshold)}
    if settings.negative_feedback:
        identity["negative_feedback"] = True
    return identity


# The evaluation setting every Task 1-3 score is measured under, shared by `ctrlsim ctrlbench`
# (every method, `--roster` included) and `ctrlsim evolve`'s evaluation of its super probes, so one
# roster gets one score: M = 2 rounds of memory, greedy decoding, no search (Appendix B).
EVALUATION_MEMORY_ROUNDS = 2
EVALUATION_TEMPERATURE = 0.0
EVALUATION_ALLOW_SEARCH = False
