"""`python -m ctrlsim.backends.llamacpp.server ARGS`: llama-cpp-python's OpenAI-compatible server
(`python -m llama_cpp.server ARGS`, the same arguments), with the weights loaded as ctrlsim loads
them: without llama.cpp's extra CPU buffers on a CPU with AMX (`cpu_buffers`), whose kernels would
crash the server on its first request there."""
from __future__ import annotations


def main() -> None:
    from llama_cpp.server.__main__ import main as serve

    from ctrlsim.backends.llamacpp.cpu_buffers import model_loading

    with model_loading():  # this process serves one model for its lifetime
        serve()


if __name__ == "__main__":
    main()
