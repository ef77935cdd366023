"""Next-token choice for one sequence of a llama.cpp parallel context: greedy, or sampled from a seed.

`SampledChooser` is the sampler chain `Llama.create_completion` builds for a call (grammar, top-k
40, typical 1.0, top-p, min-p 0.05, temperature, then a draw seeded with the call's seed), one
chain per sequence, each with its own seed. A sequence's draws therefore depend on its prompt and
its seed only, not on the other sequences decoded beside it (up to the batching noise in the
logits, docs/performance.md). The chain applies and accepts a token with llama.cpp's own
`llama_sampler_sample` on the batch row of that sequence.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ctrlsim.errors import ModelError

# Llama.create_completion's defaults for what ctrlsim does not set (llama-cpp-python 0.3.x).
TOP_K, TYPICAL_P, MIN_P = 40, 1.0, 0.05


class GreedyChooser:
    """Greedy next token for one sequence, optionally restricted by a GBNF grammar.

    With a grammar it first asks whether the unrestricted argmax is allowed (one candidate)
    and runs the grammar over the whole vocabulary only when it is not, as llama.cpp's own
    common sampler does; the token is the same as grammar-then-greedy (the allowed argmax).
    """

    def __init__(self, lib, vocab, n_vocab: int, grammar=None):
        self._lib, self._n_vocab = lib, n_vocab
        self._grammar = None
        if grammar is not None:
            self._grammar = lib.llama_sampler_init_grammar(vocab, grammar._grammar.encode("utf-8"),
                                                           grammar._root.encode("utf-8"))
            if not self._grammar:
                raise ModelError("llama.cpp rejected the grammar compiled from the JSON schema")
        self._one = (lib.llama_token_data * 1)()
        self._all = None

    def _apply(self, cells, size: int) -> None:
        array = self._lib.llama_token_data_array(data=cells, size=size, selected=-1, sorted=False)
        self._lib.llama_sampler_apply(self._grammar, ctypes.byref(array))

    def choose(self, context, index: int) -> int:
        """The token after batch row `index` of `context` (a ParallelContext)."""
        logits = context.logits(index, copy=False)
        token = int(np.argmax(logits))
        if self._grammar is None:
            return token
        self._one[0].id, self._one[0].logit, self._one[0].p = token, float(logits[token]), 0.0
        self._apply(self._one, 1)
        if not np.isfinite(self._one[0].logit):  # the argmax breaks the grammar: restrict everything
            if self._all is None:
                self._all = (self._lib.llama_token_data * self._n_vocab)()
            cells = np.ctypeslib.as_array(self._all)
            cells["id"] = np.arange(self._n_vocab)
            cells["logit"] = logits
            cells["p"] = 0.0
            self._apply(self._all, self._n_vocab)
            token = int(np.argmax(cells["logit"]))
        self._lib.llama_sampler_accept(self._grammar, token)
        return token

    def close(self) -> None:
        if self._grammar is not None:
            self._lib.llama_sampler_free(self._grammar)
            self._grammar = None


class SampledChooser:
    """create_completion's sampler chain for one sequence, seeded with that sequence's own seed."""

    def __init__(self, lib, vocab, *, temperature: float, top_p: float, seed: int, grammar=None):
        self._lib = lib
        self._chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if not self._chain:
            raise ModelError("llama.cpp could not create a sampler chain")
        parts = []
        if grammar is not None:
            part = lib.llama_sampler_init_grammar(vocab, grammar._grammar.encode("utf-8"),
                                                  grammar._root.encode("utf-8"))
            if not part:
                self.close()
                raise ModelError("llama.cpp rejected the grammar compiled from the JSON schema")
            parts.append(part)
        parts += [lib.llama_sampler_init_top_k(TOP_K), lib.llama_sampler_init_typical(TYPICAL_P, 1),
                  lib.llama_sampler_init_top_p(top_p, 1), lib.llama_sampler_init_min_p(MIN_P, 1),
                  lib.llama_sampler_init_temp(temperature), lib.llama_sampler_init_dist(seed & 0xFFFFFFFF)]
        for part in parts:  # the chain owns (and frees) what is added to it
            lib.llama_sampler_chain_add(self._chain, part)

    def choose(self, context, index: int) -> int:
        """Apply the chain to batch row `index` of `context`, draw, and accept the token."""
        return int(self._lib.llama_sampler_sample(self._chain, context.ctx, index))

    def close(self) -> None:
        if self._chain:
            self._lib.llama_sampler_free(self._chain)
            self._chain = None
