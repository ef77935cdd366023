"""Parallel sequences in one llama.cpp context: a shared prefix once, many continuations side by side.

llama.cpp's own batching, as in its `batched` and `parallel` examples: one context
with several sequence ids over a unified KV cache. Sequence 0 holds the common
prefix of a group of prompts (kept between calls, so the next group re-evaluates
only what differs); each prompt runs on a worker sequence that starts as a copy
of it (`llama_memory_seq_cp` shares the prefix's cells, nothing is recomputed),
and the workers' tokens go through one `llama_batch` per decode step. A batch
with more prompts than worker sequences, or more tokens than the KV cache holds,
is split into groups that run one after another.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ctrlsim.errors import ModelError


def shared_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


@dataclass
class Group:
    """Prompts decoded together: their indices and the prefix they share on sequence 0."""

    members: list[int]
    prefix_length: int


def plan_groups(token_lists: list[list[int]], workers: int, capacity: int,
                reserve: list[int] | None = None) -> list[Group]:
    """Split prompts (in sorted token order, so shared prefixes sit together) into groups.

    A group has at most `workers` prompts and fits the KV cache: its prefix plus every
    member's suffix and `reserve` generated tokens stay within `capacity` cells. Each
    member keeps at least one suffix token, whose logits are the ones read.
    """
    reserve = reserve or [0] * len(token_lists)
    order = sorted(range(len(token_lists)), key=lambda i: token_lists[i])
    groups: list[Group] = []
    members: list[int] = []
    prefix = 0
    for i in order:
        trial = members + [i]
        # In sorted order the common prefix of a run is that of its first and last member.
        shared = shared_prefix_length(token_lists[trial[0]], token_lists[i])
        shared = min(shared, min(len(token_lists[j]) for j in trial) - 1)
        cells = shared + sum(len(token_lists[j]) - shared + reserve[j] for j in trial)
        if members and (len(trial) > workers or cells > capacity):
            groups.append(Group(members, prefix))
            members, prefix = [i], len(token_lists[i]) - 1
        else:
            members, prefix = trial, shared
    if members:
        groups.append(Group(members, prefix))
    return groups


@dataclass
class Run:
    """Tokens to append to one sequence; `key` names whose logits the last one gives (None: no logits)."""

    seq: int
    tokens: list[int]
    start: int
    key: int | None = None


@dataclass
class Reply:
    """One generated continuation, in the same terms as llama-cpp-python's create_completion."""

    tokens: list[int] = field(default_factory=list)
    text: bytes = b""
    finish_reason: str = "length"
    done: bool = False


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

    def choose(self, logits: np.ndarray) -> int:
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


