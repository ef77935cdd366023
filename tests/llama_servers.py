"""Real OpenAI-compatible servers for tests: llama-cpp-python's server on a loopback port, started
through `python -m ctrlsim.backends.llamacpp.server` (the same server, its weights loaded as ctrlsim
loads them, see ctrlsim/backends/llamacpp/cpu_buffers.py).

Importable from every test module (pytest puts tests/ on sys.path for its conftest.py).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, log_path: Path, port: int | None = None, n_ctx: int = 1024):
    """(process, log file, base URL) of a llama.cpp server for `model` on 127.0.0.1."""
    port = port or free_port()
    log = open(log_path, "wb")  # a file, not a pipe: an unread pipe fills up and blocks the server
    proc = subprocess.Popen([sys.executable, "-m", "ctrlsim.backends.llamacpp.server", "--model", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--n_threads", "1",
                             "--n_threads_batch", "1", "--n_ctx", str(n_ctx)],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, log, f"http://127.0.0.1:{port}/v1"


def wait_ready(proc, url: str, log_path: Path, deadline: float) -> None:
    """Until the server lists its models (bounded by `deadline`); a server that exits fails the test."""
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as resp:
                json.loads(resp.read())
            return
        except OSError:
            if proc.poll() is not None:
                pytest.fail("llama_cpp.server exited: " + log_path.read_text()[-500:])
            time.sleep(0.5)
    pytest.fail(f"llama_cpp.server at {url} did not start in time")


def stop_server(proc, log) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
