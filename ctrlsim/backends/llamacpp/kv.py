"""Which tokens a llama.cpp parallel context holds in its KV cache, and where a new prompt starts.

Prefix reuse across calls, as vLLM's automatic prefix caching and llama.cpp's server slots do it:
every sequence id of the context is a *slot* holding one token list in KV cells, kept between
`chat`/`rate` calls. A new prompt runs on a slot that starts as its longest cached prefix and
evaluates only the rest:

- in place, when a slot's whole content is a prefix of the prompt (a conversation that grew by a
  turn continues on the slot of its last call, and nothing is lost);
- otherwise on a free slot that first gets the prefix by `llama_memory_seq_cp`, which in a
  unified KV cache shares the source's cells (nothing is recomputed, no cell is added).

A unified cache frees a cell when no sequence holds it any more, so the pool gives every cell it
creates an id and counts the distinct ids of all slots against the budget (`capacity` cells, the
context size). To make room it evicts the least recently used slots not needed by the prompts
being placed.

Every decode of a unified cache goes over all cells up to the highest one in use, masked or
not, so sequences kept for later make the current ones slower. With a `HostStash` (llama.cpp's
server keeps a host-memory prompt cache the same way) the pool parks every sequence in host
memory (`llama_state_seq_get_data`) before a group of prompts is placed, empties the cache,
and restores (`llama_state_seq_set_data`) only the parked sequences those prompts start from,
cut to the prefix they use: the cache holds only what the current prompts need, from its first
cell, and the restored cells are byte for byte the ones computed. This module is bookkeeping only; the
llama.cpp calls go through `KVOps`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class KVOps(Protocol):
    """The two KV-cache edits the pool needs (positions [p0, p1); -1 is "to the end")."""

    def seq_rm(self, seq: int, p0: int, p1: int) -> None: ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    # Only with a HostStash: a sequence's saved state (None: llama.cpp could not save it), putting
    # one back on an empty sequence (False: no room for it) and emptying the whole cache.
    def save(self, seq: int) -> Any: ...

    def load(self, seq: int, state: Any) -> bool: ...

    def clear(self) -> None: ...


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def group_prefix(prompts: list[list[int]]) -> int:
    """Length of the prefix all `prompts` share, each keeping at least its last token to evaluate."""
    ordered = sorted(prompts)  # the common prefix of a sorted run is that of its first and last
    return min(common_prefix(ordered[0], ordered[-1]), min(len(p) for p in prompts) - 1)


@dataclass
class Slot:
    tokens: list[int] = field(default_factory=list)
    cells: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    last_used: int = 0


@dataclass(frozen=True)
class Placement:
    """A prompt's slot, and how many of its tokens that slot already holds (evaluate the rest)."""

    slot: int
    start: int


class CapacityError(Exception):
    """The prompts being placed need more cells than the budget holds beside what they share."""


class HostStash:
    """Parked sequences: token list -> saved KV state, least recently parked dropped past `budget` bytes."""

    def __init__(self, budget: int):
        self.budget, self.bytes = budget, 0
        self.entries: OrderedDict[tuple[int, ...], tuple[Any, int]] = OrderedDict()
        self.parked = self.restored = self.dropped = 0

    def holds(self, tokens: list[int]) -> bool:
        """Whether a parked sequence starts with `tokens` (then parking them again adds nothing)."""
        key = tuple(tokens)
        return any(k[:len(key)] == key for k in self.entries)

    def put(self, tokens: list[int], state: Any, size: int) -> None:
        """Park a sequence; parked prefixes of it go (restoring it and cutting it gives them)."""
        key = tuple(tokens)
        for held in [k for k in self.entries if key[:len(k)] == k]:
            self.bytes -= self.entries.pop(held)[1]
        if size > self.budget:
            self.dropped += 1
            return
        self.entries[key] = (state, size)
        self.bytes += size
        self.parked += 1
        while self.bytes > self.budget:
            self.bytes -= self.entries.popitem(last=False)[1][1]
            self.dropped += 1

    def best(self, tokens: list[int], *, limit: int) -> tuple[int, tuple[int, ...] | None]:
        """(length, key) of the parked sequence sharing the longest prefix with `tokens`."""
        best, best_key = 0, None
        for key in self.entries:
            length = min(common_prefix(list(key), tokens), limit)
            if length > best:
                best, best_key = length, key
        return best, best_key

    def get(self, key: tuple[int, ...]) -> Any:
        """A parked state (it stays parked: what is restored is a copy)."""
        self.entries.move_to_end(key)
        return self.entries[key][0]

    def discard(self, key: tuple[int, ...]) -> None:
        self.bytes -= self.entries.pop(key)[1]
        self.dropped += 1

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


