"""Flash attention in the llama.cpp backend: the switch reaches both contexts, is recorded, keys the
response cache apart, and keeps replies and ratings within the documented noise."""
import numpy as np
import pytest

from ctrlsim.backends import load_llm

PROMPTS = [[{"role": "user", "content": text}] for text in (
    "What is the capital of France? Answer in one word.", "What is 2 + 2? Answer with a number.",
    "Repeat exactly: the quick brown fox")]


@pytest.mark.llm
def test_flash_attention_reaches_both_contexts_and_is_recorded_only_when_on(monkeypatch):
    pytest.importorskip("llama_cpp")
    import llama_cpp

    on = load_llm("smollm2-135m@exact@flash_attn=1")
    off = load_llm("smollm2-135m@exact")
    try:
        assert on.identity["flash_attn"] is True and "flash_attn" not in off.identity
        assert on.cache_identity() == off.cache_identity() + ":flash"
        batched = [r.text for r in on.chat(PROMPTS, max_tokens=8)]  # the parallel context
        alone = on.chat(PROMPTS[:1], max_tokens=8)[0].text  # the sequential context
        off.chat(PROMPTS[:1], max_tokens=2)
        assert on._llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        assert off._llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        assert on._parallel is not None  # it copies the sequential context's settings, this one included
        assert "Paris" in alone and "Paris" in batched[0] and "4" in batched[1]
    finally:
        on.close()
        off.close()


@pytest.mark.llm
def test_ratings_and_replies_with_flash_attention_stay_within_its_documented_noise():
    """docs/performance.md: on the benchmark model flash attention moves ratings by up to about
    0.06, a liked item still rates above a disliked one, and greedy replies to clear prompts are
    the same (on the 135M model near-ties already split "2 + 2 = 4" from "The answer is 4.")."""
    profile = "I love science fiction films and find romantic comedies boring."
    convs = [[{"role": "system", "content": "You are a movie recommender."},
              {"role": "user", "content": f"User profile: {profile}\n\nHow much would this user enjoy the "
                                          f"movie {item}? Rate it from 0 (not at all) to 5 (very much)."}]
             for item in ("Star Wars (1977)", "Alien (1979)", "Pretty Woman (1990)", "Notting Hill (1999)")]
    # flash attention alone changed from the exact profile (the default profile has it on)
    exact, flash = load_llm("qwen2.5-0.5b@exact"), load_llm("qwen2.5-0.5b@exact@flash_attn=1")
    try:
        off = np.array(exact.rate(convs))
        off_replies = [r.text for r in exact.chat(PROMPTS, max_tokens=8)]
        on = np.array(flash.rate(convs))
        on_replies = [r.text for r in flash.chat(PROMPTS, max_tokens=8)]
    finally:
        exact.close()
        flash.close()
    assert np.abs(on - off).max() <= 0.08
    assert on[:2].mean() > on[2:].mean()
    assert on_replies == off_replies
