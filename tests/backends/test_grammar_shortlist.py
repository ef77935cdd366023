"""Sampled JSON decoding checks the grammar on a short list of the highest logits first.

The reference is llama.cpp's own chain with the grammar in it, applied by `llama_sampler_sample`
to the whole vocabulary (what `Llama.create_completion` does): the same seeds must draw the
same tokens.
"""
import json

import jsonschema
import numpy as np
import pytest

from ctrlsim.backends.llamacpp import parallel as llamacpp_parallel
from ctrlsim.backends.llamacpp.sampling import (
    MIN_P,
    TOP_K,
    TYPICAL_P,
    GrammarCheck,
    GreedyChooser,
    SampledChooser,
    highest,
)

pytestmark = pytest.mark.llm

PERSONA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40},
                   "bio": {"type": "string", "maxLength": 200},
                   "interests": {"type": "array", "items": {"type": "string", "maxLength": 40},
                                 "maxItems": 3}},
    "required": ["name", "bio", "interests"],
    "additionalProperties": False,
}
CHOICE = {"type": "object", "properties": {"pick": {"enum": ["red", "green", "blue"]}},
          "required": ["pick"], "additionalProperties": False}


class FullVocabularyChain:
    """The reference: one llama.cpp chain, grammar first, applied to every token of the vocabulary."""

    def __init__(self, lib, vocab, *, temperature, top_p, seed, grammar=None, n_vocab=0):
        self._lib = lib
        self._chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        parts = [lib.llama_sampler_init_grammar(vocab, grammar._grammar.encode(), grammar._root.encode())]
        parts += [lib.llama_sampler_init_top_k(TOP_K), lib.llama_sampler_init_typical(TYPICAL_P, 1),
                  lib.llama_sampler_init_top_p(top_p, 1), lib.llama_sampler_init_min_p(MIN_P, 1),
                  lib.llama_sampler_init_temp(temperature), lib.llama_sampler_init_dist(seed)]
        for part in parts:
            lib.llama_sampler_chain_add(self._chain, part)

    def choose(self, context, index):
        return int(self._lib.llama_sampler_sample(self._chain, context.ctx, index))

    def close(self):
        self._lib.llama_sampler_free(self._chain)


def conversations(n):
    topics = ["film noir", "horror films", "musicals", "westerns"]
    return [[{"role": "user", "content": f"Invent a fan of {t}. Reply as JSON with a name, a short bio "
                                         f"and interests."}] for t in topics[:n]]


