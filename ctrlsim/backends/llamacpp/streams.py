"""Which tokens each KV stream of a llama.cpp context holds, when every sequence has a stream of its own.

In a unified KV cache (`kv.SlotPool`) every decode attends over all occupied cells,
masked per sequence, so 16 conversations of 1,000 tokens make every token's attention visit
16,000 cells. With `kv_unified = false` (llama.cpp's server runs its slots this way) a context
has one stream of cells per sequence id and a token attends only over its own stream. What that
changes for the bookkeeping:

- A stream holds one sequence of at most `per_slot` cells; no cells are shared, so there is no
  budget to evict for, and a group of prompts fits whenever each prompt does.
- Streams `0 .. workers - 1` hold the prompts being decoded, member *i* of a group on stream *i*
  (llama.cpp splits a batch wherever the sequence ids in it are not consecutive, so the decoding
  sequences must sit on consecutive streams). With continuous batching a stream whose sequence
  finishes takes the call's next waiting prompt (`refill`); once none waits, `compact` moves the
  sequences still decoding down when some finish early.
  Stream `workers` is the scratch stream: a prefix that several prompts share is evaluated there
  once and copied whole to each of them (`llama_memory_seq_cp` across streams copies the buffer;
  the copy is then cut to the prefix).
- With reuse and a `HostStash`, sequences wait in host memory between groups and calls: before
  a group is placed every stream is parked, and each member is restored from the parked sequence
  sharing its longest prefix (or copied from the scratch stream, whichever holds more).

This module is bookkeeping only; the llama.cpp calls go through `kv.KVOps`.
"""
from __future__ import annotations

from ctrlsim.backends.llamacpp.kv import (
    CapacityError,
    HostStash,
    KVOps,
    Placement,
    Slot,
    SlotBook,
    common_prefix,
    group_prefix,
)

WHOLE = -1  # llama.cpp copies across streams only whole buffers: positions [-1, -1)


