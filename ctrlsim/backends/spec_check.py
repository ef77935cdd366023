"""Check an LLM spec string without loading anything (runners call this before the first model loads).

A spec that can only fail (an unknown bundled name, a GGUF file or folder that does not exist, a URL
without a host) is a `ConfigError` or `ModelNotFoundError` up front, not a failure of every unit
later. Whether a server answers is not checked here: an unreachable server fails the units that
need it, and a rerun retries them.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from ctrlsim.errors import ConfigError, ModelNotFoundError


def check_llm_spec(spec: object, *, name: str = "llm") -> None:
    """Raise if `spec` cannot name a loadable LLM (see `ctrlsim.backends.specs` for the grammar)."""
    from ctrlsim.backends.bundled import BUNDLED_LLMS
    from ctrlsim.backends.specs import RUNTIMES, parse_spec

    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{name}: an LLM spec must be a non-empty string, got {spec!r}")
    runtime, target = parse_spec(spec.strip())
    if not target.strip():
        raise ConfigError(f"{name}: spec {spec!r} names the runtime {runtime!r} but no model")
    from ctrlsim.backends.llamacpp.profile import split_profile
    from ctrlsim.backends.requantize import require_llamacpp, split_derived

    target, profile = split_profile(target.strip())  # raises for an unknown or malformed setting
    if profile is not None:
        require_llamacpp(spec, runtime, where=f"{name}: ")
    if target.startswith(("http://", "https://")):
        if runtime not in (None, "openai", "vllm"):
            raise ConfigError(f"{name}: the {runtime} runtime cannot load a URL ({spec!r})")
        url = urlparse(target.split("#", 1)[0])
        if not url.hostname:
            raise ConfigError(f"{name}: {spec!r} is not a URL with a host")
        return
    if runtime == "openai":
        raise ConfigError(f"{name}: the openai runtime needs an http(s) URL, got {spec!r}")
    if target in BUNDLED_LLMS:
        return
    if split_derived(target) is not None:  # raises for an unknown quantization type
        require_llamacpp(spec, runtime, where=f"{name}: ")
        return
    path = Path(target).expanduser()
    looks_like_path = target.endswith(".gguf") or target.startswith(("/", ".", "~")) or path.exists()
    if looks_like_path:
        if not path.exists():
            raise ModelNotFoundError(f"{name}: no model file or folder at {path} (spec {spec!r}); bundled "
                                     f"names: {', '.join(sorted(BUNDLED_LLMS))}")
        return
    if runtime is None and "/" not in target:
        raise ModelNotFoundError(f"{name}: {spec!r} is not a bundled LLM "
                                 f"({', '.join(sorted(BUNDLED_LLMS))}), a path, a hub id (org/name) or a "
                                 "URL; "
                                 f"runtimes: {', '.join(RUNTIMES)}")


def llm_cache_uses(spec: str | None) -> dict[str, str]:
    """The cache subfolders loading LLM `spec` writes: a bundled model is assembled or verified in
    `models/`; a file, a hub id or a server needs nothing there (nothing is loaded here)."""
    from ctrlsim.backends.bundled import BUNDLED_LLMS
    from ctrlsim.backends.specs import parse_spec

    if not isinstance(spec, str):
        return {}
    from ctrlsim.backends.llamacpp.profile import split_profile

    _, target = parse_spec(spec.strip())
    target, _ = split_profile(target)
    if target in BUNDLED_LLMS:
        return {"models": f"the bundled LLM {target} (assembled or verified once)"}
    from ctrlsim.backends.requantize import split_derived

    if split_derived(target) is not None:
        return {"models": f"the bundled LLM {target} (converted once)"}
    return {}
