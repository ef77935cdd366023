"""llama.cpp parallel sequences against the sequential path on the bundled models.

llama.cpp's CPU logits depend slightly on how tokens are grouped into a batch, so
a free-running reply can take a different branch where two tokens are nearly
tied. The tests therefore check (1) exact equality on prompts with a clear
answer, and (2) for free replies, that every token the parallel path chose is a
greedy choice of the sequential model up to that batching noise (teacher-forced).
"""
from contextlib import contextmanager

import numpy as np
import pytest

pytestmark = pytest.mark.llm

FILLER = ("The archive holds letters, maps and diaries from the expedition, "
          "catalogued by year and place. ") * 24
DECISIVE = [
    [{"role": "user", "content": "Count from 1 to 8, separated by commas. Output only the numbers."}],
    [{"role": "system", "content": FILLER},
     {"role": "user", "content": "Count from 1 to 6, separated by commas."}],
    [{"role": "user",
      "content": "List the first five letters of the English alphabet, separated by spaces."}],
    [{"role": "system", "content": FILLER[:300]}, {"role": "user", "content": "Count from 1 to 5."}],
]


@contextmanager
def sequences(llm, n):
    before = llm.n_parallel
    llm.n_parallel = n
    try:
        yield llm
    finally:
        llm.n_parallel = before


def same_replies(a, b):
    return [(x.text, x.prompt_tokens, x.completion_tokens, x.finish_reason) for x in a] == \
        [(x.text, x.prompt_tokens, x.completion_tokens, x.finish_reason) for x in b]


def test_prompts_differ_a_lot_in_length(smol):
    lengths = [len(smol.tokenize(smol.render(c))) for c in DECISIVE]
    assert max(lengths) > 8 * min(lengths)


def test_greedy_chat_equals_sequential_on_clear_prompts(smol):
    with sequences(smol, 1):
        sequential = smol.chat(DECISIVE, max_tokens=14)
    with sequences(smol, 16):
        parallel = smol.chat(DECISIVE, max_tokens=14)
    assert same_replies(parallel, sequential)
    assert parallel[0].text.startswith("1, 2, 3")


def test_batch_over_the_sequence_limit_is_split(smol):
    with sequences(smol, 1):
        sequential = smol.chat(DECISIVE, max_tokens=14)
    with sequences(smol, 2):  # 4 conversations, 2 worker sequences: two groups
        split = smol.chat(DECISIVE, max_tokens=14)
        assert smol._parallel.workers == 2
    assert same_replies(split, sequential)


def test_stop_strings_and_token_limit_follow_create_completion(smol):
    count = DECISIVE[:1]
    for kwargs in ({"max_tokens": 3}, {"max_tokens": 24, "stop": [","]},
                   {"max_tokens": 24, "stop": ["4", "2,"]}):
        with sequences(smol, 1):
            sequential = smol.chat(count, **kwargs)
        with sequences(smol, 16):
            parallel = smol.chat(count, **kwargs)
        assert same_replies(parallel, sequential), kwargs
    assert parallel[0].finish_reason == "stop" and "4" not in parallel[0].text


def test_empty_batch(smol):
    assert smol.chat([]) == []
    assert smol.rate([]).shape == (0,)


def test_every_parallel_token_is_a_greedy_choice_of_the_sequential_model(smol):
    free = [[{"role": "user", "content": f"Describe a {topic} film in one sentence."}]
            for topic in ("space", "pirate", "zombie")] + [DECISIVE[1]]
    prompts = [smol.tokenize(smol.render(conv)) for conv in free]
    with sequences(smol, 16):
        replies = smol._parallel_context().generate(prompts, [12] * len(prompts), stop=())
    for prompt, reply in zip(prompts, replies):
        assert len(reply.tokens) > 0
        smol.reset_kv()
        for j, token in enumerate(reply.tokens):
            logits = smol._last_logits_sequential(prompt + reply.tokens[:j])
            # a bug (a sequence seeing another's cells, a wrong position) picks tokens far below the top
            assert logits[token] >= logits.max() - 1.5, (reply.text, j)


def test_parallel_ratings_match_sequential_for_prompts_of_very_different_length(qwen05):
    items = ["Alien (1979)", "Notting Hill (1999)", "Toy Story (1995)"]
    convs = [[{"role": "system", "content": system},
              {"role": "user", "content": f"How much would a horror fan enjoy {item}? Rate it from 0 to 5."}]
             for system in ("You rate movies.", FILLER[:900]) for item in items]
    with sequences(qwen05, 1):
        qwen05.reset_kv()
        sequential = qwen05.rate(convs)
    with sequences(qwen05, 2):  # also over the sequence limit
        split = qwen05.rate(convs)
    with sequences(qwen05, 16):
        parallel = qwen05.rate(convs)
    # The tolerance, on the benchmark model (on the 135M model batching noise alone moves
    # these ratings by up to 0.2: its digit distribution is nearly flat).
    assert np.allclose(parallel, sequential, atol=0.05)
    assert np.allclose(split, sequential, atol=0.05)
    assert not np.allclose(sequential[:3], sequential[3:], atol=1e-3)  # the long prefix changes the ratings


def test_ratings_on_the_benchmark_model_agree_within_005(qwen05):
    profile = ("I love science fiction films: space battles, aliens, robots and the future. "
               "I find romantic comedies boring and never watch them.")
    convs = [[{"role": "system", "content": "You are a movie recommender."},
              {"role": "user", "content": f"User profile: {profile}\n\nHow much would this user enjoy "
                                          f"the movie {item}? Rate it from 0 (not at all) to 5 (very much)."}]
             for item in ("Star Wars (1977)", "Alien (1979)", "Pretty Woman (1990)", "Notting Hill (1999)",
                          "The Matrix (1999)", "French Kiss (1995)")]
    with sequences(qwen05, 1):
        qwen05.reset_kv()
        sequential = qwen05.rate(convs)
    with sequences(qwen05, 16):
        parallel = qwen05.rate(convs)
    assert np.abs(parallel - sequential).max() <= 0.05
