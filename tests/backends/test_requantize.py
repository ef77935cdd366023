"""Bundled models converted by llama.cpp (`name@q4_0`, `@bf16`): spec grammar, a copy made once, identity."""
import hashlib
import warnings
from pathlib import Path

import pytest
from rating_items import ROMCOM, SCIFI, rating_prompt

from ctrlsim.backends.spec_check import check_llm_spec, llm_cache_uses
from ctrlsim.backends.specs import load_llm
from ctrlsim.errors import ConfigError, SlowKernelWarning


def test_a_spec_names_a_copy_of_a_bundled_model_and_unknown_types_are_refused():
    from ctrlsim.backends.requantize import split_derived

    assert split_derived("qwen2.5-0.5b@q4_0") == ("qwen2.5-0.5b", "q4_0")
    assert split_derived("smollm2-135m@q8_0") == ("smollm2-135m", "q8_0")
    assert split_derived("qwen2.5-0.5b@bf16") == ("qwen2.5-0.5b", "bf16")
    # An '@' elsewhere (a path, a hub id) is not a converted bundled model.
    assert split_derived("/models/qwen@q4_0.gguf") is None and split_derived("org/name@main") is None
    assert split_derived("qwen2.5-0.5b") is None
    with pytest.raises(ConfigError, match=r"unknown quantization or runtime profile 'q3_k'.*"
                                          r"qwen2\.5-0\.5b@q4_0"):
        check_llm_spec("qwen2.5-0.5b@q3_k")
    with pytest.raises(ConfigError, match="llama.cpp only"):
        check_llm_spec("vllm:qwen2.5-0.5b@q4_0")
    with pytest.raises(ConfigError, match="llama.cpp only"):
        load_llm("transformers:smollm2-135m@q4_0")
    check_llm_spec("llamacpp:qwen2.5-0.5b@q4_0")
    assert "models" in llm_cache_uses("qwen2.5-0.5b@q4_0")


def _file_type(path: Path) -> int:
    """GGUF `general.file_type`, read by llama.cpp itself (vocabulary only, no weights)."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    try:
        return int(llm.metadata["general.file_type"])
    finally:
        llm.close()


@pytest.mark.llm
def test_the_copy_is_q4_0_made_once_named_by_its_sha256_and_remade_when_changed(tmp_path, monkeypatch,
                                                                                 llm_or_skip):
    llm_or_skip("smollm2-135m")  # skips where the bundled model is not installed
    import llama_cpp

    from ctrlsim.backends import requantize

    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path))
    path, sha = requantize.derived_llm_path("smollm2-135m@q4_0")
    assert path.parent == tmp_path / "models" and path.name == "SmolLM2-135M-Instruct.Q4_1.q4_0.gguf"
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert _file_type(path) == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    made = path.stat().st_mtime_ns

    def no_second_copy(*args):
        raise AssertionError("the copy was made again")

    with monkeypatch.context() as patched:
        patched.setattr(requantize, "_quantize", no_second_copy)
        assert requantize.derived_llm_path("smollm2-135m@q4_0") == (path, sha)
    assert path.stat().st_mtime_ns == made
    with open(path, "ab") as fh:  # a changed file no longer matches its marker and is made again
        fh.write(b"\0")
    again, sha_again = requantize.derived_llm_path("smollm2-135m@q4_0")
    assert again == path and sha_again == sha == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.llm
def test_the_q4_0_copy_of_qwen_runs_under_its_own_identity_and_still_rates_by_the_profile(llm_or_skip):
    base = llm_or_skip("qwen2.5-0.5b", threads=1)
    copy = llm_or_skip("qwen2.5-0.5b@q4_0", threads=1)
    try:
        assert copy.identity["model"] == "qwen2.5-0.5b@q4_0"
        assert copy.sha256 != base.sha256 and copy.cache_identity() != base.cache_identity()
        scifi = copy.rate([rating_prompt(i) for i in SCIFI])
        romcom = copy.rate([rating_prompt(i) for i in ROMCOM])
        assert scifi.mean() > romcom.mean()
        question = "What is the capital of France? Answer with exactly one word."
        reply = copy.chat([[{"role": "user", "content": question}]], max_tokens=8)[0]
        assert reply.text.strip(" .") == "Paris"
    finally:
        copy.close()
        base.close()


@pytest.mark.llm
def test_a_bf16_copy_keeps_the_ratings_where_a_q4_0_copy_moves_them(tmp_path, monkeypatch, llm_or_skip):
    """BF16 holds the bundled 4- and 5-bit weights almost exactly (an 8-bit mantissa per weight), so
    the copy rates as the original does up to rounding; Q4_0 re-quantizes them and moves ratings more."""
    import llama_cpp

    from ctrlsim.backends import requantize

    base = llm_or_skip("smollm2-135m", threads=1)
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path))
    prompts = [rating_prompt(item) for item in SCIFI + ROMCOM]
    try:
        bf16_path, _ = requantize.derived_llm_path("smollm2-135m@bf16")
        assert _file_type(bf16_path) == llama_cpp.LLAMA_FTYPE_MOSTLY_BF16
        with monkeypatch.context() as patched:  # a build without the BF16 dot products says so, loudly
            patched.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | AVX512 = 1 |")
            with pytest.warns(SlowKernelWarning, match="no AVX512-BF16"):
                assert requantize.derived_llm_path("smollm2-135m@bf16")[0] == bf16_path
            with warnings.catch_warnings():
                warnings.simplefilter("error", SlowKernelWarning)
                requantize.derived_llm_path("smollm2-135m@q4_0")  # other types have no such need
        original = base.rate(prompts)
        change = {}
        for quant in ("bf16", "q4_0"):
            copy = llm_or_skip(f"smollm2-135m@{quant}", threads=1)
            try:
                assert copy.identity["model"] == f"smollm2-135m@{quant}"
                change[quant] = float(abs(copy.rate(prompts) - original).max())
            finally:
                copy.close()
    finally:
        base.close()
    assert change["bf16"] < 0.1 and change["bf16"] < change["q4_0"] / 2, change