def sample(llm, monkeypatch, chooser, convs, schema, seeds, max_tokens, top_p=0.95):
    made = []

    def record(*args, **kwargs):
        made.append(chooser(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(llamacpp_parallel, "SampledChooser", record)
    llm.reset_kv()
    replies = llm.chat(convs, max_tokens=max_tokens, temperature=0.9, top_p=top_p, seed=seeds,
                       json_schema=schema)
    return [r.text for r in replies], made


def test_highest_is_a_stable_descending_sort_of_the_top():
    logits = np.array([0.5, 2.0, -1.0, 2.0, 3.0, 0.5, 1.0], dtype=np.float32)
    order = np.argsort(-logits, kind="stable")  # ties keep id order
    for m in range(1, len(logits)):
        ids = highest(logits, m)
        assert logits[ids].tolist() == logits[order[:m]].tolist()
        if logits[order[m - 1]] != logits[order[m]]:  # no tie across the cut: the same ids
            assert ids.tolist() == order[:m].tolist()


@pytest.mark.parametrize("model", ["smol", "qwen05"])
def test_shortlist_draws_what_the_full_vocabulary_chain_draws(model, request, monkeypatch):
    llm = request.getfixturevalue(model)
    convs, seeds = conversations(3), [3, 14, 15]
    fast, choosers = sample(llm, monkeypatch, SampledChooser, convs, PERSONA, seeds, 48)
    reference, _ = sample(llm, monkeypatch, FullVocabularyChain, convs, PERSONA, seeds, 48)
    assert fast == reference
    steps = sum(c.grammar.steps for c in choosers)
    full = sum(c.grammar.full_vocab_steps for c in choosers)
    assert steps >= 3 * 40 and full < steps / 2  # most steps never checked the whole vocabulary
    other, _ = sample(llm, monkeypatch, SampledChooser, convs, PERSONA, [4, 5, 6], 48)
    assert other != fast  # the seeds matter


def test_a_grammar_allowing_few_tokens_falls_back_to_the_whole_vocabulary(smol, monkeypatch):
    conv = [[{"role": "user", "content": "Pick a colour: red, green or blue. Reply as JSON."}]] * 2
    fast, choosers = sample(smol, monkeypatch, SampledChooser, conv, CHOICE, [1, 2], 24)
    reference, _ = sample(smol, monkeypatch, FullVocabularyChain, conv, CHOICE, [1, 2], 24)
    assert fast == reference
    assert all(json.loads(text)["pick"] in {"red", "green", "blue"} for text in fast)
    assert sum(c.grammar.full_vocab_steps for c in choosers) > 0
    for text in fast:
        jsonschema.validate(json.loads(text), CHOICE)


# The merge's reply: behaviour ids from a long enum (at a digit only a few tokens are allowed).
ITEM_IDS = sorted({str(n) for n in range(1, 1683, 7)})
BEHAVIOUR = {"type": "object",
             "properties": {"name": {"type": "string", "maxLength": 40},
                            "behaviour": {"type": "array", "items": {"type": "string", "enum": ITEM_IDS},
                                          "maxItems": 12}},
             "required": ["name", "behaviour"], "additionalProperties": False}


@pytest.mark.parametrize("model", ["smol", "qwen05"])
def test_with_top_p_off_the_min_p_window_settles_steps_and_draws_what_the_full_chain_draws(
        model, request, monkeypatch):
    """Top-p 1 (what the merges use): fewer than k allowed tokens in a short list settle the step
    when everything left out lies below min-p's cut; the draws stay llama.cpp's own."""
    llm = request.getfixturevalue(model)
    convs = [[{"role": "user", "content": f"Invent a {t} fan and list the ids of 8 films they liked, "
                                          f"as JSON with a name and behaviour."}] for t in ("noir", "horror")]
    for schema, seeds in ((BEHAVIOUR, [7, 8]), (CHOICE, [1, 2])):
        fast, choosers = sample(llm, monkeypatch, SampledChooser, convs, schema, seeds, 64, top_p=1.0)
        reference, _ = sample(llm, monkeypatch, FullVocabularyChain, convs, schema, seeds, 64, top_p=1.0)
        assert fast == reference
        window = sum(c.grammar.window_steps for c in choosers)
        assert window > 0 and sum(c.grammar.full_vocab_steps for c in choosers) < window


def test_the_window_is_off_when_top_p_is_on(smol, monkeypatch):
    """With top-p < 1 the kept set depends on every allowed token of the top k, so no window."""
    _, choosers = sample(smol, monkeypatch, SampledChooser, conversations(2), BEHAVIOUR, [1, 2], 32)
    assert sum(c.grammar.window_steps for c in choosers) == 0


class FullVocabularyGreedy:
    """The reference for greedy decoding: the grammar over the whole vocabulary, then the argmax."""

    def __init__(self, lib, vocab, n_vocab, grammar=None):
        self._check = GrammarCheck(lib, vocab, grammar, n_vocab)

    def choose(self, context, index):
        token = int(np.argmax(self._check.check_all(context.logits(index, copy=False))["logit"]))
        self._check.accept(token)
        return token

    def close(self):
        self._check.close()


def test_greedy_json_is_the_allowed_argmax_of_the_whole_vocabulary(smol, monkeypatch):
    def greedy(chooser):
        monkeypatch.setattr(llamacpp_parallel, "GreedyChooser", chooser)
        smol.reset_kv()
        return [r.text for r in smol.chat(conversations(3), max_tokens=40, json_schema=PERSONA)]

    assert greedy(GreedyChooser) == greedy(FullVocabularyGreedy)
