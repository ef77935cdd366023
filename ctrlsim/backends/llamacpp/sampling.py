"""Next-token choice for one sequence of a llama.cpp parallel context: greedy, or sampled from a seed.

`SampledChooser` is the sampler chain `Llama.create_completion` builds for a call (grammar, top-k
40, typical 1.0, top-p, min-p 0.05, temperature, then a draw seeded with the call's seed), one
chain per sequence, each with its own seed. A sequence's draws therefore depend on its prompt and
its seed only, not on the other sequences decoded beside it (up to the batching noise in the
logits, docs/performance.md).

A grammar is checked on a short list of the highest logits first, not on the whole vocabulary
(151,936 tokens for Qwen2.5, most of a step's time when every candidate is checked). Both give
the same token: after the grammar, top-k keeps the k highest-logit allowed tokens, so when the
short list holds k allowed tokens those are the ones, and the rest of the chain sees them in the
same (descending) order. With top-p off (the default), a short list with fewer than k allowed
tokens also settles the step when every token left out of it lies below the chain's min-p cut
(min_p 0.05: more than ln 20 below the best allowed logit): min-p would remove each of them, so
the chain keeps the same tokens in the same order. This is what makes a schema with a long enum
cheap (the merge's behaviour ids: at a digit only a few tokens are allowed). Otherwise the whole
vocabulary is checked, as llama.cpp does.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ctrlsim.errors import ModelError

# Llama.create_completion's defaults for what ctrlsim does not set (llama-cpp-python 0.3.x).
TOP_K, TYPICAL_P, MIN_P = 40, 1.0, 0.05
# Short lists of highest-logit tokens the grammar checks before the whole vocabulary.
SHORTLISTS = (128, 2048)
# Slack at the min-p window's edge (llama.cpp computes max_logit + logf(min_p) in float32).
WINDOW_MARGIN = 1e-3


class GrammarCheck:
    """One sequence's llama.cpp grammar sampler and the candidate buffer it marks (-inf: not allowed)."""

    def __init__(self, lib, vocab, grammar, n_vocab: int):
        self._lib, self.n_vocab = lib, n_vocab
        self._sampler = lib.llama_sampler_init_grammar(vocab, grammar._grammar.encode("utf-8"),
                                                       grammar._root.encode("utf-8"))
        if not self._sampler:
            raise ModelError("llama.cpp rejected the grammar compiled from the JSON schema")
        self.cells = (lib.llama_token_data * n_vocab)()
        self.view = np.ctypeslib.as_array(self.cells)
        self._all_ids = np.arange(n_vocab, dtype=np.int32)
        self.steps = 0  # tokens accepted
        self.full_vocab_steps = 0  # steps whose short lists held too few allowed tokens
        self.window_steps = 0  # steps a short list settled by the min-p window (fewer than k allowed)

    def check(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Put (ids, logits) in the buffer's first cells, mark what the grammar forbids, return them."""
        size = len(ids)
        cells = self.view[:size]
        cells["id"], cells["logit"], cells["p"] = ids, logits, 0.0
        array = self._lib.llama_token_data_array(data=self.cells, size=size, selected=-1, sorted=False)
        self._lib.llama_sampler_apply(self._sampler, ctypes.byref(array))
        return cells

    def check_all(self, logits: np.ndarray) -> np.ndarray:
        self.full_vocab_steps += 1
        return self.check(self._all_ids, logits)

    def highest_allowed(self, logits: np.ndarray, k: int,
                        window: float | None = None) -> tuple[np.ndarray, bool]:
        """The k highest-logit allowed tokens, highest first, from the short lists (True); else the
        whole vocabulary with what the grammar forbids marked (False).

        `window` (ln of the chain's min-p): a short list also settles the step when it holds fewer
        than k allowed tokens but every token left out of it lies more than the window below the
        best allowed one: min-p then removes each of them, allowed or not, so the short list's
        allowed tokens are all the chain can draw from (returned highest first)."""
        for m in SHORTLISTS:
            if m >= self.n_vocab:
                break
            ids = highest(logits, m)
            cells = self.check(ids, logits[ids])
            allowed = np.flatnonzero(np.isfinite(cells["logit"]))
            if len(allowed) >= k:
                self.view[:k] = cells[allowed[:k]].copy()
                return self.view[:k], True
            # ids are highest first, so the last one is the highest logit left out of the list.
            if window is not None and len(allowed) and \
                    float(logits[ids[-1]]) < float(cells["logit"][allowed[0]]) + window - WINDOW_MARGIN:
                n = len(allowed)
                self.view[:n] = cells[allowed].copy()
                self.window_steps += 1
                return self.view[:n], True
        return self.check_all(logits), False

    def accept(self, token: int) -> None:
        self.steps += 1
        self._lib.llama_sampler_accept(self._sampler, token)

    def close(self) -> None:
        if self._sampler:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None


def highest(logits: np.ndarray, m: int) -> np.ndarray:
    """Ids of the m highest logits, highest first (ties by id, as a stable sort gives them)."""
    top = np.argpartition(logits, -m)[-m:]
    return top[np.lexsort((top, -logits[top]))].astype(np.int32)


class GreedyChooser:
    """Greedy next token for one sequence, optionally restricted by a GBNF grammar.

    With a grammar it first asks whether the unrestricted argmax is allowed (one candidate), as
    llama.cpp's own common sampler does, then the short list, then the whole vocabulary; the token
    is the same as grammar-then-greedy (the allowed argmax).
    """

    def __init__(self, lib, vocab, n_vocab: int, grammar=None):
        self._grammar = GrammarCheck(lib, vocab, grammar, n_vocab) if grammar is not None else None

    def choose(self, context, index: int) -> int:
        """The token after batch row `index` of `context` (a ParallelContext)."""
        logits = context.logits(index, copy=False)
        token = int(np.argmax(logits))
        grammar = self._grammar
        if grammar is None:
            return token
        one = grammar.check(np.array([token], dtype=np.int32), logits[token:token + 1])
        if not np.isfinite(one["logit"][0]):  # the argmax breaks the grammar: the best allowed one
            cells, first = grammar.highest_allowed(logits, 1)
            token = int(cells["id"][0] if first else np.argmax(cells["logit"]))
        grammar.accept(token)
        return token

    def close(self) -> None:
        if self._grammar is not None:
            self._grammar.close()


class SampledChooser:
    """create_completion's sampler chain for one sequence, seeded with that sequence's own seed."""

    def __init__(self, lib, vocab, *, temperature: float, top_p: float, seed: int, grammar=None,
                 n_vocab: int = 0):
        self._lib = lib
        self.grammar: GrammarCheck | None = None
        # With top-p and typical-p off (>= 1: no-ops in llama.cpp), min-p alone decides which of the
        # top-k the chain can draw, so a short list may settle a step with fewer than k allowed.
        self._window = float(np.log(MIN_P)) if top_p >= 1.0 and TYPICAL_P >= 1.0 else None
        self._chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if not self._chain:
            raise ModelError("llama.cpp could not create a sampler chain")
        parts = [lib.llama_sampler_init_top_k(TOP_K), lib.llama_sampler_init_typical(TYPICAL_P, 1),
                 lib.llama_sampler_init_top_p(top_p, 1), lib.llama_sampler_init_min_p(MIN_P, 1),
                 lib.llama_sampler_init_temp(temperature), lib.llama_sampler_init_dist(seed & 0xFFFFFFFF)]
        for part in parts:  # the chain owns (and frees) what is added to it
            lib.llama_sampler_chain_add(self._chain, part)
        try:
            self.grammar = GrammarCheck(lib, vocab, grammar, n_vocab) if grammar is not None else None
        except ModelError:
            self.close()
            raise

    def choose(self, context, index: int) -> int:
        """Apply the chain to batch row `index` of `context`, draw, and accept the token."""
        grammar = self.grammar
        if grammar is None:
            return int(self._lib.llama_sampler_sample(self._chain, context.ctx, index))
        cells, is_sorted = grammar.highest_allowed(context.logits(index, copy=False), TOP_K, self._window)
        array = self._lib.llama_token_data_array(data=grammar.cells, size=len(cells), selected=-1,
                                                 sorted=is_sorted)
        self._lib.llama_sampler_apply(self._chain, ctypes.byref(array))
        token = int(array.data[array.selected].id)
        grammar.accept(token)
        self._lib.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        if self._chain:
            self._lib.llama_sampler_free(self._chain)
            self._chain = None
        if self.grammar is not None:
            self.grammar.close()
