"""The other runtimes, each against a real model: OpenAI-compatible server, transformers, vLLM."""
import time

import numpy as np
import pytest
from llama_servers import free_port, start_server, stop_server, wait_ready

from ctrlsim.backends import load_llm
from ctrlsim.backends.bundled import bundled_llm_path
from ctrlsim.backends.specs import parse_spec
from ctrlsim.backends.vllm_backend import gpu_unavailable_reason
from ctrlsim.errors import ConfigError, MissingDependencyError, ModelNotFoundError


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """A real llama_cpp.server on loopback serving the smallest bundled model."""
    pytest.importorskip("llama_cpp.server", exc_type=ImportError)
    try:
        model = bundled_llm_path("smollm2-135m")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    proc, log, url = start_server(model, log_path, n_ctx=2048)
    try:
        wait_ready(proc, url, log_path, time.time() + 60)
        yield url
    finally:
        stop_server(proc, log)


@pytest.mark.llm
def test_openai_compatible_backend_against_real_server(llama_server):
    llm = load_llm(llama_server)
    assert llm.identity["runtime"] == "openai-compatible"
    reply = llm.chat([[{"role": "user", "content": "Say hello."}]], max_tokens=8)[0]
    assert reply.text and reply.prompt_tokens > 0 and 0 < reply.completion_tokens <= 8
    ratings = llm.rate([[{"role": "user", "content": "Rate the movie Star Wars (1977) from 0 to 5."}]])
    assert 0.0 <= ratings[0] <= 5.0
    assert llm.meter.total.completion_tokens == reply.completion_tokens + 1


def test_openai_compatible_unreachable_server_is_a_clear_error():
    from ctrlsim.errors import ModelError

    with pytest.raises(ModelError, match="cannot reach"):
        load_llm(f"http://127.0.0.1:{free_port()}/v1")


@pytest.mark.llm
@pytest.mark.slow
def test_transformers_runtime_on_bundled_gguf(llm_or_skip):
    llm = llm_or_skip("transformers:smollm2-135m")
    reply = llm.chat([[{"role": "user", "content": "Say hello."}]], max_tokens=6)[0]
    assert reply.text and reply.completion_tokens >= 1
    r = llm.rate([[{"role": "user", "content": "Rate Star Wars from 0 to 5."}]] * 2)
    assert r.shape == (2,) and np.all((r >= 0) & (r <= 5)) and r[0] == pytest.approx(r[1])


@pytest.mark.llm
def test_vllm_runtime_or_clear_skip():
    reason = gpu_unavailable_reason()
    if reason:
        with pytest.raises(MissingDependencyError, match="ctrlsim\\[vllm\\]"):
            load_llm("vllm:qwen2.5-0.5b")
        pytest.skip(reason)
    llm = load_llm("vllm:qwen2.5-0.5b")  # the bundled GGUF, converted (a hub id needs the network)
    assert llm.chat([[{"role": "user", "content": "Say hi"}]], max_tokens=4)[0].text


def test_spec_parsing_and_errors(tmp_path):
    assert parse_spec("llamacpp:/x/y.gguf") == ("llamacpp", "/x/y.gguf")
    assert parse_spec("Qwen/Qwen2.5-0.5B") == (None, "Qwen/Qwen2.5-0.5B")
    assert parse_spec("http://host:8000/v1") == (None, "http://host:8000/v1")
    with pytest.raises(ModelNotFoundError, match="no GGUF file"):
        load_llm(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="hub"):
        load_llm(str(tmp_path / "no-such-folder"))


def test_threads_env_is_validated(monkeypatch):
    from ctrlsim.backends.specs import default_threads

    monkeypatch.setenv("CTRLSIM_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("CTRLSIM_THREADS", "zero")
    with pytest.raises(ConfigError):
        default_threads()
    monkeypatch.delenv("CTRLSIM_THREADS")
    import os

    assert default_threads() == len(os.sched_getaffinity(0))  # every CPU the process may use


@pytest.mark.llm
def test_gpu_offload_on_a_cpu_build_is_a_config_error(monkeypatch):
    """Asking a CPU build of llama.cpp for GPU layers fails loudly instead of running on the CPU."""
    llama_cpp = pytest.importorskip("llama_cpp")
    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python is a GPU build")
    llm = load_llm("smollm2-135m@n_gpu_layers=-1")
    assert llm.identity["gpu_layers"] == -1
    with pytest.raises(ConfigError, match="CPU build"):
        llm.chat([[{"role": "user", "content": "Say hi."}]], max_tokens=2)
    assert not llm.loaded
    with pytest.raises(ConfigError, match="n_gpu_layers"):
        load_llm("smollm2-135m", n_gpu_layers=-3)
