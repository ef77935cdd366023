"""Model backends: LLMs and text encoders behind one interface.

`load_llm(spec)` and `load_encoder(spec)` pick runtime and model from one
string; `resolve_llm` / `resolve_encoder` take a spec string or a live model.
Runtime modules (llama.cpp, transformers, vLLM) import lazily.
"""
from ctrlsim.backends.bundled import (
    BUNDLED_LLMS,
    DEFAULT_ENCODER,
    DEFAULT_LLM,
    SMALLEST_LLM,
    available_models,
)
from ctrlsim.backends.cache import ResponseCache
from ctrlsim.backends.encoders import Encoder, load_encoder
from ctrlsim.backends.llm import LLM, Completion, expected_rating, parse_first_number
from ctrlsim.backends.meter import TokenMeter, Usage
from ctrlsim.backends.resolve import check_encoder_argument, check_llm_argument, resolve_encoder, resolve_llm
from ctrlsim.backends.specs import load_llm

__all__ = [
    "BUNDLED_LLMS", "DEFAULT_ENCODER", "DEFAULT_LLM", "SMALLEST_LLM", "LLM", "Completion", "Encoder",
    "ResponseCache", "TokenMeter", "Usage", "available_models", "check_encoder_argument",
    "check_llm_argument", "expected_rating", "load_encoder", "load_llm", "parse_first_number",
    "resolve_encoder", "resolve_llm",
]
