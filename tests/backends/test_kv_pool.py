"""The KV slot pool's bookkeeping against a simulated unified KV cache (no model needed).

The simulator keeps llama.cpp's semantics independently of the pool: a cell is a (position,
token) held by a set of sequence ids; `seq_cp` adds the destination to the source's cells in a
range, `seq_rm` removes a sequence from cells in a range, decoding creates new cells, and a cell
no sequence holds is free. After every call the pool's view (tokens per slot, cells in use) must
equal what the simulator holds.
"""
import numpy as np
import pytest

from ctrlsim.backends.llamacpp.kv import CapacityError, HostStash, SlotPool, common_prefix


class FakeKV:
    def __init__(self):
        self.cells: list[dict] = []  # {"pos", "token", "seqs": set}

    def seq_rm(self, seq, p0, p1):
        for cell in self.cells:
            if seq in cell["seqs"] and cell["pos"] >= p0 and (p1 < 0 or cell["pos"] < p1):
                cell["seqs"].discard(seq)
        self.cells = [c for c in self.cells if c["seqs"]]

    def seq_cp(self, src, dst, p0, p1):
        for cell in self.cells:
            if src in cell["seqs"] and cell["pos"] >= p0 and (p1 < 0 or cell["pos"] < p1):
                cell["seqs"].add(dst)

    def decode(self, seq, tokens, start):
        held = self.tokens(seq)
        assert len(held) == start, "a sequence must be extended right after what it holds"
        for offset, token in enumerate(tokens):
            self.cells.append({"pos": start + offset, "token": token, "seqs": {seq}})

    def save(self, seq):
        return tuple(self.tokens(seq))  # its length stands for its size in the stash's budget

    def load(self, seq, state):
        assert not self.tokens(seq), "a state is loaded on an empty sequence"
        if self.refuse_loads:
            return False
        self.decode(seq, list(state), 0)
        return True

    refuse_loads = False

    def clear(self):
        self.cells = []

    def tokens(self, seq):
        mine = sorted((c["pos"], c["token"]) for c in self.cells if seq in c["seqs"])
        assert [p for p, _ in mine] == list(range(len(mine))), "positions must be contiguous from 0"
        return [t for _, t in mine]


def run_call(pool, kv, prompts, reserve=None):
    """What ParallelContext does for one group: shared prefix, placement, decoding every prompt."""
    reserve = reserve or [0] * len(prompts)
    pool.begin_call()
    evaluated = 0
    pool.prepare(prompts)
    task = pool.shared_prefix_task(prompts)
    if task is not None:
        slot, start, tokens = task
        kv.decode(slot, tokens, start)
        pool.extend(slot, tokens)
        evaluated += len(tokens)
    places = pool.place(prompts, reserve)
    assert len({p.slot for p in places}) == len(prompts), "every prompt needs a slot of its own"
    for prompt, place in zip(prompts, places):
        assert kv.tokens(place.slot) == prompt[:place.start]
        assert place.start < len(prompt)
        kv.decode(place.slot, prompt[place.start:], place.start)
        pool.extend(place.slot, prompt[place.start:])
        evaluated += len(prompt) - place.start
    for n, slot in enumerate(pool.slots):
        assert kv.tokens(n) == slot.tokens
    assert pool.used_cells() == len(kv.cells)
    assert pool.used_cells() <= pool.capacity
    return places, evaluated


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_a_shared_prefix_is_evaluated_once_and_a_grown_conversation_only_its_new_tokens():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=9, capacity=1000)
    system = list(range(100, 150))  # 50 shared tokens
    prompts = [system + [n] * 10 for n in range(4)]
    _, evaluated = run_call(pool, kv, prompts)
    assert evaluated == 50 + 4 * 10  # the shared prefix once, each prompt's own tokens
    assert len(kv.cells) == 90  # cells are shared, not copied
    grown = [p + [7, 8, 9] for p in prompts]  # each conversation grew by a turn
    places, evaluated = run_call(pool, kv, grown)
    assert evaluated == 4 * 3
    assert [p.start for p in places] == [len(p) for p in prompts]


def test_identical_prompt_re_evaluates_only_its_last_token():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=5, capacity=100)
    run_call(pool, kv, [[1, 2, 3, 4]])
    _, evaluated = run_call(pool, kv, [[1, 2, 3, 4]])
    assert evaluated == 1


def test_a_prefix_of_very_different_lengths_and_a_branch_keep_the_source_whole():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=5, capacity=1000)
    long = list(range(300))
    run_call(pool, kv, [long])
    # A short prompt sharing 20 tokens, and a long one branching at 250: both copy, the source stays.
    places, evaluated = run_call(pool, kv, [long[:20] + [999], long[:250] + [998] * 5])
    assert evaluated == 1 + 5
    assert any(slot.tokens == long for slot in pool.slots)


