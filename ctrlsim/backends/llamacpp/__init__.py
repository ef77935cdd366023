"""The llama.cpp runtime (llama-cpp-python): the LLM, its KV-cache reuse, parallel sequences,
sampling and streams."""
