"""llama.cpp runtime (llama-cpp-python) for GGUF files: the CPU default.

The weights load on the first call the response cache cannot answer, so a fully
cached rerun never loads the model.

`rate` and `chat` (greedy and sampled) run a batch as parallel sequences of one
llama.cpp context (see `parallel`). With `kv_reuse` (off by default) what
those sequences hold stays in the KV cache between calls (a budget of `parallel_ctx`
cells over `kv_slots` sequences, least recently used evicted): every prompt starts
from its longest cached token prefix, so a conversation that grew by a turn, a debate's
transcript or a profile rated against many items evaluates only its new tokens.
`n_parallel` caps the sequences decoded together (a larger batch is split). A sampled
reply is drawn by its own sampler chain seeded with its conversation's seed. With
`n_parallel=1` every call takes the sequential path: one prompt at a time in the
model's own context, each reply from a fresh KV cache.
"""
from __future__ import annotations

import importlib.util
import weakref
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ctrlsim.backends.llamacpp.cpu_buffers import extra_buffers_allowed, model_loading
from ctrlsim.backends.llamacpp.profile import DEFAULT_PROFILE, PROFILES
from ctrlsim.backends.llm import (
    LLM,
    Completion,
    Conversation,
    DigitScores,
    GenerationParams,
)
from ctrlsim.backends.token_scores import choice_token_ids, digit_logprobs_from_logits, digit_token_ids
from ctrlsim.errors import ConfigError, MissingDependencyError, ModelError, PromptTooLongError
from ctrlsim.lazy import lazy

if TYPE_CHECKING:
    from ctrlsim.backends.llamacpp.parallel import ParallelContext


def _release(resources: list) -> None:
    """Close llama.cpp objects, newest first (a context before the model it uses)."""
    while resources:
        resources.pop().close()


def _import_llama_cpp():
    try:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    except ImportError as exc:
        raise MissingDependencyError("llama_cpp", "llm", "GGUF models") from exc
    return llama_cpp, Jinja2ChatFormatter


MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: sequence ids one context can hold
_DEFAULTS = PROFILES[DEFAULT_PROFILE]
# Default KV cells of the unified parallel context, shared by all its sequences.
PARALLEL_CELLS = 16384
# The smallest KV stream (cells): streams grow in powers of two up to `n_ctx` as sequences need.
STREAM_MIN_CELLS = 2048


