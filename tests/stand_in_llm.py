"""`StandInLLM`: a probe model that loads nothing and plays the user by a rule the test sets.

Question heads (`--decision yesno`/`twostep`) read P(yes) from `_choice_logprobs`: here P(yes) =
`p_target` when the question names an item whose title or tags contain `word`, `p_other` otherwise;
generated text (personas) is one fixed sentence. Two stand-ins with different rules are two probe
models that really play the user differently, so a probe-model comparison over them can fail."""
from __future__ import annotations

import numpy as np

from ctrlsim.backends.llm import LLM, Completion, DigitScores
from ctrlsim.errors import ModelError


class StandInLLM(LLM):
    runtime = "stand-in"

    def __init__(self, name: str, p_target: float, p_other: float, word: str = "War"):
        super().__init__(name)
        self.p_target, self.p_other, self.word = p_target, p_other, word
        self.broken = False  # True: every call fails, as a crashed model server would

    def _generate(self, conversations, params):
        if self.broken:
            raise ModelError(f"{self.model_id}: the stand-in is broken")
        return [Completion("I am a movie fan who enjoys films of many kinds.", 10, 10) for _ in conversations]

    def _digit_logprobs(self, conversations, prefix):
        raise AssertionError("the stand-in answers question heads only")

    def _choice_logprobs(self, conversations, prefix, choices):
        if self.broken:
            raise ModelError(f"{self.model_id}: the stand-in is broken")
        out = []
        for conv in conversations:
            question = conv[-1]["content"].rsplit("Question:", 1)[-1].split("?")[0]
            p = self.p_target if self.word in question else self.p_other
            out.append(DigitScores(np.log([p, 1 - p]), 100))
        return out
