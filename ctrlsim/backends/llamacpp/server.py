"""`python -m ctrlsim.backends.llamacpp.server ARGS`: llama-cpp-python's OpenAI-compatible server
(`python -m llama_cpp.server ARGS`, the same arguments), with the weights loaded as ctrlsim loads
them: without llama.cpp's extra CPU buffers where the build has AMX kernels (`cpu_buffers`), which
would crash the server on its first request there."""
from __future__ import annotations


def main() -> None:
    from llama_cpp.server.__main__ import main as serve

    from ctrlsim.backends.llamacpp.cpu_buffers import extra_buffers_allowed, model_loading

    with model_loading(extra_buffers_allowed()):  # this process serves one model for its lifetime
        serve()


if __name__ == "__main__":
    main()
