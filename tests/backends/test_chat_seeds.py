"""`chat(seed=...)` with one seed per conversation: own params, own cache key, own draws.

The fake runtime below records every `_generate` call, so the grouping and the seeds each
conversation was generated with are checked without a model; one test on the smallest bundled
model shows the bug this fixes (one int seed: identical conversations draw identical replies).
"""
import hashlib
import json
import threading

import pytest

from ctrlsim.backends import ResponseCache
from ctrlsim.backends.llm import LLM, Completion
from ctrlsim.errors import ConfigError

A = [{"role": "user", "content": "Name a colour."}]
B = [{"role": "user", "content": "Name a fruit."}]
C = [{"role": "user", "content": "Name a river."}]


class RecordingLLM(LLM):
    """Replies "<prompt> @ seed <seed>"; every `_generate` call is kept as (prompts, seed)."""

    runtime = "recording"

    def __init__(self, **kwargs):
        super().__init__("fake-model", **kwargs)
        self.calls: list[tuple[list[str], int | None]] = []

    def _generate(self, conversations, params):
        self.calls.append(([c[-1]["content"] for c in conversations], params.seed))
        return [Completion(f"{c[-1]['content']} @ seed {params.seed}", 3, 2) for c in conversations]

    def _digit_logprobs(self, conversations, prefix):
        raise AssertionError("not used")


