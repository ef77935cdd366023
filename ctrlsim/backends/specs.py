"""`load_llm(spec)`: one spec string picks the model and the runtime.

Spec grammar: `[runtime:]target`
  runtime  llamacpp | transformers | vllm | openai   (optional)
  target   a bundled name (qwen2.5-1.5b, qwen2.5-0.5b, smollm2-135m), a bundled
           name converted by llama.cpp (`qwen2.5-0.5b@bf16`, `@q4_0`, `@q8_0`:
           `ctrlsim.backends.requantize`), a GGUF file, a Hugging Face folder,
           a hub id, or (openai) a base URL with an optional "#model" suffix.
  @...     llama.cpp runtime settings after the model (`qwen2.5-0.5b@kv_reuse=1,n_parallel=4`,
           a profile such as `@exact`): see `ctrlsim.backends.llamacpp.profile`. They are part
           of the spec, so a config records them; no environment variable sets them.
Without a runtime: bundled names (converted or not) and .gguf files use
llama.cpp, http(s) URLs the OpenAI-compatible client, folders and hub ids
transformers.
"""
from __future__ import annotations

import os
from pathlib import Path

from ctrlsim.backends.bundled import BUNDLED_LLMS, DEFAULT_LLM, bundled_llm_path
from ctrlsim.backends.cache import ResponseCache
from ctrlsim.backends.llamacpp.profile import DEFAULT_PROFILE, PROFILES, split_profile
from ctrlsim.backends.llm import LLM
from ctrlsim.backends.meter import TokenMeter
from ctrlsim.backends.requantize import derived_llm_path, require_llamacpp, split_derived
from ctrlsim.errors import ConfigError, ModelNotFoundError

RUNTIMES = ("llamacpp", "transformers", "vllm", "openai")


def _env_int(name: str, default: int, low: int, bound: str) -> int:
    """The integer in $name (`default` when unset), at least `low`; `bound` says so in the error."""
    value = os.environ.get(name, str(default))
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from exc
    if number < low:
        raise ConfigError(f"{name} must be {bound}, got {number}")
    return number


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """Threads for CPU runtimes: $CTRLSIM_THREADS, else every CPU the process may use (llama.cpp's
    own choice). On a machine other jobs share, set CTRLSIM_THREADS=1: threads that wait for a busy
    core spin instead of yielding it."""
    return _env_int("CTRLSIM_THREADS", available_cpus(), 1, ">= 1")


def parse_spec(spec: str) -> tuple[str | None, str]:
    head, sep, rest = spec.partition(":")
    if sep and head in RUNTIMES:
        return head, rest
    return None, spec


def _implied_runtime(model: str, derived) -> str:
    """The runtime of a spec without a `runtime:` prefix, from its model part (settings split off)."""
    if model in BUNDLED_LLMS or derived is not None or model.endswith(".gguf"):
        return "llamacpp"
    if model.startswith(("http://", "https://")):
        return "openai"
    return "transformers"


def runtime_of(spec: str) -> str:
    """The runtime `load_llm(spec)` loads the model on (nothing is loaded or checked on disk)."""
    runtime, target = parse_spec(spec.strip())
    if runtime is not None:
        return runtime
    model, _ = split_profile(target)
    return _implied_runtime(model, split_derived(model))


def with_llamacpp_settings(spec: str, **settings) -> str:
    """`spec` with llama.cpp runtime settings changed (`n_parallel=3`): the model part and its other
    settings are kept, and every setting that differs from the default profile is written out as one
    `@key=value,...` segment (so the result names the whole profile). A `ConfigError` for a spec that
    does not run on llama.cpp or an unknown setting."""
    import dataclasses

    if runtime_of(spec) != "llamacpp":
        raise ConfigError(f"{spec!r} runs on {runtime_of(spec)}, not llama.cpp: it has no runtime settings")
    runtime, target = parse_spec(spec.strip())
    model, profile = split_profile(target)
    try:
        changed = dataclasses.replace(profile or PROFILES[DEFAULT_PROFILE], **settings)
    except TypeError:
        raise ConfigError(f"unknown llama.cpp runtime setting(s) {sorted(settings)}") from None
    written = {**changed.differences(PROFILES[DEFAULT_PROFILE]),
               **{key: getattr(changed, key) for key in settings}}
    segment = ",".join(f"{key}={int(value)}" for key, value in written.items())
    return f"{runtime + ':' if runtime else ''}{model}@{segment}"


def load_llm(spec: str = DEFAULT_LLM, *, meter: TokenMeter | None = None,
             cache: ResponseCache | str | Path | None = None, threads: int | None = None, **options) -> LLM:
    """Load an LLM from a spec string (see module docstring). `cache` may be a path."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"LLM spec must be a non-empty string (a bundled name {sorted(BUNDLED_LLMS)}, "
                          f"a .gguf file, a folder, a hub id or a URL), got {spec!r}")
    runtime, target = parse_spec(spec.strip())
    if not target.strip():
        raise ConfigError(f"LLM spec {spec!r} names the runtime {runtime!r} but no model")
    if isinstance(cache, (str, Path)):
        cache = ResponseCache(cache)
    threads = threads or default_threads()
    target, profile = split_profile(target)
    derived = split_derived(target)
    if derived is not None or profile is not None:
        require_llamacpp(spec, runtime)
    if runtime is None:
        runtime = _implied_runtime(target, derived)

    if runtime == "llamacpp":
        from ctrlsim.backends.llamacpp.llm import LlamaCppLLM

        options = {**(profile or PROFILES[DEFAULT_PROFILE]).options(), **options}

        if target in BUNDLED_LLMS:
            return LlamaCppLLM(bundled_llm_path(target), model_id=target, sha256=BUNDLED_LLMS[target].sha256,
                               n_threads=threads, meter=meter, cache=cache, **options)
        if derived is not None:
            path, sha256 = derived_llm_path(target, threads=threads)
            return LlamaCppLLM(path, model_id=target, sha256=sha256, n_threads=threads, meter=meter,
                               cache=cache, **options)
        path = Path(target).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"no GGUF file at {path}; bundled names: {sorted(BUNDLED_LLMS)}")
        return LlamaCppLLM(path, n_threads=threads, meter=meter, cache=cache, **options)

    if runtime == "transformers":
        from ctrlsim.backends.hf import TransformersLLM

        if target in BUNDLED_LLMS:  # the bundled GGUF, de-quantised by transformers (slow, heavy)
            path = bundled_llm_path(target)
            return TransformersLLM(path.parent, gguf_file=path.name, model_id=target, threads=threads,
                                   meter=meter, cache=cache, **options)
        if Path(target).expanduser().suffix == ".gguf":
            path = Path(target).expanduser()
            return TransformersLLM(path.parent, gguf_file=path.name, threads=threads,
                                   meter=meter, cache=cache, **options)
        return TransformersLLM(target, threads=threads, meter=meter, cache=cache, **options)

    if runtime == "vllm":
        from ctrlsim.backends.vllm_backend import VLLMLLM

        return VLLMLLM(target, meter=meter, cache=cache, **options)

    if runtime == "openai":
        from ctrlsim.backends.openai_compat import OpenAICompatLLM

        url, _, model = target.partition("#")
        return OpenAICompatLLM(url, model=model or None, meter=meter, cache=cache, **options)
    raise ConfigError(f"unknown runtime {runtime!r}; choose from {RUNTIMES}")
