"""The llama.cpp conversation size: 8,192 tokens by default ($CTRLSIM_N_CTX), because the paper-size
evolution's merge prompts for large clusters pass 4,096; a prompt past it is a typed error naming
the setting."""
import pytest

from ctrlsim.backends import load_llm
from ctrlsim.errors import ConfigError, PromptTooLongError


@pytest.mark.llm
def test_the_default_and_the_environment_reach_the_backend(monkeypatch):
    pytest.importorskip("llama_cpp")
    monkeypatch.delenv("CTRLSIM_N_CTX", raising=False)
    llm = load_llm("smollm2-135m")
    assert llm.n_ctx == 8192 and llm.parallel_ctx == 16384 and not llm.loaded
    monkeypatch.setenv("CTRLSIM_N_CTX", "2048")
    assert load_llm("smollm2-135m").n_ctx == 2048
    assert load_llm("smollm2-135m", n_ctx=1024).n_ctx == 1024  # an explicit option wins
    for bad in ("many", "100"):
        monkeypatch.setenv("CTRLSIM_N_CTX", bad)
        with pytest.raises(ConfigError, match="CTRLSIM_N_CTX"):
            load_llm("smollm2-135m")


@pytest.mark.llm
def test_a_prompt_past_the_context_names_the_setting(monkeypatch):
    monkeypatch.setenv("CTRLSIM_N_CTX", "256")
    llm = load_llm("smollm2-135m")
    try:
        with pytest.raises(PromptTooLongError, match=r"context of 256; raise n_ctx \(\$CTRLSIM_N_CTX\)"):
            llm.chat([[{"role": "user", "content": "word " * 300}]], max_tokens=4)
    finally:
        llm.close()
