"""Separate KV streams per sequence (`kv_streams`) against the unified cache, on the bundled models.

Streams change only where each sequence's cells live and how llama.cpp slices a batch, so they
must give what the unified cache gives up to batching noise: greedy replies equal on prompts with
a clear answer (including prompts of very different lengths, more prompts than streams, and
sequences that finish at different steps, which moves the others down), ratings within the
documented 0.05 on the benchmark model, sampled replies replayed from their seeds, and a grown
conversation restored from the host stash evaluating only its new turn.
"""
import numpy as np
import pytest

from ctrlsim.backends.llamacpp.llm import LlamaCppLLM

pytestmark = pytest.mark.llm

FILLER = ("The archive holds letters, maps and diaries from the expedition, "
          "catalogued by year and place. ") * 20
ONLY = "Output only the numbers."
# Clear answers of different lengths, so the sequences finish at different steps.
COUNTING = [[{"role": "system", "content": system},
             {"role": "user", "content": f"Count from 1 to {n}, separated by commas. {ONLY}"}]
            for system, n in (("You are precise.", 9), (FILLER, 3), ("You are precise.", 5),
                              ("You are precise.", 2), (FILLER[:400], 7))]


def texts(replies):
    return [(r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in replies]


def pair(base, **options):
    """The same model with a unified cache and with streams, every other setting at the exact profile
    (small contexts keep the test light)."""
    settings = {"n_ctx": 1024, "n_parallel": 3, "kv_reuse": False, "flash_attn": False, **options}
    return (LlamaCppLLM(base.model_path, model_id=base.model_id, kv_streams=False, **settings),
            LlamaCppLLM(base.model_path, model_id=base.model_id, kv_streams=True, **settings))


def test_greedy_replies_equal_the_unified_cache_with_more_prompts_than_streams(smol):
    unified, streams = pair(smol)
    try:
        expected = unified.chat(COUNTING, max_tokens=30)
        got = streams.chat(COUNTING, max_tokens=30)
        assert texts(got) == texts(expected)
        assert got[0].text.startswith("1, 2, 3, 4, 5, 6, 7, 8, 9")
        # five prompts on three streams: two groups; early finishes moved later sequences down
        assert streams._parallel.pool.moves > 0
        assert streams.identity["kv_streams"] is True and "kv_streams" not in unified.identity
    finally:
        unified.close()
        streams.close()


def widths_of_each_decode(llm, monkeypatch):
    """Record how many sequences every decode of the parallel context extends (a shared prefix
    evaluated on its own, whose logits nobody reads, is not a step)."""
    from ctrlsim.backends.llamacpp.parallel import ParallelContext

    widths = []
    decode = ParallelContext._decode

    def recording(self, runs, on_output):
        if any(run.key is not None for run in runs):
            widths.append(len({run.seq for run in runs}))
        return decode(self, runs, on_output)

    monkeypatch.setattr(ParallelContext, "_decode", recording)
    return widths


def test_batching_is_continuous_a_waiting_prompt_takes_the_first_stream_that_frees(smol, monkeypatch):
    unified, streams = pair(smol)
    try:
        widths = widths_of_each_decode(streams, monkeypatch)
        grouped = unified.chat(COUNTING, max_tokens=30)
        grouped_decodes = len(widths)
        widths.clear()
        got = streams.chat(COUNTING, max_tokens=30)
        assert texts(got) == texts(grouped)
        # Five prompts on three streams: every decode is three sequences wide until no prompt
        # waits, and only then narrows (in groups, the first group's tail narrows while two wait).
        narrowing = next(n for n, w in enumerate(widths) if w < 3)
        assert all(w == 3 for w in widths[:narrowing])
        assert widths[narrowing:] == sorted(widths[narrowing:], reverse=True)
        assert len(widths) <= grouped_decodes
        # Streams decoded in groups (kept for side-by-side benchmarks) give the same replies.
        streams._parallel.continuous = False
        assert texts(streams.chat(COUNTING, max_tokens=30)) == texts(grouped)
    finally:
        unified.close()
        streams.close()


def test_a_grown_conversation_is_restored_and_evaluates_only_its_new_turn(smol):
    unified, streams = pair(smol, kv_reuse=True)
    try:
        first = streams.chat(COUNTING[:3], max_tokens=30)
        grown = [c + [{"role": "assistant", "content": r.text},
                      {"role": "user", "content": "Now count from 1 to 4, separated by commas."}]
                 for c, r in zip(COUNTING, first)]
        before = streams.evaluated_tokens
        again = streams.chat(grown, max_tokens=12)
        evaluated = streams.evaluated_tokens - before
        assert streams._parallel.pool.stash.restored >= 3
        assert evaluated < sum(r.prompt_tokens for r in again) / 3
        assert texts(again) == texts(unified.chat(grown, max_tokens=12))
    finally:
        unified.close()
        streams.close()


def test_ratings_agree_with_the_unified_cache_within_005(qwen05):
    unified, streams = pair(qwen05)
    profile = ("I love science fiction films: space battles, aliens, robots and the future. "
               "I find romantic comedies boring and never watch them.")
    items = ("Star Wars (1977)", "Pretty Woman (1990)", "Alien (1979)", "Notting Hill (1999)")
    convs = [[{"role": "system", "content": "You are a movie recommender."},
              {"role": "user", "content": f"User profile: {profile}\n\nHow much would this user enjoy "
                                          f"the movie {item}? Rate it from 0 (not at all) to 5 (very much)."}]
             for item in items]
    try:
        off, on = unified.rate(convs), streams.rate(convs)
        assert np.abs(on - off).max() <= 0.05
        assert on[0] > on[1] and on[2] > on[3]  # liked genre above disliked, as the profile says
    finally:
        unified.close()
        streams.close()


def test_sampled_replies_replay_from_their_seeds(smol):
    _, streams = pair(smol)
    story = [[{"role": "user", "content": f"Write one sentence about a {topic}."}]
             for topic in ("dragon", "harbour", "violin", "glacier")]
    try:
        seeds = [11, 12, 13, 14]
        batch = streams.chat(story, max_tokens=16, temperature=1.0, seed=seeds)
        assert texts(streams.chat(story, max_tokens=16, temperature=1.0, seed=seeds)) == texts(batch)
        alone = streams.chat(story[1:2], max_tokens=16, temperature=1.0, seed=[12])
        assert alone[0].text == batch[1].text
    finally:
        streams.close()


def test_a_reply_gets_the_rest_of_its_stream_as_the_sequential_context_gives_it(smol):
    _, streams = pair(smol)
    long = [[{"role": "system", "content": FILLER * 2},
             {"role": "user", "content": "Count from 1 to 500, separated by commas."}]]
    try:
        reply = streams.chat(long, max_tokens=600)[0]
        assert reply.prompt_tokens > 600  # so 600 more tokens would not fit a stream of 1024 cells
        assert reply.prompt_tokens + reply.completion_tokens == 1024
        assert reply.finish_reason == "length"
    finally:
        streams.close()


def test_streams_grow_with_the_longest_sequence_and_their_size_changes_no_number(smol):
    """Streams take their cells up front, so they start at 2,048 cells and grow in powers of two to
    `n_ctx` as a call needs; the logits of one prompt are the same in streams of any size."""
    from ctrlsim.backends.llamacpp.llm import STREAM_MIN_CELLS

    short = [[{"role": "user", "content": f"Rate the film number {i} from 0 to 5 with one digit."}]
             for i in range(4)]
    long = [[{"role": "system", "content": FILLER * 7}, {"role": "user", "content": "Say OK."}]]
    growing = LlamaCppLLM(smol.model_path, model_id=smol.model_id, n_ctx=8192, n_parallel=3, kv_streams=True)
    fixed = LlamaCppLLM(smol.model_path, model_id=smol.model_id, n_ctx=8192, n_parallel=3, kv_streams=True)
    fixed.stream_cells = lambda need: 8192  # streams at the full n_ctx from the start
    try:
        small = growing.rate(short)
        assert growing._parallel.per_stream == STREAM_MIN_CELLS == 2048
        need = len(growing.tokenize(growing.render(long[0]))) + 4
        assert 2048 < need <= 4096  # the filler needs the next power of two
        growing.chat(long, max_tokens=4)
        assert growing._parallel.per_stream == 4096
        growing.rate(short)  # a shorter call keeps the grown streams
        assert growing._parallel.per_stream == 4096
        # the same calls in streams of 8,192 cells: the same numbers (a later call's numbers depend
        # on what KV reuse kept from earlier calls, so only first calls are compared)
        assert np.array_equal(small, fixed.rate(short)) and fixed._parallel.per_stream == 8192
    finally:
        growing.close()
        fixed.close()
