"""The llama.cpp runtime profile: the settings of a run that can change a reply, carried by the spec.

A model spec names them after the model, each setting or profile after an `@`:

    qwen2.5-0.5b@kv_reuse=1,flash_attn=1
    qwen2.5-0.5b@bf16@n_parallel=1
    /models/own.gguf@exact@n_ctx=4096

so they are part of the spec string a config stores (and `config.json` records), never of the
environment. A profile name (`fast`, `exact`) sets every field at once; `key=value` settings after
it override single fields, and without a profile name they override the default profile (`fast`).
The settings:

  kv_reuse      keep KV prefixes between calls (each prompt evaluates only its new tokens)
  flash_attn    llama.cpp's flash-attention kernel (rounds differently)
  kv_streams    a KV stream per parallel sequence instead of one unified cache
  n_parallel    sequences decoded side by side (1: the sequential path, a fresh cache per reply)
  n_ctx         tokens one conversation may hold, prompt and reply
  n_gpu_layers  layers offloaded to a GPU (-1: all; needs a GPU build of llama.cpp)
  kv_host_mb    host memory (MiB) for KV states parked beside a reused cache (0: none)

`fast` is the default: KV prefixes kept between the calls of one unit, flash attention and a KV
stream per sequence, the fastest combination measured (docs/performance.md). `exact` replays the
numerics of runs made before profiles existed: every reply from an empty KV cache, the unified
cache, no flash attention. The LLM's identity and response-cache key name every setting that
differs from `exact`, so a record says which profile computed it.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ctrlsim.errors import ConfigError

# Default prompt-plus-reply limit of one conversation: a merge of a large cluster at the paper's size
# (100 -> 50 -> 25 probes) has prompts past 4,096 tokens. The bundled models train on 8k (SmolLM2)
# and 32k (Qwen2.5) contexts.
DEFAULT_N_CTX = 8192
SEPARATOR = "@"
_PAIR = r"[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.+-]*"
_SETTINGS_SEGMENT = re.compile(rf"{_PAIR}(,{_PAIR})*")
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


@dataclass(frozen=True)
class RuntimeProfile:
    """llama.cpp settings that can change a reply (see the module docstring); field names are
    `LlamaCppLLM`'s keyword arguments. The field defaults are the `exact` profile."""

    kv_reuse: bool = False
    flash_attn: bool = False
    kv_streams: bool = False
    n_parallel: int = 16
    n_ctx: int = DEFAULT_N_CTX
    n_gpu_layers: int = 0
    kv_host_mb: int = 2048

    def __post_init__(self):
        for name, low, bound in (("n_parallel", 1, ">= 1"), ("n_ctx", 256, ">= 256"),
                                 ("n_gpu_layers", -1, "-1 (all layers) or >= 0"), ("kv_host_mb", 0, ">= 0")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"runtime setting {name} must be an integer {bound}, got {value!r}")

    def options(self) -> dict:
        """The settings as `LlamaCppLLM` keyword arguments."""
        return dataclasses.asdict(self)

    def differences(self, other: RuntimeProfile | None = None) -> dict:
        """The settings that differ from `other` (the default profile when not given)."""
        base = (other or RuntimeProfile()).options()
        return {k: v for k, v in self.options().items() if base[k] != v}


# Named profiles: a spec segment with one of these names sets every field. `exact` replays runs made
# before profiles existed; `fast`, the default, is the fastest combination measured
# (docs/performance.md, "Fast by default").
PROFILES: dict[str, RuntimeProfile] = {
    "exact": RuntimeProfile(),
    "fast": RuntimeProfile(kv_reuse=True, flash_attn=True, kv_streams=True),
}
DEFAULT_PROFILE = "fast"
SETTINGS = tuple(f.name for f in dataclasses.fields(RuntimeProfile))


def _setting(key: str, text: str, where: str):
    kind = {f.name: f.type for f in dataclasses.fields(RuntimeProfile)}[key]
    value = text.strip().lower()
    if kind == "bool":
        if value in _TRUE or value in _FALSE:
            return value in _TRUE
        raise ConfigError(f"{where!r}: runtime setting {key} must be 0 or 1, got {text!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{where!r}: runtime setting {key} must be an integer, got {text!r}") from None


def _settings(segment: str, where: str) -> dict | None:
    """`{key: value}` for a `key=value[,key=value]` segment, None for a segment of another kind
    (a path, a URL's host and query: anything with a character no setting holds)."""
    if "=" not in segment or not _SETTINGS_SEGMENT.fullmatch(segment):
        return None
    found = {}
    for pair in segment.split(","):
        key, equals, text = pair.partition("=")
        key = key.strip()
        if not equals or key not in SETTINGS:
            raise ConfigError(f"{where!r}: unknown runtime setting {pair.strip()!r}; settings: "
                              f"{', '.join(SETTINGS)} (e.g. @kv_reuse=1,n_parallel=4)")
        found[key] = _setting(key, text, where)
    return found


def split_profile(target: str) -> tuple[str, RuntimeProfile | None]:
    """(model part, profile) of a spec target: the trailing `@` segments that are profile names or
    `key=value` settings are the profile (None when there are none); the rest names the model (a
    bundled name, possibly `@bf16`, a path or a hub id, which may hold an '@' of its own)."""
    if target.startswith(("http://", "https://")):  # a server's URL: its '@' is the credentials'
        return target, None
    segments = target.split(SEPARATOR)
    profile_name, overrides, cut = None, [], len(segments)
    while cut > 1:
        segment = segments[cut - 1]
        found = _settings(segment, target)
        if found is not None:
            if profile_name is not None:
                raise ConfigError(f"{target!r}: the profile comes before every key=value setting "
                                  f"(e.g. model@{DEFAULT_PROFILE}@n_parallel=1)")
            overrides.append(found)
        elif segment in PROFILES:
            if profile_name is not None:
                raise ConfigError(f"{target!r}: name one runtime profile, not {profile_name!r} and "
                                  f"{segment!r}")
            profile_name = segment
        else:
            break
        cut -= 1
    if cut == len(segments):
        return target, None
    fields = dict(PROFILES[profile_name or DEFAULT_PROFILE].options())
    for found in reversed(overrides):  # written left to right: a later setting wins
        fields.update(found)
    try:
        profile = RuntimeProfile(**fields)
    except ConfigError as exc:
        raise ConfigError(f"{target!r}: {exc}") from None
    return SEPARATOR.join(segments[:cut]), profile


__all__ = ["DEFAULT_N_CTX", "DEFAULT_PROFILE", "PROFILES", "RuntimeProfile", "SETTINGS", "split_profile"]
