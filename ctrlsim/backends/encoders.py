"""Text encoders: `load_encoder(spec).encode(texts)` -> L2-normalised (n, d) float32 rows.

Two real runtimes: sentence-transformers (MiniLM, BGE, mxbai; by name or path)
and a plain transformers encoder with mean or pooled output (TwHIN-BERT is a
plain BERT, not a sentence-transformers model). Embeddings are cached on disk
by (encoder identity, text) so repeated item catalogues cost nothing, and the
weights load only when a text is in neither cache. The disk cache opens on the
first text the memory cache lacks; where its folder ($CTRLSIM_CACHE/embeddings)
cannot be written the encoder warns (`CacheUnavailableWarning`) and keeps its
embeddings in memory only. A vector another run stored first is the one used.

Constructing an encoder imports no model library: that the runtime is installed is checked
with `importlib.util.find_spec`, and sentence-transformers / transformers / torch are imported
on the first text neither cache has, so a run whose embeddings are all cached never loads them.

Spec: a bundled name (minilm, the default; mpnet, assembled once from its split packages)
or an alias (bge, twhin-bert, mxbai), `st:<id|path>`,
`hf:<id|path>[#mean|#pooler|#cls]`, or a bare path / hub id.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ctrlsim.backends._torch import default_device, import_torch, torch_threads
from ctrlsim.backends.bundled import BUNDLED_ENCODERS, bundled_encoder_path, cache_dir
from ctrlsim.backends.cache import SqliteStore
from ctrlsim.backends.hub import resolve_model
from ctrlsim.errors import (
    CacheUnavailableWarning,
    CacheUnwritableError,
    ConfigError,
    MissingDependencyError,
    ModelNotFoundError,
)
from ctrlsim.lazy import lazy

BGE_QUERY = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class EncoderSpec:
    model: str              # hub id or path
    runtime: str            # "st" (sentence-transformers) or "hf" (plain transformers)
    pooling: str = "mean"   # hf only: mean | pooler | cls
    query_prefix: str = ""
    passage_prefix: str = ""


ALIASES: dict[str, EncoderSpec] = {
    "bge": EncoderSpec("BAAI/bge-base-en-v1.5", "st", query_prefix=BGE_QUERY),
    "twhin-bert": EncoderSpec("Twitter/twhin-bert-base", "hf", pooling="pooler"),
    "mxbai": EncoderSpec("mixedbread-ai/mxbai-embed-large-v1", "st", query_prefix=BGE_QUERY),
}


class EmbeddingCache(SqliteStore):
    """float32 vectors keyed by sha256(identity, text)."""

    table = "vectors"
    value_column = "vec BLOB NOT NULL"

    def encode(self, value: np.ndarray) -> bytes:
        return np.asarray(value, dtype=np.float32).tobytes()

    def decode(self, stored: bytes) -> np.ndarray:
        if not isinstance(stored, bytes) or not stored or len(stored) % 4:
            raise ValueError(f"not a float32 vector ({type(stored).__name__} of length {len(stored)})")
        return np.frombuffer(stored, dtype=np.float32)


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class Encoder(ABC):
    """Batched, cached, L2-normalised text embeddings."""

    def __init__(self, name: str, spec: EncoderSpec, *, threads: int | None = 1, batch_size: int = 64,
                 cache: bool = True):
        self.name, self.spec = name, spec
        self.threads, self.batch_size = threads, batch_size
        self._memory: dict[str, np.ndarray] = {}
        self._use_disk = cache
        self._disk_opened = False
        self._disk_store: EmbeddingCache | None = None

    def __getstate__(self) -> dict:
        """Pickle / deepcopy: settings, the memory cache and the disk cache (which reopens its file),
        not the loaded weights: a copy loads them on its first text neither cache has."""
        state = self.__dict__.copy()
        state.pop("model", None)  # the `lazy` attribute's value
        if "_tokenizer" in state:
            state["_tokenizer"] = None  # loaded with the weights
        return state

    @property
    def _disk(self) -> EmbeddingCache | None:
        """The disk cache, opened on first use (a run whose texts are all in memory never opens it);
        None when caching is off or its folder cannot be written (then a warning, once)."""
        if self._use_disk and not self._disk_opened:
            self._disk_opened = True
            slug = hashlib.sha256(self.cache_identity().encode()).hexdigest()[:16]
            try:
                self._disk_store = EmbeddingCache(cache_dir("embeddings")
                                                  / f"{self.name.replace('/', '_')}-{slug}.sqlite")
            except CacheUnwritableError as exc:
                warnings.warn(CacheUnavailableWarning(
                    f"{exc}; embeddings of {self.name} are kept in memory only this run"), stacklevel=3)
        return self._disk_store

    @_disk.setter
    def _disk(self, store: EmbeddingCache | None) -> None:
        self._disk_opened, self._disk_store = True, store

    @property
    def identity(self) -> dict:
        """What actually ran; recorded with every result."""
        return {"encoder": self.name, "model": self.spec.model, "runtime": self.spec.runtime,
                "pooling": self.spec.pooling if self.spec.runtime == "hf" else None}

    def cache_identity(self) -> str:
        return repr(self.identity)

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory (they load on the first text the caches cannot answer)."""
        return Encoder.model.is_loaded(self)

    @lazy
    def model(self):
        """The weights, loaded on the first text neither cache has."""
        return self._load()

    @abstractmethod
    def _load(self):
        """Load and return the weights (called once, on the first cache miss)."""

    @abstractmethod
    def _embed(self, texts: list[str]) -> np.ndarray:
        """Raw (unnormalised) embeddings for a batch."""

    @property
    def dim(self) -> int:
        return int(self.encode(["dimension probe"]).shape[1])

    def encode(self, texts: Sequence[str], *, kind: str = "passage") -> np.ndarray:
        """(len(texts), d) float32, unit-norm rows. `kind="query"` adds the model's query prefix."""
        if kind not in ("passage", "query"):
            raise ConfigError(f"kind must be 'passage' or 'query', got {kind!r}")
        if isinstance(texts, str):
            raise ConfigError("encode expects a list of texts, not a single string")
        prefix = self.spec.query_prefix if kind == "query" else self.spec.passage_prefix
        full = [prefix + str(t) for t in texts]
        if not full:
            return np.zeros((0, 0), dtype=np.float32)
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in full]
        missing = [k for k in dict.fromkeys(keys) if k not in self._memory]
        if missing and self._disk is not None:
            self._memory.update(self._disk.get_many(missing))
        todo = {k: t for k, t in zip(keys, full) if k not in self._memory}
        if todo:
            todo_keys, todo_texts = list(todo), list(todo.values())
            chunks = []
            with torch_threads(self.threads):
                for start in range(0, len(todo_texts), self.batch_size):
                    chunks.append(_normalise(self._embed(todo_texts[start:start + self.batch_size])))
            fresh = dict(zip(todo_keys, np.concatenate(chunks)))
            if self._disk is not None:  # the stored vector wins (another run may have written it first)
                fresh = self._disk.put_many(fresh)
            self._memory.update(fresh)
        return np.stack([self._memory[k] for k in keys])


