"""llama.cpp's extra CPU buffers are off exactly on CPUs with AMX (the kernels a native build gets
there crash), for the duration of a load only, and the model's identity says so."""
from __future__ import annotations

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from ctrlsim.backends.llamacpp.cpu_buffers import (  # noqa: E402
    cpu_has_amx,
    extra_buffers_allowed,
    model_loading,
)


def build_has_amx() -> bool:
    """Whether the installed llama.cpp reports AMX kernels (what the CPU flag stands for)."""
    return "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode()


def test_the_load_turns_extra_buffers_off_and_restores_the_default():
    bindings = llama_cpp.llama_cpp
    assert bindings.llama_model_default_params().use_extra_bufts  # llama.cpp's own default
    with model_loading(False):
        assert not bindings.llama_model_default_params().use_extra_bufts
    assert bindings.llama_model_default_params().use_extra_bufts
    with model_loading(True):
        assert bindings.llama_model_default_params().use_extra_bufts


def test_the_cpu_flag_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu avx512f amx_bf16 amx_tile\n")
    assert not cpu_has_amx(info)  # AMX tiles without INT8: no AMX kernels in ggml
    info.write_text("processor : 0\nflags : fpu avx512f amx_int8 amx_tile\n")
    assert cpu_has_amx(info)
    assert not cpu_has_amx(tmp_path / "missing")


def test_on_a_native_build_the_cpu_flag_and_the_builds_kernels_agree():
    # pip compiles llama.cpp for the host: its system info lists AMX_INT8 exactly on AMX CPUs.
    assert extra_buffers_allowed() is not build_has_amx()


@pytest.mark.llm
def test_identity_names_the_buffers_only_when_they_were_off(smol):
    has_amx = build_has_amx()
    assert ("cpu_extra_buffers" in smol.identity) is has_amx
    assert (":cpu_extra_buffers=0" in smol.cache_identity()) is has_amx
    assert smol.chat([[{"role": "user", "content": "Say hello."}]], max_tokens=4)[0].text  # no crash
