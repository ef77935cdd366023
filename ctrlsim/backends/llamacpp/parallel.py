"""Parallel sequences in one llama.cpp context: cached prefixes reused, many continuations side by side.

llama.cpp's own batching, as in its `batched` and `parallel` examples: one context with
several sequence ids over a unified KV cache. What the sequences hold is kept between calls
(`kv.SlotPool`): each prompt starts on a sequence that already holds its longest
cached prefix (its own previous turn, a shared system text, a profile), so only the rest is
evaluated, and a prefix that several prompts of a batch share but the cache lacks is
evaluated once and copied (`llama_memory_seq_cp` shares the cells, nothing is recomputed).
The prompts' own tokens, and then every reply's next token, go through one `llama_batch` per
decode step. A batch with more prompts than worker sequences, or more tokens than the KV
cache holds, is split into groups that run one after another. With a host stash, the cache
holds only what the group being placed starts from; the rest waits in host memory (`kv`).
With `streams`, every sequence has a KV stream of its own (`kv_unified = false`), so a token
attends only over its own sequence's cells (`streams`), and batching is continuous: a
waiting prompt takes the first stream that frees instead of waiting for its group.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ctrlsim.backends.llamacpp.kv import CapacityError, HostStash, Placement, SlotPool, common_prefix
from ctrlsim.backends.llamacpp.sampling import GreedyChooser, SampledChooser
from ctrlsim.backends.llamacpp.streams import StreamPool
from ctrlsim.errors import ModelError


@dataclass
class Group:
    """Prompts decoded together: their indices and the length of the prefix they all share."""

    members: list[int]
    prefix_length: int


def plan_groups(token_lists: list[list[int]], workers: int, capacity: int,
                reserve: list[int] | None = None, *, shared: bool = True) -> list[Group]:
    """Split prompts (in sorted token order, so shared prefixes sit together) into groups.

    A group has at most `workers` prompts and fits the KV cache: its prefix plus every
    member's suffix and `reserve` generated tokens stay within `capacity` cells (with
    `shared=False`, every member's whole prompt: sequences restored from a host stash share no
    cells). Each member keeps at least one suffix token, whose logits are the ones read.
    """
    reserve = reserve or [0] * len(token_lists)
    order = sorted(range(len(token_lists)), key=lambda i: token_lists[i])
    groups: list[Group] = []
    members: list[int] = []
    prefix = 0
    for i in order:
        trial = members + [i]
        # In sorted order the common prefix of a run is that of its first and last member.
        common = common_prefix(token_lists[trial[0]], token_lists[i])
        common = min(common, min(len(token_lists[j]) for j in trial) - 1)
        counted = common if shared else 0
        cells = counted + sum(len(token_lists[j]) - counted + reserve[j] for j in trial)
        if members and (len(trial) > workers or cells > capacity):
            groups.append(Group(members, prefix))
            members, prefix = [i], len(token_lists[i]) - 1
        else:
            members, prefix = trial, common
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


class ParallelContext:
    """A second llama.cpp context on an already loaded model: `n_seq` sequences, `workers` decoded
    together, and what they hold kept between calls for prefix reuse (`reuse=False`: every call
    starts from an empty cache).

    With `streams`, the context has `workers + 1` KV streams of `n_ctx` cells each (one per decoding
    sequence, one scratch stream for shared prefixes) instead of one unified cache, and `n_seq` is
    ignored."""

    def __init__(self, llama, *, n_seq: int, workers: int, n_ctx: int, n_batch: int, n_threads: int,
                 reuse: bool = True, host_bytes: int = 0, streams: bool = False):
        import llama_cpp
        from llama_cpp import _internals

        per_stream = n_ctx
        if streams:
            n_seq, n_ctx = workers + 1, n_ctx * (workers + 1)
        if workers < 1 or (not streams and n_seq < 2 * workers + 1):
            raise ModelError(f"a parallel context for {workers} workers needs at least {2 * workers + 1} "
                             f"sequences (each prompt's own, its source, one shared prefix), got {n_seq}")
        self._lib = llama_cpp
        self._llama = llama  # keeps the model alive as long as this context
        # Start from the sequential context's settings (flash attention, KV types) so logits agree.
        params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, min(n_batch, 512)
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = n_threads
        # Unified: all sequences share one pool of cells, so copied prefixes cost nothing. Streams:
        # each sequence attends only over its own cells.
        params.kv_unified = not streams
        params.no_perf = True
        try:
            self._ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        except ValueError as exc:
            raise ModelError(f"llama.cpp could not create a context of {n_ctx} cells for {n_seq} sequences: "
                             f"{exc}") from exc
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.n_seq, self.workers, self.n_ctx, self.n_batch = n_seq, workers, n_ctx, n_batch
        self.n_vocab = llama.n_vocab()
        self.streams = streams
        self.per_stream = per_stream if streams else 0  # cells of each KV stream (0: a unified cache)
        stash = HostStash(host_bytes) if host_bytes > 0 else None
        self.pool: SlotPool | StreamPool = (
            StreamPool(self, workers=workers, per_slot=per_stream, reuse=reuse, stash=stash) if streams
            else SlotPool(self, n_slots=n_seq, capacity=n_ctx, reuse=reuse, stash=stash))
        self.evaluated_tokens = 0
        # Decodes whose logits were read, and how many sequences they extended in all (the mean
        # width of a step: a narrow step costs more per token).
        self.steps = self.step_sequences = 0
        # Streams: continuous batching (False: groups one after another, as the unified cache runs;
        # kept for side-by-side benchmarks).
        self.continuous = streams

    @property
    def ctx(self):
        """The raw llama_context pointer (for llama.cpp's samplers)."""
        return self._ctx.ctx

    # ------------------------------------------------------------- KV edits (KVOps)
    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self._ctx.kv_cache_seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self._ctx.kv_cache_seq_cp(src, dst, p0, p1)

    def save(self, seq: int):
        """The sequence's KV state in host memory (a ctypes byte array), None if llama.cpp fails."""
        size = self._lib.llama_state_seq_get_size(self._ctx.ctx, seq)
        state = (ctypes.c_ubyte * size)()
        return state if size and self._lib.llama_state_seq_get_data(self._ctx.ctx, state, size, seq) == size \
            else None

    def load(self, seq: int, state) -> bool:
        """Put a saved state on the (empty) sequence `seq`; False when the cache has no room for it."""
        return self._lib.llama_state_seq_set_data(self._ctx.ctx, state, len(state), seq) == len(state)

    def clear(self) -> None:
        self._ctx.kv_cache_clear()

    def _shares_cells(self) -> bool:
        """Whether a group's members share their common prefix's cells (not when restored, nor
        across streams)."""
        return not self.streams and (self.pool.stash is None or not self.pool.reuse)

    def _capacity(self) -> int:
        """Cells a group may need together: unified, the cache; streams, no joint limit (each
        prompt must fit its own stream, which `StreamPool.place` checks)."""
        return self.n_ctx if not self.streams else 1 << 62

    # ---------------------------------------------------------------- decoding
    def _decode(self, runs: list[Run], on_output: Callable[[int, int], None]) -> None:
        """Append every run's tokens, filling batches of up to n_batch tokens.

        Right after the decode that holds a run's last token, `on_output(key, batch_index)`
        reads its logits (they are only valid until the next decode). The pool records what
        each sequence now holds.
        """
        batch = self._batch.batch
        n = 0
        pending: list[tuple[int, int]] = []
        if self.streams:  # llama.cpp slices a batch wherever the streams in it are not consecutive
            runs = sorted(runs, key=lambda run: run.seq)

        def flush() -> None:
            nonlocal n, pending
            if n == 0:
                return
            batch.n_tokens = n
            code = self._lib.llama_decode(self._ctx.ctx, batch)
            if code != 0:
                self.reset(parked=False)  # the cache may hold part of the batch; start clean next time
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
        for run in runs:
            self.pool.extend(run.seq, run.tokens)
        if any(run.key is not None for run in runs):
            self.steps += 1
            self.step_sequences += len({run.seq for run in runs})

    def logits(self, index: int, *, copy: bool = True) -> np.ndarray:
        """Logits of output `index` of the last decode (a view is valid only until the next decode)."""
        row = np.ctypeslib.as_array(self._ctx.get_logits_ith(index), shape=(self.n_vocab,))
        return row.copy() if copy else row

    def _place(self, token_lists: list[list[int]], group: Group, reserve: list[int]) -> list[Placement]:
        """Slots for the group's prompts, their shared prefix evaluated once if the cache lacks it.

        When what the cache holds leaves no room beside the group, it starts from an empty cache
        (`plan_groups` made every group fit one).
        """
        prompts = [token_lists[i] for i in group.members]
        self.pool.prepare(prompts)
        for attempt in (1, 2):
            try:
                task = self.pool.shared_prefix_task(prompts)
                if task is not None:
                    slot, start, tokens = task
                    self._decode([Run(slot, tokens, start)], lambda key, index: None)
                return self.pool.place(prompts, [reserve[i] for i in group.members])
            except CapacityError as exc:
                if attempt == 2:
                    raise ModelError(f"a group of {len(prompts)} prompts does not fit the KV cache of "
                                     f"{self.n_ctx} cells: {exc}") from None
                self.reset(parked=False)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ scoring
    def last_logits(self, token_lists: list[list[int]]) -> list[np.ndarray]:
        """Logits after each prompt, each starting from its longest cached prefix."""
        out: list[np.ndarray | None] = [None] * len(token_lists)

        def keep(key: int, index: int) -> None:
            out[key] = self.logits(index)

        self.pool.begin_call()
        for group in plan_groups(token_lists, self.workers, self._capacity(), shared=self._shares_cells()):
            places = self._place(token_lists, group, [0] * len(token_lists))
            self._decode([Run(p.slot, token_lists[i][p.start:], p.start, key=i)
                          for i, p in zip(group.members, places)], keep)
        return out  # type: ignore[return-value]

    # --------------------------------------------------------------- generation
    def generate(self, token_lists: list[list[int]], limits: list[int], *, stop: tuple[str, ...],
                 grammar=None, temperature: float = 0.0, top_p: float = 1.0,
                 seeds: list[int] | None = None) -> list[Reply]:
        """Continuation of each prompt until end-of-generation, a stop string or its token limit.

        Greedy at temperature 0; otherwise sampled, each sequence by its own sampler chain seeded
        with `seeds[i]` (`sampling.SampledChooser`). `grammar` (a llama-cpp-python
        LlamaGrammar) restricts every sequence; the stopping rules and the text are those of
        `Llama.create_completion`. With streams, batching is continuous (`_run_group`);
        otherwise groups of prompts run one after another.
        """
        replies = [Reply() for _ in token_lists]
        stops = [s.encode("utf-8") for s in stop]
        seeds = seeds if seeds is not None else [0] * len(token_lists)
        vocab = self._llama._model.vocab

        def new_chooser(i: int) -> GreedyChooser | SampledChooser:
            return GreedyChooser(self._lib, vocab, self.n_vocab, grammar) if temperature == 0 \
                else SampledChooser(self._lib, vocab, temperature=temperature, top_p=top_p,
                                    seed=seeds[i], grammar=grammar, n_vocab=self.n_vocab)

        self.pool.begin_call()
        if self.streams and self.continuous:
            order = sorted(range(len(token_lists)), key=lambda i: token_lists[i])  # shared prefixes together
            self._run_group(token_lists, limits, replies, stops, new_chooser, Group(order[:self.workers], 0),
                            waiting=order[self.workers:])
            return replies
        for group in plan_groups(token_lists, self.workers, self._capacity(), reserve=limits,
                                 shared=self._shares_cells()):
            self._run_group(token_lists, limits, replies, stops, new_chooser, group, waiting=[])
        return replies

    def _run_group(self, token_lists: list[list[int]], limits: list[int], replies: list[Reply],
                   stops: list[bytes], new_chooser: Callable[[int], GreedyChooser | SampledChooser],
                   group: Group, *, waiting: list[int]) -> None:
        """Place `group`'s prompts and decode them until every sequence has ended.

        With streams and `waiting` prompts, batching is continuous, as llama.cpp's server runs its
        slots: whenever a sequence finishes, the next waiting prompt takes its stream and its
        prompt tokens go into the same decode as the other sequences' next tokens, so decode steps
        stay as wide as the call allows instead of shrinking while a group's last sequences
        finish. With streams, once no prompt waits, the sequences still going move down to
        consecutive streams (`_compact`)."""
        choosers: dict[int, GreedyChooser | SampledChooser] = {}
        chosen: dict[int, int] = {}

        def choose(key: int, index: int) -> None:
            chosen[key] = choosers[key].choose(self, index)

        try:
            for i in group.members:
                choosers[i] = new_chooser(i)
            places = self._place(token_lists, group, limits)
            slot = {i: p.slot for i, p in zip(group.members, places)}
            runs = [Run(p.slot, token_lists[i][p.start:], p.start, key=i)
                    for i, p in zip(group.members, places)]
            active = list(group.members)
            while active:
                self._decode(runs, choose)
                tokens = {i: chosen.pop(i) for i in active}
                for i in active:
                    self._advance(replies[i], tokens[i], token_lists[i], limits[i], stops)
                finished = sorted((i for i in active if replies[i].done), key=lambda i: slot[i])
                active = [i for i in active if not replies[i].done]
                # The lowest freed streams are refilled, so the refilled ones stay below the number
                # of decoding sequences and `_compact` never has to move a stream filled this step.
                refilled, waiting = waiting[:len(finished)], waiting[len(finished):]
                runs = []
                for i, j in zip(finished, refilled):
                    choosers.pop(i).close()
                    choosers[j] = new_chooser(j)
                    slot[j] = slot[i]
                    start = self._refill(slot[j], token_lists[j], limits[j])
                    runs.append(Run(slot[j], token_lists[j][start:], start, key=j))
                if self.streams and active and len(refilled) < len(finished):
                    self._compact(slot, active + refilled)
                runs += [Run(slot[i], [tokens[i]], len(token_lists[i]) + len(replies[i].tokens) - 1, key=i)
                         for i in active]
                active += refilled
        finally:
            for chooser in choosers.values():
                chooser.close()

    def _refill(self, stream: int, tokens: list[int], limit: int) -> int:
        assert isinstance(self.pool, StreamPool)
        try:
            return self.pool.refill(stream, tokens, limit)
        except CapacityError as exc:
            raise ModelError(f"a prompt does not fit its KV stream: {exc}") from None

    def _compact(self, slot: dict[int, int], active: list[int]) -> None:
        """Streams: move the still decoding sequences onto consecutive streams (a whole-buffer copy,
        milliseconds, where a gap would cost every later step one more pass over the weights)."""
        assert isinstance(self.pool, StreamPool)
        moves = self.pool.compact([slot[i] for i in active])
        for i in active:
            slot[i] = moves.get(slot[i], slot[i])

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

    def reset(self, *, parked: bool = True) -> None:
        """Forget every sequence (and, unless `parked` is False, what the host stash holds)."""
        self._ctx.kv_cache_clear()
        self.pool.forget(parked=parked)

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
