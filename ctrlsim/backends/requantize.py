"""Bundled models converted by llama.cpp's own quantizer: `qwen2.5-0.5b@bf16`, `@q4_0`, `@q8_0`.

Why: most of the bundled Qwen2.5-0.5B's weight matrices are Q5_0 or Q8_0, because their rows of
896 values do not split into Q4_K's 256-value blocks, and llama.cpp's CPU kernels for those
types are not its fastest. Two conversions evaluate prompts faster on the 2-core machine
(docs/performance.md, "Converted copies of the model"):

  bf16   every weight as a bfloat16. The 4- and 5-bit values of the original are held to an
         8-bit mantissa, so the copy is the same model up to rounding (its ratings moved by at
         most 0.08 and it made 15 of 16 first decisions as the original did); on CPUs with
         AVX512-BF16 (AMD Zen 4, Intel Sapphire Rapids) llama.cpp multiplies it with bfloat16
         dot-product instructions, about twice the original's prompt rate there. Elsewhere it is
         converted to float32 on the fly and slower. The file is about 2.6 times as large.
  q4_0   4-bit weights, which llama.cpp repacks at load into interleaved blocks its AVX2/AVX-512
         and ARM kernels multiply faster (about 1.5 times the prompt rate). A different model:
         re-quantized from already quantized weights, its replies and ratings differ.
  q8_0   8-bit weights; offered for runtimes and CPUs whose Q8_0 kernels are faster.

Results name the copy (`model`, and the copy's own sha256 in the identity and the response-cache
key), so runs of a copy and of the original never mix.

The copy is made once per cache folder (`<cache>/models/<file>.<type>.gguf`), under the same
lock as bundled-model assembly, and a JSON marker beside it records the source's sha256, the
copy's sha256, size and mtime and the llama.cpp version that wrote it. The copy is deterministic
for one llama.cpp version; another version may write other bytes, which its sha256 then names.
"""
from __future__ import annotations

import ctypes
import json
import os
import warnings
from pathlib import Path

from ctrlsim.backends.bundled import BUNDLED_LLMS, _assembling, _sha256, bundled_llm_path, cache_dir
from ctrlsim.errors import ConfigError, MissingDependencyError, ModelError, SlowKernelWarning

# Type name in a spec -> llama.cpp's file type constant (`llama_ftype`).
QUANT_TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
               "bf16": "LLAMA_FTYPE_MOSTLY_BF16"}
SEPARATOR = "@"


def split_derived(target: str) -> tuple[str, str] | None:
    """(bundled name, type) for a `name@type` spec target whose name is a bundled LLM, else None
    (a path or hub id may hold an '@' of its own). A bundled name with an unknown type is a
    `ConfigError` that lists the choices."""
    name, separator, quant = target.rpartition(SEPARATOR)
    if not separator or name not in BUNDLED_LLMS:
        return None
    if quant not in QUANT_TYPES:
        from ctrlsim.backends.llamacpp.profile import PROFILES

        raise ConfigError(f"{target!r}: unknown quantization or runtime profile {quant!r}; quantizations: "
                          f"{', '.join(f'{name}@{q}' for q in QUANT_TYPES)}; profiles: "
                          f"{', '.join(f'{name}@{p}' for p in PROFILES)}; or runtime settings (@key=value)")
    return name, quant


def require_llamacpp(spec: str, runtime: str | None, *, where: str = "") -> None:
    """A `ConfigError` (its message prefixed by `where`) when a converted bundled model is asked of
    a runtime other than llama.cpp: the copies are GGUF files only llama.cpp reads."""
    if runtime not in (None, "llamacpp"):
        raise ConfigError(f"{where}{spec!r}: converted bundled models (name@type) and runtime settings "
                          "(@key=value, @profile) run on llama.cpp only; drop the runtime prefix or write "
                          "llamacpp:")


def _marker(path: Path) -> Path:
    return path.with_name(f"{path.name}.derived.json")


def _valid_copy(path: Path, source_sha256: str, quant: str) -> str | None:
    """The copy's sha256 when `path` is the finished copy the marker describes, else None."""
    marker = _marker(path)
    if not path.is_file() or not marker.is_file():
        return None
    try:
        facts = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    stat = path.stat()
    expected = {"source_sha256": source_sha256, "type": quant, "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns}
    if any(facts.get(key) != value for key, value in expected.items()):
        return None
    return facts.get("sha256")


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError as exc:
        raise MissingDependencyError("llama_cpp", "llm", "converting a GGUF model") from exc
    return llama_cpp


def _quantize(source: Path, partial: Path, quant: str, threads: int) -> None:
    """llama.cpp's `llama_model_quantize` from `source` into `partial` (re-quantizing allowed)."""
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANT_TYPES[quant])
    params.allow_requantize = True  # the bundled weights are already quantized
    params.nthread = threads
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise ModelError(f"llama.cpp could not convert {source} to {quant} (llama_model_quantize "
                         f"returned {code})")


def has_bf16_kernels() -> bool:
    """Whether the installed llama.cpp was built with AVX512-BF16 (its own system report says so;
    the default pip build targets the CPU it is built on)."""
    return "AVX512_BF16 = 1" in _llama_cpp().llama_print_system_info().decode()


def derived_llm_path(target: str, *, threads: int = 1) -> tuple[Path, str]:
    """(path, sha256) of the converted copy `target` names (`name@type`), made on first use with
    `threads` CPU threads (the bytes do not depend on them)."""
    split = split_derived(target)
    if split is None:
        raise ConfigError(f"{target!r} names no converted bundled model (expected name{SEPARATOR}type)")
    name, quant = split
    if quant == "bf16" and not has_bf16_kernels():
        warnings.warn(SlowKernelWarning(
            f"{target}: this llama.cpp build has no AVX512-BF16 kernels, so the BF16 copy runs slower "
            f"than {name} itself (docs/performance.md, 'Converted copies of the model')"), stacklevel=2)
    model = BUNDLED_LLMS[name]
    source = bundled_llm_path(name)
    path = cache_dir("models") / f"{Path(model.filename).stem}.{quant}.gguf"
    sha = _valid_copy(path, model.sha256, quant)
    if sha:
        return path, sha
    with _assembling(path):
        sha = _valid_copy(path, model.sha256, quant)
        if sha:  # another process made it while this one waited
            return path, sha
        partial = path.with_name(f"{path.name}.partial")  # a killed writer's leftover is overwritten
        _quantize(source, partial, quant, threads)
        sha = _sha256(partial)
        os.replace(partial, path)  # keeps the mtime the marker records
        stat = path.stat()
        facts = {"source": model.filename, "source_sha256": model.sha256, "type": quant, "sha256": sha,
                 "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "llama_cpp": _llama_cpp().__version__}
        _marker(path).write_text(json.dumps(facts, indent=1), encoding="utf-8")
    return path, sha


__all__ = ["QUANT_TYPES", "derived_llm_path", "has_bf16_kernels", "require_llamacpp", "split_derived"]
