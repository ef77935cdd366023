"""Next-token scoring arithmetic shared by every runtime: which token ids spell a digit or an answer
word, log-probs from a logits row, a rating as the expected digit, answer probabilities
renormalised over the answers, and SteerEval's first-number parser."""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from ctrlsim.errors import ModelError

RATING_DIGITS = tuple(str(d) for d in range(6))


def expected_rating(logprobs: np.ndarray) -> float:
    """Expected digit under the distribution renormalised over the digit tokens."""
    logprobs = np.asarray(logprobs, dtype=np.float64)
    if not np.isfinite(logprobs).any():
        return float("nan")
    p = np.exp(logprobs - np.max(logprobs))
    p /= p.sum()
    return float(np.dot(p, np.arange(len(p))))


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_first_number(text: str) -> float | None:
    """SteerEval's parser: the first number in the reply, or None."""
    match = _NUMBER.search(text)
    return float(match.group()) if match else None


def _single_tokens(tokenize, forms) -> list[int]:
    """The ids of the forms (each with and without a leading space) that are one token each."""
    variants = set()
    for form in forms:
        for text in (form, " " + form):
            toks = tokenize(text)
            if len(toks) == 1:
                variants.add(toks[0])
    return sorted(variants)


def digit_token_ids(tokenize, digits=RATING_DIGITS) -> list[list[int]]:
    """Token ids that spell each digit on its own (with and without a leading space)."""
    ids = []
    for d in digits:
        variants = _single_tokens(tokenize, (d,))
        if not variants:
            raise ModelError(f"the tokenizer has no single token for digit {d!r}; digit rating is impossible")
        ids.append(variants)
    return ids


def choice_token_ids(tokenize, choices: Sequence[str]) -> list[list[int]]:
    """Token ids that spell each answer word on its own: as given, lower-case, capitalised, each with
    and without a leading space (a yes/no answer arrives as "Yes", " yes", ...); a word no variant
    spells as one token is an error, so a reading never silently drops an answer."""
    ids = []
    for word in choices:
        variants = _single_tokens(tokenize, sorted({word, word.lower(), word.capitalize()}))
        if not variants:
            raise ModelError(f"the tokenizer has no single token for the answer {word!r}")
        ids.append(variants)
    if len({i for v in ids for i in v}) != sum(len(v) for v in ids):
        raise ModelError(f"the answers {list(choices)} share a token; their probabilities cannot be "
                         "told apart")
    return ids


def choice_probabilities_from_logprobs(logprobs: np.ndarray) -> np.ndarray:
    """Each answer's probability renormalised over the answers (rows of log-probs in, rows out)."""
    logprobs = np.atleast_2d(np.asarray(logprobs, dtype=np.float64))
    top = np.max(logprobs, axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    p = np.exp(logprobs - top)
    total = p.sum(axis=1, keepdims=True)
    return np.divide(p, total, out=np.full_like(p, np.nan), where=total > 0)


def digit_logprobs_from_logits(logits: np.ndarray, digit_ids: list[list[int]]) -> np.ndarray:
    """log P(digit) for each digit (summing its token variants) from a logits row."""
    logits = np.asarray(logits, dtype=np.float64)
    top = logits.max()
    log_z = top + np.log(np.exp(logits - top).sum())
    out = np.empty(len(digit_ids))
    for k, ids in enumerate(digit_ids):
        vals = logits[ids]
        m = vals.max()
        out[k] = m + np.log(np.exp(vals - m).sum()) - log_z
    return out
