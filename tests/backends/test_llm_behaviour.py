"""Behaviour of the bundled LLMs through the common interface (llama.cpp runtime)."""
import numpy as np
import pytest
from rating_items import ROMCOM, SCIFI, rating_prompt

from ctrlsim.backends.llm import expected_rating, parse_first_number


@pytest.mark.llm
def test_rate_puts_scifi_above_romcom_for_scifi_fan(qwen05):
    scifi = qwen05.rate([rating_prompt(i) for i in SCIFI])
    romcom = qwen05.rate([rating_prompt(i) for i in ROMCOM])
    assert np.all((scifi >= 0) & (scifi <= 5))
    assert scifi.mean() > romcom.mean()


@pytest.mark.llm
@pytest.mark.slow
def test_rate_separates_clearly_on_default_model(llm_or_skip):
    llm = llm_or_skip("qwen2.5-1.5b")
    scifi = llm.rate([rating_prompt(i) for i in SCIFI])
    romcom = llm.rate([rating_prompt(i) for i in ROMCOM])
    assert scifi.mean() - romcom.mean() > 1.0
    assert scifi.min() > romcom.max()


@pytest.mark.llm
def test_chat_follows_one_word_instruction(qwen05):
    question = "What is the capital of France? Answer with exactly one word."
    reply = qwen05.chat([[{"role": "user", "content": question}]],
                        max_tokens=8)[0]
    assert reply.text.strip().strip(".").lower() == "paris"
    assert reply.completion_tokens >= 1


@pytest.mark.llm
def test_token_counts_add_up_across_a_batch(smol):
    smol.meter.reset()
    convs = [[{"role": "user", "content": f"Count to {n}."}] for n in (2, 3, 4)]
    replies = smol.chat(convs, max_tokens=12, keys=["a", "b", "a"])
    total = smol.meter.total
    assert total.prompt_tokens == sum(r.prompt_tokens for r in replies)
    assert total.completion_tokens == sum(r.completion_tokens for r in replies) > 0
    assert total.calls == 3
    a = smol.meter.usage("a")
    assert a.completion_tokens == replies[0].completion_tokens + replies[2].completion_tokens
    ratings = smol.rate([rating_prompt(SCIFI[0])], keys=["b"])
    assert smol.meter.usage("b").completion_tokens == replies[1].completion_tokens + 1
    assert smol.meter.total.calls == 4 and len(ratings) == 1


@pytest.mark.llm
@pytest.mark.parametrize("n_parallel", [1, 16])
def test_prefix_reuse_gives_the_same_ratings_with_fewer_evaluated_tokens(smol, n_parallel):
    prompts = [rating_prompt(i) for i in SCIFI + ROMCOM]
    smol.n_parallel = 1
    separately = []
    for p in prompts:
        smol.reset_kv()  # clear the KV cache: every prompt evaluated from scratch, one at a time
        separately.append(smol.rate([p])[0])
    smol.n_parallel = n_parallel
    try:
        smol.reset_kv()
        before = smol.evaluated_tokens
        shared = smol.rate(prompts)
        reused_cost = smol.evaluated_tokens - before
    finally:
        smol.n_parallel = 16
    full_cost = sum(len(smol.tokenize(smol.render(p, "Rating: "))) for p in prompts)
    # llama.cpp's CPU logits depend slightly on how tokens were split into batches (parallel
    # sequences share each ubatch, a cached prefix is evaluated apart from its suffix): on this
    # tiny model, at the default profile, by up to 0.156 (docs/performance.md, "Same results?").
    assert np.allclose(shared, separately, atol=0.16)
    assert reused_cost < 0.5 * full_cost


@pytest.mark.llm
def test_generate_and_parse_rating_is_seeded_and_parses(smol):
    convs = [rating_prompt(i) for i in SCIFI[:3]]
    a, texts = smol.rate_by_generation(convs, rng=np.random.default_rng(0))
    b, _ = smol.rate_by_generation(convs, rng=np.random.default_rng(0))
    assert np.array_equal(a, b)
    for score, text in zip(a, texts):
        parsed = parse_first_number(text)
        assert score == pytest.approx(0.0 if parsed is None else parsed, abs=1e-5)


def test_parsers():
    assert parse_first_number("I'd say 4 out of 5") == 4.0
    assert parse_first_number("Rating: 3.5") == 3.5
    assert parse_first_number("no idea") is None
    logprobs = np.array([-np.inf, -np.inf, -np.inf, -np.inf, 0.0, -30.0])
    assert expected_rating(logprobs) == pytest.approx(4.0, abs=1e-6)
    assert expected_rating(np.log([1, 1, 1, 1, 1, 1])) == pytest.approx(2.5)
