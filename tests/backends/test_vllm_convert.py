"""`hf_folder_from_gguf`: the GGUF -> Hugging Face folder conversion vLLM needs for the bundled models.

It needs transformers, gguf and accelerate (the `transformers` extra), not vLLM, so it runs in
ctrlsim's own venv too. Slow: transformers de-quantises the whole model (the smallest bundled
one here).
"""
from __future__ import annotations

import json

import pytest

from ctrlsim.backends.vllm_backend import SOURCE_MARKER, hf_folder_from_gguf
from ctrlsim.errors import ConfigError, ModelNotFoundError


@pytest.fixture(scope="module")
def smollm2_gguf():
    for module in ("transformers", "gguf", "accelerate", "torch"):
        pytest.importorskip(module, reason=f"converting a GGUF needs {module} (ctrlsim[transformers])")
    from ctrlsim.backends.bundled import bundled_llm_path

    try:
        return bundled_llm_path("smollm2-135m")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
@pytest.mark.llm
def test_converted_folder_holds_the_gguf_weights_and_chat_template(smollm2_gguf, tmp_path):
    import torch
    import transformers

    out = hf_folder_from_gguf(smollm2_gguf, tmp_path / "smollm2", dtype="float32")
    assert json.loads((out / SOURCE_MARKER).read_text())["size"] == smollm2_gguf.stat().st_size
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert not (tmp_path / "smollm2.partial").exists()

    folder_tok = transformers.AutoTokenizer.from_pretrained(out)
    gguf_tok = transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    conv = [{"role": "user", "content": "Rate Star Wars from 0 to 5."}]
    text = gguf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert folder_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == text
    ids = torch.tensor([gguf_tok(text, add_special_tokens=False)["input_ids"]])
    assert folder_tok(text, add_special_tokens=False)["input_ids"] == ids[0].tolist()

    folder_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(folder_model(ids).logits, gguf_model(ids).logits)  # the same weights

    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert hf_folder_from_gguf(smollm2_gguf, out, dtype="float32") == out  # unchanged GGUF: reused
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_conversion_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no GGUF file"):
        hf_folder_from_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="dtype"):
        hf_folder_from_gguf(tmp_path / "x.gguf", tmp_path / "out", dtype="int8")
