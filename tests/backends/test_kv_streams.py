"""The stream pool's bookkeeping against a simulated llama.cpp cache of separate KV streams (no model).

The simulator keeps llama.cpp's rules for `kv_unified = false`, written from its source and not
from the pool: each sequence id is a stream of its own; a copy between streams must name the
whole buffer (positions -1, -1), replaces what the destination held, and is carried out only at
the next decode (reading the destination's buffer before that reads stale cells); a saved state
loads onto an empty stream. After every step the pool's view must equal what the simulator holds.
"""
import pytest

from ctrlsim.backends.llamacpp.kv import CapacityError, HostStash
from ctrlsim.backends.llamacpp.streams import StreamPool


class FakeStreams:
    def __init__(self, n):
        self.held = [[] for _ in range(n)]  # the cells' metadata: tokens by position
        self.stale = set()  # streams whose buffer waits for a copy (done at the next decode)

    def seq_rm(self, seq, p0, p1):
        keep_tail = self.held[seq][p1:] if p1 >= 0 else []
        self.held[seq] = self.held[seq][:max(p0, 0)] + keep_tail

    def seq_cp(self, src, dst, p0, p1):
        assert src != dst
        assert p0 < 0 and p1 < 0, "llama.cpp copies only whole buffers between streams"
        self.held[dst] = list(self.held[src])
        self.stale.add(dst)

    def decode(self, seq, tokens, start):
        self.stale.clear()
        assert len(self.held[seq]) == start, "a sequence must be extended right after what it holds"
        self.held[seq] = self.held[seq] + list(tokens)

    def save(self, seq):
        assert seq not in self.stale, "saved before the pending copy was carried out"
        return tuple(self.held[seq])

    def load(self, seq, state):
        assert not self.held[seq], "a state is loaded on an empty stream"
        self.held[seq] = list(state)
        return True

    def clear(self):
        self.held = [[] for _ in self.held]


def run_group(pool, kv, prompts, reserve=None):
    """What ParallelContext does for one group: shared prefix, placement, decoding every prompt."""
    reserve = reserve or [0] * len(prompts)
    evaluated = 0
    pool.prepare(prompts)
    task = pool.shared_prefix_task(prompts)
    if task is not None:
        slot, start, tokens = task
        kv.decode(slot, tokens, start)
        pool.extend(slot, tokens)
        evaluated += len(tokens)
    places = pool.place(prompts, reserve)
    assert sorted(p.slot for p in places) == list(range(len(prompts))), "members on streams 0..k-1"
    for prompt, place in zip(prompts, places):
        assert kv.held[place.slot] == prompt[:place.start]
        assert place.start < len(prompt)
    for prompt, place in sorted(zip(prompts, places), key=lambda pp: pp[1].slot):
        kv.decode(place.slot, prompt[place.start:], place.start)
        pool.extend(place.slot, prompt[place.start:])
        evaluated += len(prompt) - place.start
    check(pool, kv)
    return places, evaluated


def check(pool, kv):
    for n, slot in enumerate(pool.slots):
        assert kv.held[n] == slot.tokens


def make(workers=4, per_slot=100, reuse=True, stash=True):
    kv = FakeStreams(workers + 1)
    pool = StreamPool(kv, workers=workers, per_slot=per_slot, reuse=reuse,
                      stash=HostStash(1 << 20) if stash else None)
    return pool, kv


SYSTEM = list(range(100, 120))


def test_a_shared_prefix_is_evaluated_once_on_the_scratch_stream_and_copied():
    pool, kv = make()
    prompts = [SYSTEM + [1, 2, 3], SYSTEM + [4, 5], SYSTEM + [6]]
    pool.begin_call()
    places, evaluated = run_group(pool, kv, prompts)
    assert evaluated == len(SYSTEM) + 3 + 2 + 1
    assert kv.held[pool.scratch] == SYSTEM
    # The longest remaining suffix goes first, so streams still evaluating stay consecutive.
    assert [p.slot for p in places] == [0, 1, 2]
    pool.begin_call()
    _, again = run_group(pool, kv, [SYSTEM + [7, 8], SYSTEM + [9]])
    assert again == 3  # the scratch stream still holds the prefix


def test_a_grown_conversation_is_restored_from_the_stash_and_evaluates_only_its_new_turn():
    pool, kv = make()
    first = [SYSTEM + [1, 2, 3], SYSTEM + [4, 5, 6]]
    pool.begin_call()
    run_group(pool, kv, first)
    grown = [first[1] + [60, 61], first[0] + [30, 31, 32]]
    pool.begin_call()
    places, evaluated = run_group(pool, kv, grown)
    assert evaluated == 2 + 3
    assert pool.stash.restored == 2
    assert [p.start for p in places] == [len(first[1]), len(first[0])]


def test_without_reuse_every_call_starts_empty():
    pool, kv = make(reuse=False)
    prompts = [SYSTEM + [1], SYSTEM + [2]]
    pool.begin_call()
    run_group(pool, kv, prompts)
    pool.begin_call()
    assert all(not held for held in kv.held)
    _, evaluated = run_group(pool, kv, [p + [9] for p in prompts])
    assert evaluated == len(SYSTEM) + 2 + 2