def expected_key(conv, seed, *, temperature=1.0, max_tokens=10) -> str:
    """The chat cache key as the cache format defines it, written out here independently."""
    params = {"max_tokens": max_tokens, "temperature": temperature, "top_p": 1.0, "seed": seed, "stop": []}
    blob = json.dumps({"model": "recording:fake-model", "kind": "chat", "payload": conv, "params": params},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


# The key of `chat([A], max_tokens=10, temperature=1.0, seed=7)` as the code before per-conversation
# seeds computed it: replies cached then must still be found.
KEY_A_SEED_7 = "1b6a577a95f4d7923beaf6e13f26bd92d2f46fea91c81f97c5dfce50c6f604c5"


def test_a_seed_list_generates_each_conversation_with_its_own_seed_grouped_in_order(tmp_path):
    llm = RecordingLLM(cache=ResponseCache(tmp_path / "cache.sqlite"))
    out = llm.chat([A, B, C], max_tokens=10, temperature=1.0, seed=[1, 2, 1], keys=["a", "b", "c"])
    assert [o.text for o in out] == ["Name a colour. @ seed 1", "Name a fruit. @ seed 2",
                                     "Name a river. @ seed 1"]
    # One call per group of identical params, groups in order of first appearance.
    assert llm.calls == [(["Name a colour.", "Name a river."], 1), (["Name a fruit."], 2)]
    assert llm.meter.usage("b").calls == 1 and llm.meter.total.calls == 3
    # Each reply is cached under its own conversation's seed.
    stored = llm.cache.get_many([expected_key(A, 1), expected_key(B, 2), expected_key(C, 1),
                                 expected_key(B, 1)])
    assert set(stored) == {expected_key(A, 1), expected_key(B, 2), expected_key(C, 1)}
    assert stored[expected_key(B, 2)]["text"] == "Name a fruit. @ seed 2"
    llm.calls.clear()
    again = llm.chat([A, B, C], max_tokens=10, temperature=1.0, seed=[1, 2, 1])
    assert [o.text for o in again] == [o.text for o in out] and all(o.cached for o in again)
    assert llm.calls == []
    # A new seed for one conversation: only that one is generated.
    llm.chat([A, B, C], max_tokens=10, temperature=1.0, seed=[1, 3, 1])
    assert llm.calls == [(["Name a fruit."], 3)]


def test_one_int_seed_keeps_one_call_and_the_old_cache_keys(tmp_path):
    assert expected_key(A, 7) == KEY_A_SEED_7
    llm = RecordingLLM(cache=ResponseCache(tmp_path / "cache.sqlite"))
    llm.chat([A, B], max_tokens=10, temperature=1.0, seed=7)
    assert llm.calls == [(["Name a colour.", "Name a fruit."], 7)]
    assert set(llm.cache.get_many([KEY_A_SEED_7, expected_key(B, 7)])) == {KEY_A_SEED_7, expected_key(B, 7)}
    # A list of equal seeds is the same call and finds the same cached replies.
    llm.calls.clear()
    assert all(o.cached for o in llm.chat([A, B], max_tokens=10, temperature=1.0, seed=[7, 7]))
    assert llm.calls == []


def test_unseeded_sampling_is_not_cached_and_greedy_is(tmp_path):
    llm = RecordingLLM(cache=ResponseCache(tmp_path / "cache.sqlite"))
    llm.chat([A], max_tokens=10, temperature=1.0)
    assert len(llm.cache) == 0
    llm.chat([A], max_tokens=10, temperature=0.0)
    assert set(llm.cache.get_many([expected_key(A, None, temperature=0.0)])) == {
        expected_key(A, None, temperature=0.0)}


@pytest.mark.parametrize("seed, match", [
    ([1, 2], "got 2 seeds for 3 conversations"),
    ([1, 2, 3, 4], "got 4 seeds for 3 conversations"),
    ([1, "2", 3], "must be an int"),
    ([1, True, 3], "must be an int"),
    ("123", "sequence of ints"),
    (1.5, "sequence of ints"),
])
def test_bad_seeds_are_config_errors(seed, match):
    llm = RecordingLLM()
    with pytest.raises(ConfigError, match=match):
        llm.chat([A, B, C], temperature=1.0, seed=seed)
    assert llm.calls == []


def test_openai_compatible_runtime_sends_each_request_its_own_seed_together():
    pytest.importorskip("openai")
    from ctrlsim.backends.openai_compat import OpenAICompatLLM

    class Recording(OpenAICompatLLM):
        def __init__(self, *args, **kwargs):
            self.bodies, self.lock = [], threading.Lock()
            super().__init__(*args, **kwargs)

        def _chat_completion(self, body):
            with self.lock:
                self.bodies.append(body)
            reply = f"{body['messages'][-1]['content']} @ seed {body.get('seed')}"
            return {"message": {"content": reply}}, {"prompt_tokens": 3, "completion_tokens": 2}

    llm = Recording("http://127.0.0.1:9/v1", model="m")  # nothing is sent: `_chat_completion` answers
    out = llm.chat([A, B, C], max_tokens=10, temperature=1.0, seed=[4, 5, 6])
    assert [o.text for o in out] == ["Name a colour. @ seed 4", "Name a fruit. @ seed 5",
                                     "Name a river. @ seed 6"]
    assert sorted(b["seed"] for b in llm.bodies) == [4, 5, 6]
    llm.bodies.clear()
    llm.chat([A, B], max_tokens=10, temperature=1.0, seed=9)
    assert [b["seed"] for b in llm.bodies] == [9, 9]


@pytest.mark.llm
def test_per_conversation_seeds_give_independent_replayable_draws(smol):
    prompt = [{"role": "user", "content": "Write one short sentence about a random animal."}]
    batch = [prompt] * 6
    seeds = [101, 102, 103, 104, 105, 106]

    def draw(seed):
        smol.reset_kv()  # the same KV state each time: an uncached draw replays exactly from it
        return [c.text for c in smol.chat(batch, max_tokens=12, temperature=1.0, seed=seed)]

    first = draw(seeds)
    assert len(set(first)) > 1, first  # copies of one conversation draw differently
    assert draw(seeds) == first  # and each draw replays
    # (That a draw does not depend on the rest of the batch beyond batching noise is checked on the
    # benchmark model: tests/backends/test_prefix_reuse.py. On this tiny model the noise alone, even
    # from the batch's order, moves sampled tokens.)
    # One int seed for the batch (the old behaviour): every copy shares the draw.
    shared = draw(101)
    assert len(set(shared)) == 1 and draw([101] * 6) == shared  # a sequence of equal seeds is the same