class SlotBook(ABC):
    """What the two pools share: one `Slot` per sequence id, the call counter, and the stash."""

    def __init__(self, ops: KVOps, *, n_slots: int, reuse: bool, stash: HostStash | None):
        self._ops, self.reuse, self.stash = ops, reuse, stash
        self.slots = [Slot() for _ in range(n_slots)]
        self._tick = 0

    @abstractmethod
    def _drop(self, slot: int, keep: int = 0) -> None:
        """Keep only the first `keep` tokens of `slot`, in the KV cache and here."""

    def begin_call(self) -> None:
        """A new `chat`/`rate` call: with reuse off, nothing from earlier calls is kept."""
        self._tick += 1
        if not self.reuse:
            self.clear()

    def clear(self) -> None:
        """Drop every slot from the KV cache."""
        for slot in range(len(self.slots)):
            self._drop(slot)

    def forget(self, *, parked: bool = True) -> None:
        """Forget every slot (after the caller cleared the whole KV cache) and, unless `parked` is
        False, every parked sequence."""
        self.slots = [Slot() for _ in self.slots]
        if parked and self.stash is not None:
            self.stash.clear()


class SlotPool(SlotBook):
    def __init__(self, ops: KVOps, *, n_slots: int, capacity: int, reuse: bool = True,
                 stash: HostStash | None = None):
        super().__init__(ops, n_slots=n_slots, reuse=reuse, stash=stash)
        self.capacity = capacity
        self._next_cell = 0
        self.evictions = 0  # slots dropped to make room (not counting `clear`)

    # ------------------------------------------------------------ bookkeeping
    def used_cells(self) -> int:
        held = [s.cells for s in self.slots if s.cells.size]
        return int(np.unique(np.concatenate(held)).size) if held else 0

    def extend(self, slot: int, tokens: list[int]) -> None:
        """Record `tokens` decoded on `slot` right after what it holds."""
        held = self.slots[slot]
        new = np.arange(self._next_cell, self._next_cell + len(tokens), dtype=np.int64)
        self._next_cell += len(tokens)
        held.tokens = held.tokens + list(tokens)
        held.cells = np.concatenate([held.cells, new])
        held.last_used = self._tick

    def _drop(self, slot: int, keep: int = 0) -> None:
        """Keep only the first `keep` tokens of `slot`, in the KV cache and here."""
        held = self.slots[slot]
        if len(held.tokens) > keep:
            self._ops.seq_rm(slot, keep, -1)
            held.tokens, held.cells = held.tokens[:keep], held.cells[:keep]

    def _copy(self, src: int, dst: int, length: int) -> None:
        self._drop(dst)
        if length:
            self._ops.seq_cp(src, dst, 0, length)
        source = self.slots[src]
        self.slots[dst] = Slot(source.tokens[:length], source.cells[:length].copy(), self._tick)

    # ---------------------------------------------------------------- search
    def best_prefix(self, tokens: list[int], *, limit: int) -> tuple[int, int | None]:
        """(length, slot) of the longest cached prefix of `tokens`, at most `limit` long."""
        best, best_slot = 0, None
        for n, held in enumerate(self.slots):
            if held.tokens:
                length = min(common_prefix(held.tokens, tokens), limit)
                if length > best or (length == best and best_slot is not None and length
                                     and held.last_used > self.slots[best_slot].last_used):
                    best, best_slot = length, n
        return best, best_slot

    def _is_prefix(self, slot: int, tokens: list[int]) -> bool:
        """Whether the slot's whole content starts `tokens` (running it there in place loses nothing)."""
        held = self.slots[slot].tokens
        return common_prefix(held, tokens) == len(held)

    def _take_free(self, protected: set[int]) -> int:
        """An empty slot, else the least recently used one not protected (evicted)."""
        candidates = [n for n in range(len(self.slots)) if n not in protected]
        if not candidates:
            raise CapacityError(f"all {len(self.slots)} KV slots are needed at once")
        empty = [n for n in candidates if not self.slots[n].tokens]
        if empty:
            return empty[0]
        slot = min(candidates, key=lambda n: (self.slots[n].last_used, len(self.slots[n].tokens), n))
        self.evictions += 1
        return slot

    def _make_room(self, needed: int, protected: set[int]) -> None:
        """Evict least recently used unprotected slots until `needed` new cells fit."""
        while self.used_cells() + needed > self.capacity:
            held = [n for n, s in enumerate(self.slots) if s.tokens and n not in protected]
            if not held:
                raise CapacityError(f"{needed} new cells do not fit beside the {self.used_cells()} "
                                    f"the current prompts hold (budget {self.capacity})")
            victim = min(held, key=lambda n: (self.slots[n].last_used, n))
            self._drop(victim)
            self.evictions += 1

    # ------------------------------------------------------------ host stash
    def prepare(self, prompts: list[list[int]]) -> None:
        """With a stash and reuse on: park every slot, empty the cache, and bring back only the
        parked sequences these prompts start from, each cut to the prefix they use.

        An emptied cache fills from its first cell again: llama.cpp attends over every cell up
        to the highest one in use, so even a short prefix kept at the top would cost as much as
        a full cache.
        """
        if self.stash is None or not self.reuse:
            return
        for slot, held in enumerate(self.slots):
            if held.tokens and not self.stash.holds(held.tokens):  # a restored, unchanged one is parked
                state = self._ops.save(slot)
                if state is not None:
                    self.stash.put(held.tokens, state, len(state))
        self._ops.clear()
        self.forget(parked=False)
        wanted: dict[tuple[int, ...], int] = {}
        for tokens in prompts:
            length, key = self.stash.best(tokens, limit=len(tokens) - 1)
            if key is not None:
                wanted[key] = max(wanted.get(key, 0), length)
        # A restored sequence shares no cells, so the group was planned without sharing
        # (`plan_groups(shared=False)`); llama.cpp places the whole parked sequence before it is cut.
        for key, length in sorted(wanted.items(), key=lambda kv: -kv[1]):
            if self.used_cells() + len(key) > self.capacity:
                continue
            slot = self._take_free(set())
            if not self._ops.load(slot, self.stash.get(key)):
                self._ops.seq_rm(slot, 0, -1)
                self.stash.discard(key)
                continue
            self.stash.restored += 1
            self.extend(slot, list(key))
            self._drop(slot, length)

    # ------------------------------------------------------------- placement
    def shared_prefix_task(self, prompts: list[list[int]]) -> tuple[int, int, list[int]] | None:
        """(slot, start, tokens) to decode first when 2+ prompts share a prefix the cache lacks.

        The shared prefix is then evaluated once and every prompt that needs it copies it.
        """
        shared = group_prefix(prompts) if len(prompts) >= 2 else 0
        if shared <= 0:
            return None
        found = [self.best_prefix(p, limit=len(p) - 1) for p in prompts]
        if sum(1 for length, _ in found if length < shared) < 2:
            return None
        prefix = prompts[0][:shared]
        start, source = self.best_prefix(prefix, limit=shared)
        protected = {s for _, s in found if s is not None}
        if source is not None and self._is_prefix(source, prefix):
            slot = source  # its whole content is a prefix of the shared prefix: extend it in place
        elif source is not None:
            slot = self._take_free(protected | {source})
            self._copy(source, slot, start)
        else:
            slot = self._take_free(protected)
            self._drop(slot)
        self.slots[slot].last_used = self._tick
        self._make_room(shared - start, protected | {slot})
        return slot, start, prefix[start:]

    def place(self, prompts: list[list[int]], reserve: list[int]) -> list[Placement]:
        """A slot for each prompt (each keeps at least its last token to evaluate, for its logits),
        with room for its remaining tokens plus `reserve` generated ones."""
        found = [self.best_prefix(p, limit=len(p) - 1) for p in prompts]
        in_place: dict[int, int] = {}  # slot -> prompt extending that slot's whole content
        for i in sorted(range(len(prompts)), key=lambda i: -found[i][0]):
            length, source = found[i]
            if source is not None and source not in in_place and self._is_prefix(source, prompts[i]):
                in_place[source] = i
        protected = {s for _, s in found if s is not None}
        slots: dict[int, int] = {i: s for s, i in in_place.items()}
        for i, (length, source) in enumerate(found):  # copies first: sources are still whole
            if i in slots:
                continue
            slot = self._take_free(protected | set(slots.values()))
            if source is None:
                self._drop(slot)
                self.slots[slot].last_used = self._tick
            else:
                self._copy(source, slot, length)
            slots[i] = slot
        for slot, i in in_place.items():
            self._drop(slot, found[i][0])
            self.slots[slot].last_used = self._tick
        needed = sum(len(p) - found[i][0] + r for i, (p, r) in enumerate(zip(prompts, reserve)))
        self._make_room(needed, set(slots.values()))
        return [Placement(slots[i], found[i][0]) for i in range(len(prompts))]
