"""KV prefix reuse across calls and seeded parallel sampling, on the bundled llama.cpp models.

Reuse on must give what reuse off gives: greedy replies equal on prompts with a clear answer,
ratings within the documented tolerance (0.05 on the benchmark model), while evaluating only
the tokens the cache does not hold. Sampled replies come from each conversation's own seed.
"""
from contextlib import contextmanager

import numpy as np
import pytest

from ctrlsim.backends.llamacpp.llm import LlamaCppLLM
from ctrlsim.errors import ConfigError

pytestmark = pytest.mark.llm

FILLER = ("The archive holds letters, maps and diaries from the expedition, "
          "catalogued by year and place. ") * 20
ONLY = "Output only the numbers."
COUNTING = [[{"role": "system", "content": system},
             {"role": "user", "content": f"Count from 1 to {n}, separated by commas. {ONLY}"}]
            for system, n in (("You are precise.", 6), (FILLER, 7), ("You are precise.", 5))]


@contextmanager
def reuse(llm, on: bool):
    before = llm.kv_reuse
    llm.kv_reuse = on
    llm.reset_kv()
    try:
        yield llm
    finally:
        llm.kv_reuse = before


def texts(replies):
    return [(r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in replies]


def test_a_grown_conversation_evaluates_only_its_new_tokens_and_replies_as_from_scratch(smol):
    first = COUNTING[0]
    with reuse(smol, True):
        reply = smol.chat([first], max_tokens=16)[0]
        grown = first + [{"role": "assistant", "content": reply.text},
                         {"role": "user", "content": "Now count from 1 to 4, separated by commas."}]
        before = smol.evaluated_tokens
        again = smol.chat([grown], max_tokens=12)[0]
        evaluated = smol.evaluated_tokens - before
    new_tokens = again.prompt_tokens - reply.prompt_tokens
    # Only the new turn (plus the reply's last tokens the template writes differently) is evaluated.
    assert evaluated < new_tokens + reply.completion_tokens + again.completion_tokens + 4
    assert evaluated < again.prompt_tokens / 2
    with reuse(smol, False):
        fresh = smol.chat([grown], max_tokens=12)[0]
    assert texts([again]) == texts([fresh])
    assert again.text.startswith("1, 2, 3")


def test_greedy_replies_equal_with_reuse_on_and_off_for_prefixes_of_very_different_lengths(smol):
    with reuse(smol, False):
        off = [smol.chat(COUNTING, max_tokens=16), smol.chat(COUNTING[::-1], max_tokens=16)]
    with reuse(smol, True):
        on = [smol.chat(COUNTING, max_tokens=16), smol.chat(COUNTING[::-1], max_tokens=16)]
    assert texts(on[0]) == texts(off[0]) and texts(on[1]) == texts(off[1])
    assert texts(on[1]) == texts(on[0])[::-1]


def test_ratings_agree_with_reuse_on_and_off_within_005(qwen05):
    profile = ("I love science fiction films: space battles, aliens, robots and the future. "
               "I find romantic comedies boring and never watch them.")
    # Pairs Qwen2.5-0.5B tells apart by about 0.1 (Alien against Notting Hill it does not, on AVX-512).
    items = ("Star Wars (1977)", "Pretty Woman (1990)",
             "The Terminator (1984)", "Sleepless in Seattle (1993)")
    convs = [[{"role": "system", "content": "You are a movie recommender."},
              {"role": "user", "content": f"User profile: {profile}\n\nHow much would this user enjoy "
                                          f"the movie {item}? Rate it from 0 (not at all) to 5 (very much)."}]
             for item in items]
    with reuse(qwen05, False):
        off = qwen05.rate(convs)
    with reuse(qwen05, True):
        qwen05.rate(convs[:1])  # the profile prefix is now cached from another call
        before = qwen05.evaluated_tokens
        on = qwen05.rate(convs)
        evaluated = qwen05.evaluated_tokens - before
    assert np.abs(on - off).max() <= 0.05
    assert on[0] > on[1] and on[2] > on[3]  # liked genre above disliked, as the profile says
    prompt_tokens = sum(len(qwen05.tokenize(qwen05.render(c, "Rating: "))) for c in convs)
    assert evaluated < prompt_tokens / 3  # only each item's own tail is evaluated


@pytest.mark.parametrize("host_mb", [0, 64])
def test_a_small_kv_budget_evicts_or_parks_and_still_gives_the_same_replies(smol, host_mb):
    # the unified cache's budget is what is tested: streams (the default) hold no shared budget
    small = LlamaCppLLM(smol.model_path, n_ctx=512, parallel_ctx=512, n_parallel=2, kv_slots=5,
                        kv_reuse=True, kv_host_mb=host_mb, kv_streams=False)
    try:
        prompts = [[{"role": "user", "content": f"Count from 1 to {n}, separated by commas."}]
                   for n in (3, 4)]
        long = [[{"role": "system", "content": (FILLER * 2)[:2350]},
                 {"role": "user", "content": "Count from 1 to 5."}]]
        first = small.chat(prompts, max_tokens=12)
        small.chat(long, max_tokens=12)  # needs most of the budget: the first prompts' cells go
        pool = small._parallel.pool
        assert pool.used_cells() <= 512
        assert pool.evictions > 0 if host_mb == 0 else pool.stash.parked > 0
        again = small.chat(prompts, max_tokens=12)
        assert texts(again) == texts(first)
        small.kv_reuse = False
        small.reset_kv()
        assert texts(small.chat(prompts, max_tokens=12)) == texts(first)
    finally:
        small.close()


def test_sampled_batch_replays_from_its_seeds_and_each_seed_draws_its_own_reply(qwen05):
    story = [[{"role": "user", "content": f"Write one sentence about a {topic}."}]
             for topic in ("dragon", "harbour", "violin")]
    kwargs = {"max_tokens": 16, "temperature": 1.0}
    qwen05.reset_kv()
    batch = qwen05.chat(story, seed=[11, 12, 13], **kwargs)
    qwen05.reset_kv()
    assert texts(qwen05.chat(story, seed=[11, 12, 13], **kwargs)) == texts(batch)
    other_seeds = qwen05.chat(story, seed=[21, 22, 23], **kwargs)
    assert all(a.text != b.text for a, b in zip(other_seeds, batch))
    # Every drawn token is one the model gives real probability (a sequence reading another's
    # logits row, or a wrong position, draws tokens far below that).
    prompts = [qwen05.tokenize(qwen05.render(c)) for c in story]
    for prompt, reply in zip(prompts, batch):
        tokens = qwen05._llm.tokenize(reply.text.encode(), add_bos=False, special=False)[:8]
        qwen05.reset_kv()
        for j, token in enumerate(tokens):
            logits = qwen05._last_logits_sequential(prompt + tokens[:j])
            assert logits[token] >= logits.max() - 8.0, (reply.text, j)


def test_a_sampled_reply_does_not_depend_on_the_rest_of_the_batch_on_a_clear_prompt(qwen05):
    count = [{"role": "user", "content": f"Count from 1 to 8, separated by commas. {ONLY}"}]
    others = [[{"role": "user", "content": f"Write one sentence about a {topic}."}]
              for topic in ("cat", "sea")]
    kwargs = {"max_tokens": 20, "temperature": 0.7}
    qwen05.reset_kv()
    alone = qwen05.chat([count], seed=[7], **kwargs)[0]
    qwen05.reset_kv()
    batched = qwen05.chat(others + [count], seed=[1, 2, 7], **kwargs)[2]
    assert texts([batched]) == texts([alone])
    assert alone.text.startswith("1, 2, 3, 4")


def test_a_sampled_parallel_reply_is_the_sequential_sampler_chains_reply(qwen05):
    conv = [{"role": "user", "content": "Name a colour."}]
    kwargs = {"max_tokens": 10, "temperature": 0.8, "top_p": 0.95}
    qwen05.reset_kv()
    parallel = qwen05.chat([conv], seed=5, **kwargs)
    before = qwen05.n_parallel
    qwen05.n_parallel = 1
    try:
        sequential = qwen05.chat([conv], seed=5, **kwargs)
    finally:
        qwen05.n_parallel = before
    assert texts(parallel) == texts(sequential)


def test_a_conversation_parked_in_host_memory_is_restored_and_continues_as_from_scratch(smol):
    assert smol.kv_host_mb > 0
    with pytest.raises(ConfigError, match="kv_host_mb"):
        LlamaCppLLM(smol.model_path, kv_host_mb=-1)
    with reuse(smol, True):
        replies = smol.chat(COUNTING, max_tokens=16)
        unrelated = [[{"role": "user", "content": f"Name a {thing}."}] for thing in ("river", "bird")]
        smol.chat(unrelated, max_tokens=8)  # parks the three counting conversations
        stash = smol._parallel.pool.stash
        assert len(stash.entries) >= 3 and smol._parallel.pool.used_cells() < 200
        grown = [c + [{"role": "assistant", "content": r.text},
                      {"role": "user", "content": "Now count from 1 to 3, separated by commas."}]
                 for c, r in zip(COUNTING, replies)]
        before = smol.evaluated_tokens
        again = smol.chat(grown, max_tokens=12)
        evaluated = smol.evaluated_tokens - before
        assert stash.restored >= 3
    assert evaluated < sum(a.prompt_tokens for a in again) / 3
    with reuse(smol, False):
        fresh = smol.chat(grown, max_tokens=12)
    assert texts(again) == texts(fresh)
    assert again[0].text.startswith("1, 2, 3") and again[2].text.startswith("1, 2, 3")