class StreamPool(SlotBook):
    """`workers` member streams and one scratch stream of `per_slot` cells each."""

    def __init__(self, ops: KVOps, *, workers: int, per_slot: int, reuse: bool = True,
                 stash: HostStash | None = None):
        super().__init__(ops, n_slots=workers + 1, reuse=reuse, stash=stash)
        self.per_slot, self.workers, self.scratch = per_slot, workers, workers
        self.evictions = 0  # nothing is evicted for room here; kept for the pools' common interface
        self.moves = 0  # sequences moved down to close a gap between decoding streams

    # ------------------------------------------------------------ bookkeeping
    def used_cells(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def extend(self, slot: int, tokens: list[int]) -> None:
        held = self.slots[slot]
        held.tokens = held.tokens + list(tokens)
        held.last_used = self._tick

    def _drop(self, slot: int, keep: int = 0) -> None:
        held = self.slots[slot]
        if len(held.tokens) > keep:
            self._ops.seq_rm(slot, keep, -1)
            held.tokens = held.tokens[:keep]

    def _copy(self, src: int, dst: int, length: int) -> None:
        """Stream `dst` becomes the first `length` tokens of stream `src`."""
        self._ops.seq_cp(src, dst, WHOLE, WHOLE)
        self.slots[dst] = Slot(list(self.slots[src].tokens), last_used=self._tick)
        self._drop(dst, length)

    def _park(self, slot: int) -> None:
        held = self.slots[slot]
        if self.stash is not None and self.reuse and held.tokens and not self.stash.holds(held.tokens):
            state = self._ops.save(slot)
            if state is not None:
                self.stash.put(held.tokens, state, len(state))

    def _restore(self, slot: int, key: tuple[int, ...], length: int) -> bool:
        """Stream `slot` (empty) gets the parked sequence `key`, cut to `length` tokens (False when
        it is no longer parked, e.g. a failed load of it for another member discarded it)."""
        assert self.stash is not None
        if key not in self.stash.entries:
            return False
        if not self._ops.load(slot, self.stash.get(key)):
            self._ops.seq_rm(slot, 0, -1)
            self.stash.discard(key)
            return False
        self.stash.restored += 1
        self.slots[slot] = Slot(list(key), last_used=self._tick)
        self._drop(slot, length)
        return True

    def _parked_prefix(self, tokens: list[int], limit: int) -> tuple[int, tuple[int, ...] | None]:
        if self.stash is None or not self.reuse:
            return 0, None
        return self.stash.best(tokens, limit=limit)

    def _best_start(self, prompt: list[int]) -> tuple[int, tuple[int, ...] | None]:
        """(length, parked key) of the longest prefix of `prompt` held for it, keeping its last token:
        from the stash when that holds more than the scratch stream (key None: the scratch stream)."""
        from_scratch = min(common_prefix(self.slots[self.scratch].tokens, prompt), len(prompt) - 1)
        parked, key = self._parked_prefix(prompt, len(prompt) - 1)
        return (parked, key) if parked > from_scratch else (from_scratch, None)

    # ------------------------------------------------------------- placement
    def prepare(self, prompts: list[list[int]]) -> None:
        """Empty the member streams for a new group, parking what they hold first (with a stash and
        reuse on). The scratch stream keeps its shared prefix for later groups."""
        for slot in range(self.workers):
            self._park(slot)
            self._drop(slot)

    def shared_prefix_task(self, prompts: list[list[int]]) -> tuple[int, int, list[int]] | None:
        """(scratch stream, start, tokens) to decode first when 2+ prompts share a prefix that
        neither the scratch stream nor the stash holds; each of them then copies it."""
        shared = group_prefix(prompts) if len(prompts) >= 2 else 0
        if shared <= 0:
            return None
        if sum(1 for p in prompts if self._best_start(p)[0] < shared) < 2:
            return None
        scratch = self.slots[self.scratch].tokens
        prefix = prompts[0][:shared]
        start = common_prefix(scratch, prefix)
        parked, key = self._parked_prefix(prefix, shared)
        if parked > start and key is not None:
            self._drop(self.scratch)
            start = parked if self._restore(self.scratch, key, parked) else 0
        else:
            self._drop(self.scratch, start)
        self.slots[self.scratch].last_used = self._tick
        return self.scratch, start, prefix[start:]

    def place(self, prompts: list[list[int]], reserve: list[int]) -> list[Placement]:
        """Member streams for the prompts, the longest remaining suffix on stream 0 (llama.cpp
        evaluates a prompt batch in slices of equal length per stream, so the streams still going
        after the short ones end stay consecutive), each started from the longest prefix the
        scratch stream or the stash holds."""
        if len(prompts) > self.workers:
            raise CapacityError(f"{len(prompts)} prompts for {self.workers} streams")
        for prompt, extra in zip(prompts, reserve):
            self._check_fits(prompt, extra)
        found = [self._best_start(prompt) for prompt in prompts]
        order = sorted(range(len(prompts)), key=lambda i: (-(len(prompts[i]) - found[i][0]), i))
        starts = {i: self._start_on(slot, prompts[i], found[i]) for slot, i in enumerate(order)}
        return [Placement(order.index(i), starts[i]) for i in range(len(prompts))]

    def refill(self, slot: int, prompt: list[int], reserve: int) -> int:
        """Continuous batching: the member stream `slot`, whose sequence has finished, takes the
        next prompt of the call while the other streams keep decoding. What it held is parked
        first; the prompt starts from the longest prefix the scratch stream or the stash holds.
        Returns how many of its tokens the stream already holds (evaluate the rest)."""
        self._check_fits(prompt, reserve)
        self._park(slot)
        self._drop(slot)
        return self._start_on(slot, prompt, self._best_start(prompt))

    def _check_fits(self, prompt: list[int], extra: int) -> None:
        if len(prompt) + extra > self.per_slot:
            raise CapacityError(f"a prompt of {len(prompt)} tokens with {extra} to generate does not fit "
                                f"a stream of {self.per_slot} cells")

    def _start_on(self, slot: int, prompt: list[int], found: tuple[int, tuple[int, ...] | None]) -> int:
        """Empty stream `slot` gets `found` (`_best_start`): a parked sequence restored, or the
        scratch stream's prefix copied; the number of tokens it then holds."""
        length, key = found
        if key is not None and not self._restore(slot, key, length):
            length = min(common_prefix(self.slots[self.scratch].tokens, prompt), len(prompt) - 1)
            key = None
        if key is None and length > 0:
            self._copy(self.scratch, slot, length)
        self.slots[slot].last_used = self._tick
        return length

    def compact(self, streams: list[int]) -> dict[int, int]:
        """Moves that put the decoding `streams` on 0 .. n-1 (llama.cpp splits a batch at every gap
        in the sequence ids, and each slice reads all the weights again): {old: new}. A finished
        sequence whose stream is taken is parked first."""
        n = len(streams)
        free = sorted(set(range(n)) - set(streams))
        movers = sorted(s for s in streams if s >= n)
        moves = dict(zip(movers, free))
        for src, dst in moves.items():
            self._park(dst)
            self._drop(dst)
            self._copy(src, dst, len(self.slots[src].tokens))
            self._drop(src)
            self.moves += 1
        return moves