def _require(module: str, purpose: str) -> None:
    """A missing runtime is reported at construction, without importing it (importing
    sentence-transformers costs seconds, and a fully cached run never needs it)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, a module without a spec
        found = False
    if not found:
        raise MissingDependencyError(module, "encoders", purpose)


def _import_runtime(module: str, purpose: str):
    """The runtime module, imported on the first cache miss (a broken install is typed here too)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(module, "encoders", purpose) from exc


class SentenceTransformerEncoder(Encoder):
    def __init__(self, name: str, spec: EncoderSpec, *, device: str | None = None, **kwargs):
        _require("sentence_transformers", "text encoders")
        super().__init__(name, spec, **kwargs)
        self.device = device
        # Where the weights are is checked now (cheap); they load on the first cache miss.
        self.source = resolve_model(spec.model, offline_default="minilm")

    def _load(self):
        SentenceTransformer = _import_runtime("sentence_transformers", "text encoders").SentenceTransformer
        try:
            with torch_threads(self.threads):
                return SentenceTransformer(self.source, device=default_device(self.device))
        except OSError as exc:
            raise ModelNotFoundError(
                f"cannot load encoder {self.spec.model!r}: {exc}. It needs a local copy (path or "
                "Hugging Face cache) or network access to the hub; the offline default is 'minilm'.") from exc

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False)