def test_compaction_closes_gaps_and_parks_the_finished_sequences_it_overwrites():
    pool, kv = make(workers=4)
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4], [7, 8, 9], [7, 8]]
    pool.begin_call()
    places, _ = run_group(pool, kv, prompts)
    finished_stream = places[1].slot
    finished = list(kv.held[finished_stream])
    decoding = sorted(p.slot for n, p in enumerate(places) if n != 1)
    moves = pool.compact(decoding)
    assert sorted(moves.values()) == [finished_stream] and moves.get(3) == finished_stream
    assert pool.stash.holds(finished)  # what the finished sequence held is kept for later calls
    # the moved sequence continues on its new stream, right after what it holds
    new = moves[3]
    kv.decode(new, [42], len(kv.held[new]))
    pool.extend(new, [42])
    check(pool, kv)
    assert not kv.held[3]
    assert pool.compact([0, 1, 2]) == {}


def test_a_prompt_longer_than_a_stream_is_a_capacity_error():
    pool, kv = make(per_slot=30)
    pool.begin_call()
    pool.prepare([SYSTEM * 2])
    with pytest.raises(CapacityError, match="does not fit a stream of 30 cells"):
        pool.place([SYSTEM * 2], [0])
    with pytest.raises(CapacityError, match="does not fit"):
        pool.place([SYSTEM], [20])


def test_many_rounds_of_a_population_stay_consistent():
    """Sixteen growing conversations in groups of four, with shared prefixes and finishes out of order."""
    pool, kv = make(workers=4, per_slot=400)
    conversations = [SYSTEM + [200 + n] for n in range(16)]
    total = 0
    for round_ in range(5):
        pool.begin_call()
        for start in range(0, 16, 4):
            group = conversations[start:start + 4]
            places, evaluated = run_group(pool, kv, group)
            total += evaluated
            slot_of = {m: p.slot for m, p in enumerate(places)}
            for step, member in enumerate((0, 3, 2, 1)):  # members finish one by one, out of order
                del slot_of[member]
                moves = pool.compact(sorted(slot_of.values()))
                slot_of = {m: moves.get(s, s) for m, s in slot_of.items()}
                assert sorted(slot_of.values()) == list(range(len(slot_of)))
                for s in slot_of.values():
                    kv.decode(s, [300 + step], len(kv.held[s]))
                    pool.extend(s, [300 + step])
                check(pool, kv)
            for n in range(start, start + 4):
                conversations[n] = conversations[n] + [400 + round_, 500 + n]
    # By hand: round 1 evaluates the system prefix once (the scratch stream keeps it for the other
    # groups) and each conversation's own token; every later round restores each conversation and
    # evaluates its two new tokens.
    assert total == len(SYSTEM) + 16 + 4 * 16 * 2


def test_a_refused_load_falls_back_to_the_scratch_stream_for_every_member_that_wanted_it():
    pool, kv = make()
    pool.begin_call()
    run_group(pool, kv, [SYSTEM + [1, 2, 3], SYSTEM + [4]])
    pool.begin_call()
    pool.prepare([])
    kv.load = lambda seq, state: False  # llama.cpp refuses the parked state
    same = SYSTEM + [1, 2, 3]
    pool.begin_call()
    places, evaluated = run_group(pool, kv, [same + [7], same + [8]])
    assert evaluated == 2 * 4  # the scratch stream's SYSTEM prefix only, for both
    assert not pool.stash.holds(same)


def finish_step(pool, kv, streams, token):
    """One decode step: every listed stream appends `token`."""
    for s in streams:
        kv.decode(s, [token], len(kv.held[s]))
        pool.extend(s, [token])


def test_refill_parks_the_finished_sequence_and_starts_the_next_prompt_from_the_scratch_prefix():
    pool, kv = make(workers=2)
    pool.begin_call()
    places, _ = run_group(pool, kv, [SYSTEM + [1, 2, 3], SYSTEM + [4]])
    finish_step(pool, kv, [0, 1], 90)
    finished = list(kv.held[places[1].slot])
    # The sequence on places[1] finishes; the call's next prompt takes its stream while the other
    # stream keeps decoding, and copies only the shared system text from the scratch stream.
    waiting = SYSTEM + [7, 8, 9]
    start = pool.refill(places[1].slot, waiting, 5)
    assert start == len(SYSTEM)
    assert kv.held[places[1].slot] == SYSTEM and places[1].slot in kv.stale
    assert pool.stash.holds(finished)
    kv.decode(places[1].slot, waiting[start:], start)  # its prompt, in the same decode as ...
    pool.extend(places[1].slot, waiting[start:])
    finish_step(pool, kv, [places[0].slot], 91)  # ... the other stream's next token
    check(pool, kv)
    # A later prompt that continues the finished conversation is restored from the stash.
    other = 1 - places[1].slot
    grown = finished + [60, 61]
    assert pool.refill(other, grown, 0) == len(finished)
    assert pool.stash.restored == 1 and kv.held[other] == finished
    check(pool, kv)


def test_refill_refuses_a_prompt_longer_than_its_stream():
    pool, kv = make(workers=2, per_slot=30)
    pool.begin_call()
    run_group(pool, kv, [SYSTEM + [1], SYSTEM + [2]])
    with pytest.raises(CapacityError, match="does not fit a stream of 30 cells"):
        pool.refill(0, SYSTEM + list(range(11)), 0)
