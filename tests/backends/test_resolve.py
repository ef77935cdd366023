"""`resolve_llm` / `resolve_encoder`: a spec string is loaded, a live model passes, anything else is named."""
import pytest

import ctrlsim.backends.resolve as R
from ctrlsim.backends import check_encoder_argument, check_llm_argument, resolve_encoder, resolve_llm
from ctrlsim.errors import ConfigError


class ChatOnly:
    """Not an `LLM` subclass: test doubles and wrappers are duck-typed."""

    def chat(self, conversations, **kwargs):
        return []


class EncodeOnly:
    def encode(self, texts, **kwargs):
        return []


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(R, "load_llm", lambda spec, **kw: calls.append(("llm", spec, kw)) or f"LLM<{spec}>")
    monkeypatch.setattr(R, "load_encoder",
                        lambda spec, **kw: calls.append(("encoder", spec, kw)) or f"Encoder<{spec}>")
    return calls


def test_a_spec_string_is_loaded_with_the_options(recorded):
    assert resolve_llm("qwen2.5-0.5b", cache="c.sqlite", n_ctx=512) == "LLM<qwen2.5-0.5b>"
    assert resolve_encoder("minilm", cache=False) == "Encoder<minilm>"
    assert recorded == [("llm", "qwen2.5-0.5b", {"cache": "c.sqlite", "n_ctx": 512}),
                        ("encoder", "minilm", {"cache": False})]


def test_a_live_model_is_returned_as_it_is_and_the_options_ignored(recorded):
    llm, encoder = ChatOnly(), EncodeOnly()
    assert resolve_llm(llm, cache="ignored.sqlite") is llm
    assert resolve_encoder(encoder, cache=False) is encoder
    assert recorded == []


@pytest.mark.parametrize("bad", [3, None, b"qwen", ["qwen2.5-0.5b"]])
def test_any_other_type_is_a_config_error_naming_the_argument(bad, recorded):
    with pytest.raises(ConfigError, match=r"^probe_llm must be an LLM spec string or an LLM") as err:
        resolve_llm(bad, argument="probe_llm")
    assert type(bad).__name__ in str(err.value)
    with pytest.raises(ConfigError, match=r"^encoder must be an encoder spec string or an Encoder"):
        resolve_encoder(bad)
    with pytest.raises(ConfigError, match=r"^llm must be"):
        check_llm_argument(bad)
    with pytest.raises(ConfigError, match=r"^item_encoder must be"):
        check_encoder_argument(bad, argument="item_encoder")
    assert recorded == []  # refused before anything loads


def test_the_checks_pass_values_through_and_load_nothing(recorded):
    llm = ChatOnly()
    assert check_llm_argument("smollm2-135m") == "smollm2-135m" and check_llm_argument(llm) is llm
    assert check_encoder_argument("minilm") == "minilm"
    assert recorded == []


@pytest.mark.llm
def test_a_real_spec_builds_the_runtime_without_loading_weights():
    try:
        llm = resolve_llm("smollm2-135m", n_ctx=512)
    except ImportError as exc:  # MissingDependencyError is an ImportError
        pytest.skip(str(exc))
    assert type(llm).__name__ == "LlamaCppLLM" and llm.n_ctx == 512 and not llm.loaded
    assert resolve_llm(llm) is llm


def test_recommenders_name_the_bad_argument(ml100k):
    from ctrlsim.recommenders.embedding import EmbeddingRecommender
    from ctrlsim.recommenders.keyword_bm25 import KeywordBM25Recommender
    from ctrlsim.recommenders.nl_profile import NLProfileRecommender

    with pytest.raises(ConfigError, match="^llm must be"):
        KeywordBM25Recommender(ml100k, llm=42)
    with pytest.raises(ConfigError, match="^encoder must be"):
        EmbeddingRecommender(ml100k, encoder=42)
    with pytest.raises(ConfigError, match="^llm must be"):
        NLProfileRecommender(ml100k, llm=42)  # checked at construction though it loads on first use
    with pytest.raises(ConfigError, match="^encoder must be"):
        NLProfileRecommender(ml100k, encoder=42)