class ParallelContext:
    """A second llama.cpp context on an already loaded model, with `n_seq` sequences."""

    def __init__(self, llama, *, n_seq: int, n_ctx: int, n_batch: int, n_threads: int):
        import llama_cpp
        from llama_cpp import _internals

        if n_seq < 2:
            raise ModelError(f"a parallel context needs at least 2 sequences (prefix + worker), got {n_seq}")
        self._lib = llama_cpp
        self._llama = llama  # keeps the model alive as long as this context
        # Start from the sequential context's settings (flash attention, KV types) so logits agree.
        params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, min(n_batch, 512)
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = True  # all sequences share one pool of cells, so copied prefixes cost nothing
        params.no_perf = True
        try:
            self._ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        except ValueError as exc:
            raise ModelError(f"llama.cpp could not create a context of {n_ctx} cells for {n_seq} sequences: "
                             f"{exc}") from exc
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.n_seq, self.n_ctx, self.n_batch = n_seq, n_ctx, n_batch
        self.n_vocab = llama.n_vocab()
        self.held_prefix: list[int] = []  # the tokens sequence 0 holds now
        self.evaluated_tokens = 0

    @property
    def workers(self) -> int:
        return self.n_seq - 1

    # ---------------------------------------------------------------- decoding
    def _decode(self, runs: list[Run], on_output: Callable[[int, int], None]) -> None:
        """Append every run's tokens, filling batches of up to n_batch tokens.

        Right after the decode that holds a run's last token, `on_output(key, batch_index)`
        reads its logits (they are only valid until the next decode).
        """
        batch = self._batch.batch
        n = 0
        pending: list[tuple[int, int]] = []

        def flush() -> None:
            nonlocal n, pending
            if n == 0:
                return
            batch.n_tokens = n
            code = self._lib.llama_decode(self._ctx.ctx, batch)
            if code != 0:
                self.reset()  # the cache may hold part of the batch; start clean next time
                raise ModelError(f"llama_decode returned {code} for a batch of {n} tokens "
                                 f"(KV cache of {self.n_ctx} cells, {self.n_seq} sequences)")
            self.evaluated_tokens += n
            for key, index in pending:
                on_output(key, index)
            n, pending = 0, []

        for run in runs:
            for offset, token in enumerate(run.tokens):
                if n == self.n_batch:
                    flush()
                output_key = run.key if offset == len(run.tokens) - 1 else None
                batch.token[n] = token
                batch.pos[n] = run.start + offset
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = run.seq
                batch.logits[n] = output_key is not None
                if output_key is not None:
                    pending.append((output_key, n))
                n += 1
        flush()

    def logits(self, index: int, *, copy: bool = True) -> np.ndarray:
        """Logits of output `index` of the last decode (a view is valid only until the next decode)."""
        row = np.ctypeslib.as_array(self._ctx.get_logits_ith(index), shape=(self.n_vocab,))
        return row.copy() if copy else row

    def _start_group(self, token_lists: list[list[int]], group: Group) -> None:
        """Put the group's prefix on sequence 0 (reusing what it holds) and copy it to each worker."""
        prefix = token_lists[group.members[0]][:group.prefix_length]
        keep = shared_prefix_length(self.held_prefix, prefix)
        if keep < len(self.held_prefix):
            self._ctx.kv_cache_seq_rm(0, keep, -1)
        self.held_prefix = self.held_prefix[:keep]
        if keep < len(prefix):
            self._decode([Run(0, prefix[keep:], keep)], lambda key, index: None)
        self.held_prefix = list(prefix)
        for worker in range(1, len(group.members) + 1):
            self._ctx.kv_cache_seq_cp(0, worker, -1, -1)

    def _end_group(self, group: Group) -> None:
        for worker in range(1, len(group.members) + 1):
            self._ctx.kv_cache_seq_rm(worker, -1, -1)

    # ------------------------------------------------------------------ scoring
    def last_logits(self, token_lists: list[list[int]]) -> list[np.ndarray]:
        """Logits after each prompt, prompts sharing a prefix evaluated as parallel sequences."""
        out: list[np.ndarray | None] = [None] * len(token_lists)

        def keep(key: int, index: int) -> None:
            out[key] = self.logits(index)

        for group in plan_groups(token_lists, self.workers, self.n_ctx):
            self._start_group(token_lists, group)
            try:
                self._decode([Run(w, token_lists[i][group.prefix_length:], group.prefix_length, key=i)
                              for w, i in enumerate(group.members, start=1)], keep)
            finally:
                self._end_group(group)
        return out  # type: ignore[return-value]

    # --------------------------------------------------------------- generation
    def generate(self, token_lists: list[list[int]], limits: list[int], *, stop: tuple[str, ...],
                 grammar=None) -> list[Reply]:
        """Greedy continuation of each prompt until end-of-generation, a stop string or its token limit.

        `grammar` (a llama-cpp-python LlamaGrammar) restricts every sequence; the stopping rules
        and the text are those of `Llama.create_completion`.
        """
        replies = [Reply() for _ in token_lists]
        stops = [s.encode("utf-8") for s in stop]
        vocab = self._llama._model.vocab
        for group in plan_groups(token_lists, self.workers, self.n_ctx, reserve=limits):
            worker = {i: w for w, i in enumerate(group.members, start=1)}
            choosers: dict[int, GreedyChooser] = {}
            chosen: dict[int, int] = {}

            def choose(key: int, index: int, chosen=chosen, choosers=choosers) -> None:
                chosen[key] = choosers[key].choose(self.logits(index, copy=False))

            try:
                for i in group.members:
                    choosers[i] = GreedyChooser(self._lib, vocab, self.n_vocab, grammar)
                self._start_group(token_lists, group)
                self._decode([Run(worker[i], token_lists[i][group.prefix_length:], group.prefix_length, key=i)
                              for i in group.members], choose)
                active = list(group.members)
                while active:
                    runs, unfinished = [], []
                    for i in active:
                        token = chosen.pop(i)
                        self._advance(replies[i], token, token_lists[i], limits[i], stops)
                        if not replies[i].done:
                            position = len(token_lists[i]) + len(replies[i].tokens) - 1
                            runs.append(Run(worker[i], [token], position, key=i))
                            unfinished.append(i)
                    active = unfinished
                    self._decode(runs, choose)
            finally:
                for chooser in choosers.values():
                    chooser.close()
                self._end_group(group)
        return replies

    def _advance(self, reply: Reply, token: int, prompt: list[int], limit: int, stops: list[bytes]) -> None:
        """One sampled token, with create_completion's end-of-generation, stop-string and length rules."""
        llama = self._llama
        if self._lib.llama_vocab_is_eog(llama._model.vocab, token):
            reply.text = llama.detokenize(reply.tokens, prev_tokens=prompt)
            reply.finish_reason, reply.done = "stop", True
            return
        reply.tokens.append(token)
        text = llama.detokenize(reply.tokens, prev_tokens=prompt)
        if not _ends_inside_a_character(text):
            hits = [s for s in stops if s in text]
            if hits:
                reply.text, reply.finish_reason, reply.done = text[: text.index(hits[0])], "stop", True
                return
        if len(reply.tokens) >= limit:
            reply.text, reply.finish_reason, reply.done = text, "length", True

    def reset(self) -> None:
        """Forget every sequence (sequence 0's prefix included)."""
        self._ctx.kv_cache_clear()
        self.held_prefix = []

    def close(self) -> None:
        self._batch.close()
        self._ctx.close()


def _ends_inside_a_character(text: bytes) -> bool:
    """True when the last bytes start a UTF-8 character that is not complete yet."""
    for back in range(1, min(4, len(text)) + 1):
        byte = text[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: look further back for the lead byte
            continue
        width = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return width > back
    return False