def test_least_recently_used_slots_are_evicted_to_fit_the_budget():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=9, capacity=120)
    rng = np.random.default_rng(0)
    for call in range(12):  # unrelated prompts of 30-50 tokens, two at a time: the cache must turn over
        prompts = [list(rng.integers(0, 50, size=int(rng.integers(30, 50)))) for _ in range(2)]
        prompts = [[call * 1000 + 1] + [int(t) for t in p] for p in prompts]
        run_call(pool, kv, prompts, reserve=[5, 5])
    assert pool.evictions > 0
    # The latest call's prompts are what the cache holds.
    assert all(any(slot.tokens == p for slot in pool.slots) for p in prompts)


def test_reuse_off_starts_every_call_from_an_empty_cache():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=5, capacity=1000, reuse=False)
    run_call(pool, kv, [[1, 2, 3, 4]])
    _, evaluated = run_call(pool, kv, [[1, 2, 3, 4, 5]])
    assert evaluated == 5


def test_group_larger_than_the_budget_is_a_capacity_error():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=5, capacity=10)
    pool.begin_call()
    with pytest.raises(CapacityError):
        pool.place([list(range(8)), list(range(100, 108))], [0, 0])


def test_with_a_host_stash_the_cache_holds_only_what_the_current_prompts_start_from():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=9, capacity=1000, stash=HostStash(budget=10_000))
    conversations = [[1, 2, 3, 10 + n, 20 + n] for n in range(3)]
    run_call(pool, kv, conversations)
    other = [[7, 8, 9, 9, 9]]
    _, evaluated = run_call(pool, kv, other)
    assert evaluated == 5
    assert len(kv.cells) == 5  # the three conversations are parked, not scanned by this decode
    assert sorted(pool.stash.entries) == sorted(tuple(c) for c in conversations)
    grown = [c + [30, 31] for c in conversations]
    places, evaluated = run_call(pool, kv, grown)
    assert evaluated == 3 * 2  # each restored whole and continued in place
    assert [p.start for p in places] == [5, 5, 5]
    assert pool.stash.restored == 3 and tuple(other[0]) in pool.stash.entries


def test_the_stash_drops_the_least_recently_parked_past_its_budget():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=9, capacity=1000, stash=HostStash(budget=12))
    for n in range(4):  # each call parks the one before it (5 tokens each)
        run_call(pool, kv, [[n] * 5])
    assert list(pool.stash.entries) == [(1,) * 5, (2,) * 5]
    assert pool.stash.bytes == 10 and pool.stash.dropped == 1
    _, evaluated = run_call(pool, kv, [[0] * 5 + [4]])  # (0,)*5 was dropped: evaluated again
    assert evaluated == 6


def test_a_state_llama_cpp_cannot_place_is_evaluated_again():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=9, capacity=1000, stash=HostStash(budget=100))
    run_call(pool, kv, [[1, 2, 3, 4]])
    run_call(pool, kv, [[5, 6, 7]])
    kv.refuse_loads = True
    _, evaluated = run_call(pool, kv, [[1, 2, 3, 4, 8]])
    assert evaluated == 5 and pool.stash.dropped == 1 and pool.stash.restored == 0


def test_without_reuse_the_stash_is_not_used():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=5, capacity=1000, reuse=False, stash=HostStash(budget=100))
    run_call(pool, kv, [[1, 2, 3]])
    _, evaluated = run_call(pool, kv, [[1, 2, 3, 4]])
    assert evaluated == 4 and not pool.stash.entries


def test_a_slot_a_prompt_starts_from_keeps_only_that_prefix_and_is_parked_in_full():
    kv = FakeKV()
    pool = SlotPool(kv, n_slots=9, capacity=1000, stash=HostStash(budget=100))
    run_call(pool, kv, [[1, 2, 3, 4, 5, 6]])
    places, evaluated = run_call(pool, kv, [[1, 2, 9]])
    assert places[0].start == 2 and evaluated == 1
    assert (1, 2, 3, 4, 5, 6) in pool.stash.entries
    assert len(kv.cells) == 3


def test_groups_for_restored_sequences_count_every_prompt_whole():
    from ctrlsim.backends.llamacpp.parallel import plan_groups

    prompts = [list(range(10)) + [100 + n] * 10 for n in range(3)]  # 10 shared tokens, 10 own
    assert [g.members for g in plan_groups(prompts, 8, 45)] == [[0, 1, 2]]  # 10 + 3 * 10 cells
    assert [g.members for g in plan_groups(prompts, 8, 45, shared=False)] == [[0, 1], [2]]  # 20 each
