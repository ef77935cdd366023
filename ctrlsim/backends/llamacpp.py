"""llama.cpp runtime (llama-cpp-python) for GGUF files: the CPU default.

Ratings reuse the KV cache: prompts are evaluated in sorted token order, and
each one only evaluates the tokens after its longest common prefix with the
previous prompt, so a profile shared by many item prompts is evaluated once.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ctrlsim.backends.llm import (
    LLM,
    Completion,
    Conversation,
    DigitScores,
    GenerationParams,
    digit_logprobs_from_logits,
    digit_token_ids,
)
from ctrlsim.errors import ConfigError, MissingDependencyError, ModelError


def _import_llama_cpp():
    try:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    except ImportError as exc:
        raise MissingDependencyError("llama_cpp", "llm", "GGUF models") from exc
    return llama_cpp, Jinja2ChatFormatter


class LlamaCppLLM(LLM):
    runtime = "llama.cpp"
    supports_json_schema = True  # llama.cpp compiles a JSON Schema into a GBNF grammar

    def __init__(self, model_path: str | Path, *, model_id: str | None = None, n_ctx: int = 4096,
                 n_threads: int = 1, n_batch: int = 512, sha256: str | None = None, **kwargs):
        llama_cpp, formatter_cls = _import_llama_cpp()
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ModelError(f"GGUF file not found: {model_path}")
        super().__init__(model_id or model_path.stem, **kwargs)
        self.model_path = model_path
        self.sha256 = sha256
        self.n_threads = n_threads
        try:
            self._llm = llama_cpp.Llama(str(model_path), n_ctx=n_ctx, n_threads=n_threads,
                                        n_threads_batch=n_threads, n_batch=n_batch, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp could not load {model_path}: {exc}") from exc
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ModelError(f"{model_path} has no chat template in its GGUF metadata; it is not a chat model")
        # Detokenize specials with special=True, else the EOS string is empty and generation stops at once.
        eos = self._llm.detokenize([self._llm.token_eos()], special=True).decode("utf-8", "ignore")
        bos_id = self._llm.token_bos()
        bos = self._llm.detokenize([bos_id], special=True).decode("utf-8", "ignore") if bos_id >= 0 else ""
        self._formatter = formatter_cls(template=template, eos_token=eos, bos_token=bos)
        self._digit_ids = digit_token_ids(lambda t: self._llm.tokenize(t.encode(), add_bos=False, special=False))
        self.evaluated_tokens = 0  # tokens actually run through the model by `rate` (shows prefix reuse)
        self._grammars: dict[str, object] = {}  # schema JSON text -> LlamaGrammar (compiled once)

    @property
    def identity(self) -> dict:
        return {**super().identity, "path": str(self.model_path), "sha256": self.sha256, "threads": self.n_threads}

    def cache_identity(self) -> str:
        if self.sha256:
            return f"{self.runtime}:{self.sha256}"
        stat = self.model_path.stat()
        return f"{self.runtime}:{self.model_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"

    # --------------------------------------------------------------- prompts
    def render(self, conversation: Conversation, assistant_prefix: str = "") -> str:
        """The model's chat template applied, ready for the assistant's turn (plus a prefix)."""
        return self._formatter(messages=conversation).prompt + assistant_prefix

    def tokenize(self, text: str) -> list[int]:
        tokens = self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if len(tokens) >= self._llm.n_ctx():
            raise ConfigError(f"prompt of {len(tokens)} tokens does not fit the context of {self._llm.n_ctx()}; "
                              "raise n_ctx or shorten the prompt")
        return tokens

    def grammar_for(self, schema_text: str):
        """The GBNF grammar for a JSON Schema (canonical JSON text), compiled once per schema."""
        if schema_text not in self._grammars:
            from llama_cpp import LlamaGrammar

            try:
                self._grammars[schema_text] = LlamaGrammar.from_json_schema(schema_text, verbose=False)
            except (ValueError, KeyError, TypeError, NotImplementedError) as exc:
                raise ConfigError(f"llama.cpp cannot turn this JSON schema into a grammar ({exc}): "
                                  f"{schema_text[:200]}") from exc
        return self._grammars[schema_text]

    # -------------------------------------------------------------- runtime
    def _generate(self, conversations: list[Conversation], params: GenerationParams) -> list[Completion]:
        grammar = self.grammar_for(params.json_schema) if params.json_schema is not None else None
        out = []
        for conv in conversations:
            tokens = self.tokenize(self.render(conv))
            # Logits depend slightly on how the prompt was batched, so a reused KV prefix can change a
            # sampled token; evaluating every prompt from scratch makes seeded generation replay exactly.
            self._llm.reset()
            try:
                res = self._llm.create_completion(
                    tokens, max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
                    seed=params.seed if params.seed is not None else 0, stop=list(params.stop) or None,
                    grammar=grammar)
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"llama.cpp generation failed: {exc}") from exc
            choice, usage = res["choices"][0], res["usage"]
            out.append(Completion(choice["text"], usage["prompt_tokens"], usage["completion_tokens"],
                                  choice.get("finish_reason") or "stop"))
        return out

    def _last_logits(self, tokens: list[int]) -> np.ndarray:
        """Logits after `tokens`, evaluating only what differs from the cached prefix."""
        llm = self._llm
        cached = np.asarray(llm.input_ids[: llm.n_tokens])
        wanted = np.asarray(tokens)
        m = min(len(cached), len(wanted))
        mismatch = np.flatnonzero(cached[:m] != wanted[:m])
        common = int(mismatch[0]) if mismatch.size else m
        common = min(common, len(tokens) - 1)  # always evaluate at least one token to get fresh logits
        llm.n_tokens = common
        llm.eval(tokens[common:])
        self.evaluated_tokens += len(tokens) - common
        ptr = llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()

    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        token_lists = [self.tokenize(self.render(conv, prefix)) for conv in conversations]
        # Sorted order puts prompts that share a prefix next to each other.
        order = sorted(range(len(token_lists)), key=lambda i: token_lists[i])
        out: list[DigitScores | None] = [None] * len(token_lists)
        for i in order:
            logits = self._last_logits(token_lists[i])
            out[i] = DigitScores(digit_logprobs_from_logits(logits, self._digit_ids), len(token_lists[i]))
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self._llm.close()

