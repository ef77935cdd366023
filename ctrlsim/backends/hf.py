"""transformers runtime for any Hugging Face causal LM (hub id, local folder, or GGUF via `gguf_file`).

Weights load on the first call the response cache cannot answer. This runtime
has no constrained decoding (`supports_json_schema` is False): transformers
ships none, and the grammar libraries that add it are not dependencies here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ctrlsim.backends._torch import default_device, import_torch, torch_threads
from ctrlsim.backends.hub import resolve_model
from ctrlsim.backends.llm import (
    LLM,
    Completion,
    Conversation,
    DigitScores,
    GenerationParams,
)
from ctrlsim.backends.token_scores import choice_token_ids, digit_token_ids
from ctrlsim.errors import MissingDependencyError, ModelError, ModelNotFoundError
from ctrlsim.lazy import lazy


def _import_transformers():
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError("transformers", "transformers", "Hugging Face models") from exc
    return transformers


class TransformersLLM(LLM):
    runtime = "transformers"

    def __init__(self, model: str | Path, *, model_id: str | None = None, gguf_file: str | None = None,
                 device: str | None = None, dtype: str = "auto", threads: int | None = 1, batch_size: int = 8,
                 **kwargs):
        _import_transformers()  # a missing runtime is reported now; the weights load on the first call
        super().__init__(model_id or str(model), **kwargs)
        self.device = default_device(device)
        self.threads, self.batch_size, self.dtype = threads, batch_size, dtype
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        self.source = {"model": str(model), **extra}
        # Where the weights are is checked now (cheap); they load on the first cache miss.
        self._local = resolve_model(str(model), offline_default="qwen2.5-1.5b (llama.cpp)")

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory (they load on the first uncached call)."""
        return TransformersLLM._weights.is_loaded(self)

    @property
    def tokenizer(self):
        return self._weights[0]

    @property
    def model(self):
        return self._weights[1]

    @lazy
    def _weights(self) -> tuple:
        """(tokenizer, model), loaded together on the first uncached call."""
        transformers = _import_transformers()
        torch = import_torch()
        extra = {k: v for k, v in self.source.items() if k != "model"}
        model = self._local
        try:
            with torch_threads(self.threads):
                tokenizer = transformers.AutoTokenizer.from_pretrained(str(model), **extra)
                torch_dtype = torch.float32 if self.device == "cpu" else self.dtype
                weights = transformers.AutoModelForCausalLM.from_pretrained(
                    str(model), dtype=torch_dtype, **extra).to(self.device).eval()
        except OSError as exc:
            raise ModelNotFoundError(
                f"transformers could not load {model!r}: {exc}. Pass a local folder (or GGUF with "
                "gguf_file=), or allow network access to the Hugging Face hub.") from exc
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"  # generation and last-position logits need left padding
        if not getattr(tokenizer, "chat_template", None):
            raise ModelError(f"{model} has no chat template; it is not a chat model")
        self._digit_ids = digit_token_ids(lambda t: tokenizer.encode(t, add_special_tokens=False))
        return tokenizer, weights

    @property
    def identity(self) -> dict:
        return {**super().identity, **self.source, "device": self.device}

    def render(self, conversation: Conversation, assistant_prefix: str = "") -> str:
        return self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True) \
            + assistant_prefix

    def _batches(self, texts: list[str]):
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start:start + self.batch_size]
            enc = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            yield start, enc.to(self.device)

    def _generate(self, conversations: list[Conversation], params: GenerationParams) -> list[Completion]:
        torch = import_torch()
        texts = [self.render(c) for c in conversations]
        out: list[Completion] = []
        sample = params.temperature > 0
        with torch_threads(self.threads), torch.inference_mode(), torch.random.fork_rng(
                devices=[] if self.device == "cpu" else None):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for _, enc in self._batches(texts):
                gen = self.model.generate(
                    **enc, max_new_tokens=params.max_tokens, do_sample=sample,
                    temperature=params.temperature if sample else None,
                    top_p=params.top_p if sample else None,
                    top_k=None, pad_token_id=self.tokenizer.pad_token_id,
                    stop_strings=list(params.stop) or None, tokenizer=self.tokenizer)
                prompt_len = enc["input_ids"].shape[1]
                for row, mask in zip(gen, enc["attention_mask"]):
                    new = row[prompt_len:]
                    ids = [int(t) for t in new if int(t) != self.tokenizer.pad_token_id]
                    eos_hit = self.tokenizer.eos_token_id in ids
                    text = self.tokenizer.decode(ids, skip_special_tokens=True)
                    for s in params.stop:
                        text = text.split(s)[0]
                    out.append(Completion(text, int(mask.sum()), len(ids), "stop" if eos_hit else "length"))
        return out

    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        self._weights  # noqa: B018 - loads the model: the digit ids come with its tokenizer
        return self._scores_at_prefix(conversations, prefix, self._digit_ids)

    def _choice_logprobs(self, conversations: list[Conversation], prefix: str,
                         choices: tuple[str, ...]) -> list[DigitScores]:
        ids = choice_token_ids(lambda t: self.tokenizer.encode(t, add_special_tokens=False), choices)
        return self._scores_at_prefix(conversations, prefix, ids)

    def _scores_at_prefix(self, conversations: list[Conversation], prefix: str,
                          token_ids: list[list[int]]) -> list[DigitScores]:
        torch = import_torch()
        texts = [self.render(c, prefix) for c in conversations]
        out: list[DigitScores] = []
        with torch_threads(self.threads), torch.inference_mode():
            for _, enc in self._batches(texts):
                logits = self.model(**enc).logits[:, -1, :].float()
                logp = torch.log_softmax(logits, dim=-1).cpu().numpy()
                for row, mask in zip(logp, enc["attention_mask"]):
                    scores = np.array([np.logaddexp.reduce(row[ids]) for ids in token_ids])
                    out.append(DigitScores(scores, int(mask.sum())))
        return out
