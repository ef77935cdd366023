"""The llama.cpp conversation size: 8,192 tokens by default, because the paper-size evolution's merge
prompts for large clusters pass 4,096; the spec sets another (`@n_ctx=`), and a prompt past it is a
typed error naming the setting."""
import pytest

from ctrlsim.backends import load_llm
from ctrlsim.errors import ConfigError, PromptTooLongError


@pytest.mark.llm
def test_the_default_and_the_spec_reach_the_backend():
    pytest.importorskip("llama_cpp")
    llm = load_llm("smollm2-135m")
    assert llm.n_ctx == 8192 and llm.parallel_ctx == 16384 and not llm.loaded
    assert load_llm("smollm2-135m@n_ctx=2048").n_ctx == 2048
    assert load_llm("smollm2-135m@n_ctx=2048", n_ctx=1024).n_ctx == 1024  # an explicit option wins
    for bad in ("many", "100"):
        with pytest.raises(ConfigError, match="n_ctx"):
            load_llm(f"smollm2-135m@n_ctx={bad}")


@pytest.mark.llm
def test_a_prompt_past_the_context_names_the_setting():
    llm = load_llm("smollm2-135m@n_ctx=256")
    try:
        with pytest.raises(PromptTooLongError, match=r"context of 256; raise n_ctx \(a spec setting: @n_ctx"):
            llm.chat([[{"role": "user", "content": "word " * 300}]], max_tokens=4)
    finally:
        llm.close()