class LlamaCppLLM(LLM):
    runtime = "llama.cpp"
    supports_json_schema = True  # llama.cpp compiles a JSON Schema into a GBNF grammar

    # The runtime settings default to those of the default profile (`profile.RuntimeProfile`).
    def __init__(self, model_path: str | Path, *, model_id: str | None = None, n_ctx: int = _DEFAULTS.n_ctx,
                 n_threads: int = 1, n_batch: int = 512, sha256: str | None = None,
                 n_parallel: int = _DEFAULTS.n_parallel, parallel_ctx: int | None = None,
                 n_gpu_layers: int = _DEFAULTS.n_gpu_layers, kv_reuse: bool = _DEFAULTS.kv_reuse,
                 kv_slots: int | None = None, flash_attn: bool = _DEFAULTS.flash_attn,
                 kv_host_mb: int = _DEFAULTS.kv_host_mb, kv_streams: bool = _DEFAULTS.kv_streams, **kwargs):
        if importlib.util.find_spec("llama_cpp") is None:  # reported now; imported on the first call
            raise MissingDependencyError("llama_cpp", "llm", "GGUF models")
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ModelError(f"GGUF file not found: {model_path}")
        if n_parallel < 1:
            raise ConfigError(f"n_parallel must be >= 1, got {n_parallel}")
        if kv_slots is not None and not 2 * n_parallel + 1 <= kv_slots <= MAX_SEQUENCES:
            raise ConfigError(f"kv_slots must be in [{2 * n_parallel + 1}, {MAX_SEQUENCES}] for n_parallel="
                              f"{n_parallel}, got {kv_slots}")
        if kv_host_mb < 0:
            raise ConfigError(f"kv_host_mb must be >= 0 (0: no host stash), got {kv_host_mb}")
        if n_gpu_layers < -1:
            raise ConfigError(f"n_gpu_layers must be -1 (all layers) or >= 0, got {n_gpu_layers}")
        super().__init__(model_id or model_path.stem, **kwargs)
        self.model_path = model_path
        self.sha256 = sha256
        self.n_threads, self.n_ctx, self.n_batch = n_threads, n_ctx, n_batch
        self.n_parallel = n_parallel
        self.n_gpu_layers = n_gpu_layers  # -1: every layer on the GPU (needs a GPU build of llama.cpp)
        # Cells for all parallel sequences together, cached prefixes included; never less than one
        # full sequential context.
        self.parallel_ctx = max(parallel_ctx or PARALLEL_CELLS, n_ctx)
        # Keep what the sequences hold between calls (off by default, see docs/performance.md):
        # append-mode probe rounds gain from it.
        self.kv_reuse = kv_reuse
        # Flash attention's CPU kernel skips the cells a sequence does not see; without it every
        # decode of the parallel context pays for all occupied cells. Off by default: it rounds
        # differently (docs/performance.md), and KV reuse, which gains most from it, is off too.
        self.flash_attn = flash_attn
        # With KV reuse, sequences the current prompts do not start from wait in this much host
        # memory instead of the KV cache, where every decode would scan their cells.
        self.kv_host_mb = kv_host_mb
        self.kv_slots = kv_slots
        # One KV stream of n_ctx cells per parallel sequence instead of one unified cache: a token
        # attends only over its own sequence (docs/performance.md, "Separate KV streams").
        self.kv_streams = kv_streams
        self._parallel: ParallelContext | None = None  # created on first parallel use
        # What is open, in the order it was opened; closed by `close()` or, at the latest, at interpreter
        # exit while llama_cpp's module is still intact (its own __del__ then would find it half torn down).
        self._open: list = []
        self._finalizer = weakref.finalize(self, _release, self._open)
        self._sequential_evaluated = 0
        self._grammars: dict[str, object] = {}  # schema JSON text -> LlamaGrammar (compiled once)
        self._choice_ids: dict[tuple[str, ...], list[list[int]]] = {}  # answer words -> their token ids

    def numerics(self) -> dict:
        """The runtime settings that can change a reply (batch layout, attention kernel, cache reuse,
        context) where they differ from the `exact` profile: named only then, so the records and
        cache keys of runs made at `exact` stay as they were, and every other run says how it was
        computed. Weights loaded without llama.cpp's extra CPU buffers (`cpu_buffers`, on CPUs with
        AMX) are named too."""
        exact = PROFILES["exact"]
        now = {"flash_attn": self.flash_attn, "kv_streams": self.kv_streams, "kv_reuse": self.kv_reuse,
               "n_parallel": self.n_parallel, "n_ctx": self.n_ctx}
        differ = {k: v for k, v in now.items() if v != getattr(exact, k)}
        return differ if extra_buffers_allowed() else {"cpu_extra_buffers": False, **differ}

    @property
    def identity(self) -> dict:
        return {**super().identity, "path": str(self.model_path), "sha256": self.sha256,
                "threads": self.n_threads, "gpu_layers": self.n_gpu_layers, **self.numerics()}

    def cache_identity(self) -> str:
        # Replies computed with other numerics differ by rounding: they are cached apart.
        marks = "".join(":flash" if k == "flash_attn" else f":{k}={int(v)}"
                        for k, v in self.numerics().items())
        if self.sha256:
            return f"{self.runtime}:{self.sha256}{marks}"
        stat = self.model_path.stat()
        return f"{self.runtime}:{self.model_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}{marks}"

    # ----------------------------------------------------------------- loading
    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory (they load on the first uncached call)."""
        return LlamaCppLLM._llm.is_loaded(self)

    @lazy
    def _llm(self):
        """The llama_cpp.Llama, loaded on the first uncached call."""
        llama_cpp, formatter_cls = _import_llama_cpp()
        if self.n_gpu_layers != 0 and not llama_cpp.llama_supports_gpu_offload():
            # llama.cpp would silently run on the CPU; a GPU run asked for is a setup error.
            raise ConfigError(f"n_gpu_layers={self.n_gpu_layers} asks for GPU offload, but the installed "
                              "llama-cpp-python is a CPU build; rebuild it with a GPU backend, e.g. "
                              'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
                              "llama-cpp-python")
        try:
            with model_loading():
                llm = llama_cpp.Llama(str(self.model_path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                                      n_threads_batch=self.n_threads, n_batch=self.n_batch,
                                      n_gpu_layers=self.n_gpu_layers, flash_attn=self.flash_attn,
                                      verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
        template = llm.metadata.get("tokenizer.chat_template")
        if not template:
            llm.close()
            raise ModelError(f"{self.model_path} has no chat template in its GGUF metadata; "
                             "it is not a chat model")
        # Detokenize specials with special=True, else the EOS string is empty and generation stops at once.
        eos = llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "ignore")
        bos_id = llm.token_bos()
        bos = llm.detokenize([bos_id], special=True).decode("utf-8", "ignore") if bos_id >= 0 else ""
        self._formatter = formatter_cls(template=template, eos_token=eos, bos_token=bos)
        self._digit_ids = digit_token_ids(lambda t: llm.tokenize(t.encode(), add_bos=False, special=False))
        self._open.append(llm)
        return llm

    def stream_cells(self, need: int) -> int:
        """Cells of each KV stream for a call whose longest sequence needs `need` cells: the smallest
        power of two from `STREAM_MIN_CELLS` that holds it, at most `n_ctx`. Streams take their cells
        up front (17 streams of 8,192 cells hold 3.2 GB for `smollm2-135m`), so they grow with the
        longest conversation seen instead of starting at `n_ctx`."""
        return min(self.n_ctx, max(STREAM_MIN_CELLS, 1 << max(need - 1, 1).bit_length()))

    def _parallel_context(self, need: int = 0):
        """The parallel-sequence context for `n_parallel` workers, rebuilt if that setting changed or,
        with KV streams, if a sequence needs `need` cells and the streams are smaller."""
        from ctrlsim.backends.llamacpp.kv import HostStash
        from ctrlsim.backends.llamacpp.parallel import ParallelContext

        llm = self._llm
        streams = self.kv_streams
        if streams and self.n_parallel + 1 > MAX_SEQUENCES:
            raise ConfigError(f"kv_streams gives every parallel sequence a stream: n_parallel must be at "
                              f"most {MAX_SEQUENCES - 1}, got {self.n_parallel}")
        unified_slots = self.kv_slots or min(MAX_SEQUENCES, 4 * self.n_parallel + 1)
        slots = self.n_parallel + 1 if streams else unified_slots
        wanted = (self.n_parallel, slots, streams)
        current = self._parallel and (self._parallel.workers, self._parallel.n_seq, self._parallel.streams)
        have = self._parallel.per_stream if self._parallel is not None and current == wanted else 0
        per_stream = max(self.stream_cells(need), have)  # streams grow, never shrink
        if self._parallel is None or current != wanted or (streams and per_stream > have):
            if self._parallel is not None:
                self._sequential_evaluated += self._parallel.evaluated_tokens
                self._open.remove(self._parallel)
                self._parallel.close()
            # Streams: each holds one sequence, so each gets what the longest sequence needs.
            self._parallel = ParallelContext(llm, n_seq=slots, workers=self.n_parallel,
                                             n_ctx=per_stream if streams else self.parallel_ctx,
                                             n_batch=max(self.n_batch, 512), n_threads=self.n_threads,
                                             reuse=self.kv_reuse, host_bytes=self.kv_host_mb << 20,
                                             streams=streams)
            self._open.append(self._parallel)
        pool = self._parallel.pool
        pool.reuse = self.kv_reuse
        if (pool.stash.budget if pool.stash else 0) != self.kv_host_mb << 20:  # the setting changed
            pool.stash = HostStash(self.kv_host_mb << 20) if self.kv_host_mb else None
        return self._parallel

    @property
    def evaluated_tokens(self) -> int:
        """Tokens actually run through the model by `rate` and parallel `chat` (shows how much prefix
        reuse saved)."""
        return self._sequential_evaluated + (self._parallel.evaluated_tokens if self._parallel else 0)

    # --------------------------------------------------------------- prompts
    def render(self, conversation: Conversation, assistant_prefix: str = "") -> str:
        """The model's chat template applied, ready for the assistant's turn (plus a prefix)."""
        self._llm.metadata  # noqa: B018 - loads the model: the template comes from its GGUF metadata
        return self._formatter(messages=conversation).prompt + assistant_prefix

    def tokenize(self, text: str) -> list[int]:
        tokens = self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if len(tokens) >= self.n_ctx:
            raise PromptTooLongError(f"prompt of {len(tokens)} tokens does not fit the context of "
                                     f"{self.n_ctx}; raise n_ctx (a spec setting: @n_ctx=16384) or "
                                     "shorten the prompt")
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

    # -------------------------------------------------------------- generation
    def _generate(self, conversations: list[Conversation], params: GenerationParams) -> list[Completion]:
        if self.n_parallel > 1:
            return self._generate_parallel(conversations, params, [params.seed] * len(conversations))
        return self._generate_sequential(conversations, params)

    def _generate_each(self, conversations: list[Conversation],
                       params: list[GenerationParams]) -> list[Completion]:
        """Conversations that differ only in their seed go out as one parallel batch, each sequence
        sampling from its own seed."""
        if self.n_parallel > 1 and params and len({replace(p, seed=None) for p in params}) == 1:
            return self._generate_parallel(conversations, params[0], [p.seed for p in params])
        return super()._generate_each(conversations, params)

    def _generate_sequential(self, conversations: list[Conversation],
                             params: GenerationParams) -> list[Completion]:
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

    def _generate_parallel(self, conversations: list[Conversation], params: GenerationParams,
                           seeds: list[int | None]) -> list[Completion]:
        """Replies decoded side by side (`seeds[i]` draws conversation i's tokens when sampling);
        same sampler chain and stopping rules as `create_completion`."""
        if not conversations:
            return []
        token_lists = [self.tokenize(self.render(conv)) for conv in conversations]
        draws = [s if s is not None else 0 for s in seeds]
        # Identical prompts with one seed share one draw: decoded once, so batching noise between
        # their sequences cannot make copies of one conversation differ.
        draw_keys = [(tuple(tokens), seed if params.temperature > 0 else 0)
                     for tokens, seed in zip(token_lists, draws)]
        unique: dict[tuple, int] = {}
        for key in draw_keys:
            unique.setdefault(key, len(unique))
        keys = list(unique)
        # create_completion's clip: the reply may use what the sequential context has left.
        limits = [min(params.max_tokens, self.n_ctx - len(k[0])) for k in keys]
        grammar = self.grammar_for(params.json_schema) if params.json_schema is not None else None
        try:
            need = max(len(k[0]) + limit for k, limit in zip(keys, limits))
            replies = self._parallel_context(need).generate(
                [list(k[0]) for k in keys], limits, stop=params.stop, grammar=grammar,
                temperature=params.temperature, top_p=params.top_p, seeds=[k[1] for k in keys])
        except RuntimeError as exc:
            raise ModelError(f"llama.cpp parallel generation failed: {exc}") from exc
        out = []
        for tokens, key in zip(token_lists, draw_keys):
            r = replies[unique[key]]
            out.append(Completion(r.text.decode("utf-8", errors="ignore"), len(tokens), len(r.tokens),
                                  r.finish_reason))
        return out

    # ------------------------------------------------------------------ rating
    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        return self._scores_at_prefix(conversations, prefix, lambda: self._digit_ids)

    def _choice_logprobs(self, conversations: list[Conversation], prefix: str,
                         choices: tuple[str, ...]) -> list[DigitScores]:
        def ids():
            if choices not in self._choice_ids:
                llm = self._llm
                self._choice_ids[choices] = choice_token_ids(
                    lambda t: llm.tokenize(t.encode(), add_bos=False, special=False), choices)
            return self._choice_ids[choices]
        return self._scores_at_prefix(conversations, prefix, ids)

    def _scores_at_prefix(self, conversations: list[Conversation], prefix: str,
                          token_ids) -> list[DigitScores]:
        """Log-probs of the `token_ids()` groups at the position after each conversation + `prefix`."""
        if not conversations:
            return []
        token_lists = [self.tokenize(self.render(conv, prefix)) for conv in conversations]
        if self.n_parallel > 1:
            rows = self._parallel_context(max(map(len, token_lists)) + 1).last_logits(token_lists)
        else:
            # Sorted order puts prompts that share a prefix next to each other.
            order = sorted(range(len(token_lists)), key=lambda i: token_lists[i])
            rows = [None] * len(token_lists)
            for i in order:
                rows[i] = self._last_logits_sequential(token_lists[i])
        groups = token_ids()
        return [DigitScores(digit_logprobs_from_logits(row, groups), len(tokens))
                for row, tokens in zip(rows, token_lists)]

    def _last_logits_sequential(self, tokens: list[int]) -> np.ndarray:
        """Logits after `tokens` in the sequential context, evaluating only what differs from its cache."""
        llm = self._llm
        cached = np.asarray(llm.input_ids[: llm.n_tokens])
        wanted = np.asarray(tokens)
        m = min(len(cached), len(wanted))
        mismatch = np.flatnonzero(cached[:m] != wanted[:m])
        common = int(mismatch[0]) if mismatch.size else m
        common = min(common, len(tokens) - 1)  # always evaluate at least one token to get fresh logits
        llm.n_tokens = common
        llm.eval(tokens[common:])
        self._sequential_evaluated += len(tokens) - common
        ptr = llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()

    def reset_kv(self) -> None:
        """Forget every evaluated prompt (benchmarks use it to time a cold prefix)."""
        if self.loaded:
            self._llm.reset()
        if self._parallel is not None:
            self._parallel.reset()

    def close(self) -> None:
        """Free the context(s) and the weights; the next uncached call loads them again."""
        _release(self._open)
        self._parallel = None
        LlamaCppLLM._llm.discard(self)