class TransformersEncoder(Encoder):
    """A plain transformers encoder; pooling "mean" (masked), "pooler" (pooler_output) or "cls"."""

    def __init__(self, name: str, spec: EncoderSpec, *, device: str | None = None, max_length: int = 256,
                 **kwargs):
        if spec.pooling not in ("mean", "pooler", "cls"):
            raise ConfigError(f"pooling must be mean, pooler or cls, got {spec.pooling!r}")
        _require("transformers", "transformers encoders")
        super().__init__(name, spec, **kwargs)
        self.max_length = max_length
        self._device = device  # resolved (torch asked for CUDA) on first use, not here
        self._tokenizer = None
        self.source = resolve_model(spec.model, offline_default="minilm")  # checked now, loaded on first miss

    @property
    def device(self) -> str:
        """The torch device: the one asked for, else CUDA where torch sees it, else the CPU."""
        if self._device is None:
            self._device = default_device(None)
        return self._device

    @property
    def tokenizer(self):
        self.model  # noqa: B018 - `_load` reads the tokenizer with the weights
        return self._tokenizer

    def _load(self):
        transformers = _import_runtime("transformers", "transformers encoders")
        try:
            with torch_threads(self.threads):
                self._tokenizer = transformers.AutoTokenizer.from_pretrained(self.source)
                return transformers.AutoModel.from_pretrained(self.source).to(self.device).eval()
        except OSError as exc:
            raise ModelNotFoundError(
                f"cannot load encoder {self.spec.model!r}: {exc}. It needs a local copy (path or "
                "Hugging Face cache) or network access to the hub; the offline default is 'minilm'.") from exc

    def _embed(self, texts: list[str]) -> np.ndarray:
        torch = import_torch()
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt").to(self.device)
        with torch.inference_mode():
            out = self.model(**enc)
        if self.spec.pooling == "pooler" and getattr(out, "pooler_output", None) is not None:
            vecs = out.pooler_output
        elif self.spec.pooling == "cls":
            vecs = out.last_hidden_state[:, 0]
        else:  # mean over real tokens (also the fallback when a model has no pooler)
            mask = enc["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
            vecs = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1)
        return vecs.float().cpu().numpy()


def resolve_encoder_spec(spec: str) -> tuple[str, EncoderSpec]:
    """(display name, EncoderSpec) for a spec string."""
    if spec in BUNDLED_ENCODERS:
        return spec, EncoderSpec(str(bundled_encoder_path(spec)), "st")
    if spec in ALIASES:
        return spec, ALIASES[spec]
    head, sep, rest = spec.partition(":")
    if sep and head in ("st", "hf"):
        target, _, pooling = rest.partition("#")
        return rest, EncoderSpec(target, head, pooling=pooling or "mean")
    path = Path(spec).expanduser()
    if path.is_dir():
        runtime = "st" if (path / "modules.json").exists() else "hf"
        return spec, EncoderSpec(str(path), runtime)
    if "/" in spec:  # a hub id
        return spec, EncoderSpec(spec, "st")
    raise ModelNotFoundError(
        f"unknown encoder {spec!r}: not bundled ({sorted(BUNDLED_ENCODERS)}), "
        f"not an alias ({sorted(ALIASES)}), "
        "not a folder and not a hub id")


def load_encoder(spec: str = "minilm", *, threads: int | None = 1, device: str | None = None,
                 cache: bool = True, **options) -> Encoder:
    """Load a text encoder by spec (see module docstring)."""
    name, resolved = resolve_encoder_spec(spec)
    overrides = {k: options.pop(k) for k in ("query_prefix", "passage_prefix", "pooling") if k in options}
    if overrides:
        resolved = dataclasses.replace(resolved, **overrides)
    cls = SentenceTransformerEncoder if resolved.runtime == "st" else TransformersEncoder
    return cls(name, resolved, threads=threads, device=device, cache=cache, **options)
