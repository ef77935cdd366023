"""llama.cpp's extra CPU buffer types, off where its AMX kernels would run.

On CPUs with AMX (Intel Sapphire Rapids and later) a llama.cpp build compiled for the host puts the
quantised weights in AMX buffers, and its AMX matrix multiply crashes the process with a segmentation
fault on the first decode (ggml-org/llama.cpp#20824; llama-cpp-python 0.3.36 on a Xeon with AMX_INT8
crashes on any prompt of the bundled models). Loading the weights without llama.cpp's extra buffer
types (AMX and the repacked layouts) avoids those kernels: the model then runs on the same AVX-512
kernels as on a CPU without AMX.

So the choice follows the machine, not a setting: extra buffers stay on (llama.cpp's default) unless
the CPU has AMX-INT8 (the `amx_int8` flag of /proc/cpuinfo; pip compiles llama.cpp for the host, so
such a CPU gets AMX kernels), and a model's identity says `cpu_extra_buffers: false` when they are
off, so its records and cache keys say how its replies were computed. Reading the CPU's flags, not
the build's system info, keeps identities free of importing llama_cpp (a fully cached rerun never
loads it). llama-cpp-python's `Llama` has no argument for it, so the load swaps the binding's
default model parameters for the duration of the constructor, under a lock.
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

CPU_INFO = Path("/proc/cpuinfo")
_LOAD_LOCK = threading.Lock()


def cpu_has_amx(cpu_info: Path = CPU_INFO) -> bool:
    """Whether the CPU reports AMX-INT8 (Linux; elsewhere no flags to read, so False)."""
    try:
        text = cpu_info.read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith("flags") and "amx_int8" in line.split() for line in text.splitlines())


@functools.cache
def extra_buffers_allowed() -> bool:
    """Whether llama.cpp may use its extra CPU buffer types (False on a CPU with AMX)."""
    return not cpu_has_amx()


@contextmanager
def model_loading(extra_buffers: bool | None = None) -> Iterator[None]:
    """Within the block, `llama_cpp.Llama(...)` loads its weights with extra buffer types on or off
    (by default, as `extra_buffers_allowed` says for this CPU)."""
    if extra_buffers is None:
        extra_buffers = extra_buffers_allowed()
    if extra_buffers:
        yield
        return
    import llama_cpp.llama_cpp as bindings

    with _LOAD_LOCK:
        default = bindings.llama_model_default_params

        def without_extra_buffers() -> Any:
            params = default()
            params.use_extra_bufts = False
            return params

        bindings.llama_model_default_params = without_extra_buffers
        try:
            yield
        finally:
            bindings.llama_model_default_params = default
