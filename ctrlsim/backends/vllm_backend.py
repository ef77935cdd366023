"""vLLM offline engine (GPU) with automatic prefix caching.

The engine starts on the first call the response cache cannot answer.
Prefix caching makes a profile shared by many rating prompts cost one prefill.
Digit log-probs come from the top-`logprobs` list of the first sampled
position; a digit outside that list counts as probability 0.
"""
from __future__ import annotations

import numpy as np

from ctrlsim.backends.llm import (
    LLM,
    RATING_DIGITS,
    Completion,
    Conversation,
    DigitScores,
    GenerationParams,
    digit_token_ids,
)
from ctrlsim.errors import MissingDependencyError, ModelError
from ctrlsim.lazy import lazy


def gpu_unavailable_reason() -> str | None:
    """Why vLLM cannot run here (None when a CUDA GPU and vllm are present)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return 'vllm is not installed (pip install "ctrlsim[vllm]", needs a CUDA GPU)'
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "vLLM's PyPI build needs a CUDA GPU and none is visible on this machine"
    return None


def structured_output_options(schema: dict) -> dict:
    """SamplingParams keywords that constrain a reply to a JSON schema, across vLLM versions."""
    try:  # vLLM >= 0.11 renamed guided decoding to structured outputs
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(json=schema)}
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(json=schema)}


class VLLMLLM(LLM):
    runtime = "vllm"
    supports_json_schema = True

    def __init__(self, model: str, *, model_id: str | None = None, top_logprobs: int = 20,
                 gpu_memory_utilization: float = 0.85, max_model_len: int = 8192, seed: int = 0, **kwargs):
        reason = gpu_unavailable_reason()
        if reason:
            raise MissingDependencyError("vllm", "vllm", reason)
        super().__init__(model_id or model, **kwargs)
        self.top_logprobs = top_logprobs
        self._engine_options = {"model": model, "enable_prefix_caching": True, "seed": seed,
                                "gpu_memory_utilization": gpu_memory_utilization,
                                "max_model_len": max_model_len}

    @property
    def loaded(self) -> bool:
        return VLLMLLM.engine.is_loaded(self)

    @lazy
    def engine(self):
        """The vLLM engine, started on the first call the response cache cannot answer."""
        from vllm import LLM as Engine

        try:
            engine = Engine(**self._engine_options)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelError(f"vLLM could not load {self._engine_options['model']!r}: {exc}") from exc
        self.tokenizer = engine.get_tokenizer()
        self._digit_ids = digit_token_ids(lambda t: self.tokenizer.encode(t, add_special_tokens=False))
        return engine

    def render(self, conversation: Conversation, assistant_prefix: str = "") -> str:
        self.engine.get_tokenizer()  # starts the engine: the chat template comes with its tokenizer
        return self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True) \
            + assistant_prefix

    def _generate(self, conversations: list[Conversation], params: GenerationParams) -> list[Completion]:
        return self._generate_each(conversations, [params] * len(conversations))

    def _generate_each(self, conversations: list[Conversation],
                       params: list[GenerationParams]) -> list[Completion]:
        """One engine call for the whole batch, with one `SamplingParams` per prompt: a request's
        own seed makes its draws its own (vLLM seeds a generator per request)."""
        from vllm import SamplingParams

        def sampling(p: GenerationParams):
            schema = p.schema
            constrained = structured_output_options(schema) if schema is not None else {}
            return SamplingParams(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                                  seed=p.seed, stop=list(p.stop) or None, **constrained)

        built = {p: sampling(p) for p in dict.fromkeys(params)}  # one SamplingParams per distinct params
        sps = [built[p] for p in params]
        results = self.engine.generate([self.render(c) for c in conversations], sps, use_tqdm=False)
        return [Completion(r.outputs[0].text, len(r.prompt_token_ids), len(r.outputs[0].token_ids),
                           r.outputs[0].finish_reason or "stop") for r in results]

    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs)
        results = self.engine.generate([self.render(c, prefix) for c in conversations], sp, use_tqdm=False)
        out = []
        for r in results:
            top = r.outputs[0].logprobs[0]  # token id -> Logprob
            digit = np.full(len(RATING_DIGITS), -np.inf)
            for k, ids in enumerate(self._digit_ids):
                vals = [top[i].logprob for i in ids if i in top]
                if vals:
                    digit[k] = np.logaddexp.reduce(vals)
            out.append(DigitScores(digit, len(r.prompt_token_ids)))
        return out
