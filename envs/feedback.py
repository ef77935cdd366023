"""Explicit negative feedback in an action (issue 48): "not interested", "dislike" and "block".

Envs made with `negative_feedback=True` add two keys to the action dict:

  feedback  one entry per slate position: 0 nothing, 1 not interested, 2 dislike (a position
            both liked and given negative feedback is an `InvalidAction`);
  block     0 nothing, or j >= 1 to block the catalogue's j-th tag (`tags[j - 1]`, the env's
            `block_tags`), "don't recommend this"; the tag's name is accepted too.

The black box sees the events in every later `UserState` (`not_interested`, `disliked`,
`blocked_tags`); what it does with them is its own `negative_feedback`. Without the option the
action space and everything recorded are as before.

The spaces' `sample()` gives no feedback (zeros, no block) unless a mask is passed, as the query
space gives no search: a random probe that marked random positions would contradict its own
random likes, and one that blocked a random tag every round would block the catalogue away.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from gymnasium import spaces

from ctrlsim.errors import InvalidAction

NOTHING, NOT_INTERESTED, DISLIKE = 0, 1, 2
FEEDBACK_KINDS = {NOT_INTERESTED: "not_interested", DISLIKE: "dislike"}
FEEDBACK_KEYS = ("feedback", "block")


@dataclass(frozen=True)
class Feedback:
    """One action's negative feedback: slate positions marked not interested or disliked, and the
    tag blocked (None: none)."""

    not_interested: tuple[int, ...] = ()
    disliked: tuple[int, ...] = ()
    block: str | None = None

    def __bool__(self) -> bool:
        return bool(self.not_interested or self.disliked or self.block)


NO_FEEDBACK = Feedback()


class FeedbackSpace(spaces.MultiDiscrete):
    """Per slate position 0 (nothing), 1 (not interested) or 2 (dislike); `sample()` gives zeros."""

    def __init__(self, slate_size: int, seed: int | np.random.Generator | None = None):
        super().__init__(np.full(int(slate_size), 3, dtype=np.int64), seed=seed)

    def sample(self, mask=None, probability=None) -> np.ndarray:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        return np.zeros(self.shape, dtype=self.dtype)


class BlockSpace(spaces.Discrete):
    """0 (nothing) or j = the j-th of `tags` blocked; `sample()` gives 0."""

    def __init__(self, tags: Sequence[str], seed: int | np.random.Generator | None = None):
        self.tags = tuple(str(t) for t in tags)
        super().__init__(len(self.tags) + 1, seed=seed)

    def sample(self, mask=None, probability=None) -> np.int64:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        return np.int64(0)


def feedback_spaces(slate_size: int, tags: Sequence[str]) -> dict[str, spaces.Space]:
    return {"feedback": FeedbackSpace(slate_size), "block": BlockSpace(tags)}


def _codes(values: object, slate_size: int) -> list[int]:
    """`feedback` as ints 0, 1 or 2 per position, checked before any cast (floats only exact)."""
    raw = values.tolist() if isinstance(values, np.ndarray) else values
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence):
        raise InvalidAction(f"'feedback' must be a sequence of {slate_size} codes (0 nothing, 1 not "
                            f"interested, 2 dislike), got {values!r}")
    if len(raw) != slate_size:
        raise InvalidAction(f"'feedback' must have {slate_size} entries (one per slate position), got "
                            f"{len(raw)}: {values!r}")
    out = []
    for pos, value in enumerate(raw):
        ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and float(value) in (0, 1, 2)
        if not ok:
            raise InvalidAction(f"'feedback' must hold 0 (nothing), 1 (not interested) or 2 (dislike); "
                                f"position {pos} is {value!r} in {values!r}")
        out.append(int(value))
    return out


def check_feedback(action: Mapping, likes: np.ndarray, tags: Sequence[str]) -> Feedback:
    """The negative feedback of a well-formed action (`NO_FEEDBACK` without the keys); an
    `InvalidAction` naming the problem otherwise."""
    codes = _codes(action["feedback"], len(likes)) if action.get("feedback") is not None else []
    both = [pos for pos, code in enumerate(codes) if code and likes[pos]]
    if both:
        raise InvalidAction(f"slate position(s) {both} are both liked and given negative feedback")
    block = action.get("block")
    if block is None or (not isinstance(block, str) and not isinstance(block, bool)
                         and isinstance(block, numbers.Integral) and int(block) == 0):
        tag = None
    elif isinstance(block, str):
        if block not in tags:
            raise InvalidAction(f"'block' names an unknown tag {block!r}; known tags: {list(tags)[:25]}")
        tag = block
    elif isinstance(block, numbers.Integral) and not isinstance(block, bool) and 1 <= int(block) <= len(tags):
        tag = tags[int(block) - 1]
    else:
        raise InvalidAction(f"'block' must be 0 (nothing), a tag index in 1..{len(tags)} or a tag name, "
                            f"got {block!r}")
    return Feedback(tuple(p for p, c in enumerate(codes) if c == NOT_INTERESTED),
                    tuple(p for p, c in enumerate(codes) if c == DISLIKE), tag)
