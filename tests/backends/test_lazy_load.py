"""No model load when the cache answers: handles load weights on the first cache miss."""
import numpy as np
import pytest

from ctrlsim.backends import ResponseCache, load_encoder

pytestmark = pytest.mark.llm

CONVS = [[{"role": "user", "content": "Name one fruit."}], [{"role": "user", "content": "Name one colour."}]]


def test_llm_loads_on_the_first_cache_miss_only(tmp_path, llm_or_skip):
    cache_path = tmp_path / "responses.sqlite"
    cold = llm_or_skip("smollm2-135m", cache=ResponseCache(cache_path))
    assert not cold.loaded  # construction reads no weights
    replies = cold.chat(CONVS, max_tokens=6)
    ratings = cold.rate(CONVS)
    assert cold.loaded
    cold.close()

    warm = llm_or_skip("smollm2-135m", cache=ResponseCache(cache_path))
    again = warm.chat(CONVS, max_tokens=6)
    assert np.array_equal(warm.rate(CONVS), ratings)
    assert [r.text for r in again] == [r.text for r in replies] and all(r.cached for r in again)
    assert not warm.loaded  # every answer came from the cache
    warm.chat(CONVS[:1], max_tokens=7)  # a new parameter: a miss
    assert warm.loaded


def test_encoder_loads_on_the_first_cache_miss_only(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path))
    try:
        cold = load_encoder("minilm")
    except ImportError as exc:  # MissingDependencyError is an ImportError
        pytest.skip(str(exc))
    assert not cold.loaded
    vectors = cold.encode(["a space opera", "a romantic comedy"])
    assert cold.loaded
    warm = load_encoder("minilm")
    assert np.array_equal(warm.encode(["a space opera", "a romantic comedy"]), vectors)
    assert not warm.loaded


def test_close_frees_and_a_later_call_reloads(llm_or_skip):
    llm = llm_or_skip("smollm2-135m", n_parallel=4)
    first = llm.chat(CONVS, max_tokens=4)  # two prompts: the parallel context is opened too
    assert llm.loaded
    llm.close()
    assert not llm.loaded
    assert [r.text for r in llm.chat(CONVS, max_tokens=4)] == [r.text for r in first]
    llm.close()
    llm.close()  # closing twice is harmless

