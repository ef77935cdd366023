import numpy as np
import pytest

from ctrlsim.backends.encoders import ALIASES, load_encoder, resolve_encoder_spec
from ctrlsim.errors import ConfigError, ModelNotFoundError


def test_rows_are_unit_norm_and_related_texts_closer(minilm):
    v = minilm.encode(["A science fiction film about a war between starships in outer space.",
                       "Space battle movie with aliens and spaceships.",
                       "A cookbook of traditional Italian pasta recipes."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_disk_cache_serves_a_new_instance(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path))
    first = load_encoder("minilm")
    texts = ["alpha particle", "beta blocker"]
    a = first.encode(texts)
    second = load_encoder("minilm")
    second._embed = lambda batch: (_ for _ in ()).throw(AssertionError("model called despite cache"))
    assert np.array_equal(second.encode(texts), a)


def test_plain_transformers_mean_pooling_matches_sentence_transformers(minilm):
    plain = load_encoder("hf:" + minilm.spec.model + "#mean", cache=False)
    texts = ["a quiet film noir", "loud action movie"]
    assert np.allclose(plain.encode(texts), minilm.encode(texts), atol=1e-5)
    assert plain.identity["runtime"] == "hf" and plain.identity["pooling"] == "mean"


def test_query_prefix_applies_only_to_queries(minilm):
    enc = load_encoder("minilm", cache=False,
                       query_prefix="Represent this sentence for searching relevant passages: ")
    q = enc.encode(["horror movies"], kind="query")
    p = enc.encode(["horror movies"], kind="passage")
    assert not np.allclose(q, p)
    assert np.allclose(p, minilm.encode(["horror movies"]), atol=1e-6)


def test_aliases_and_errors():
    assert ALIASES["bge"].query_prefix.startswith("Represent this sentence")
    assert ALIASES["twhin-bert"].runtime == "hf"
    with pytest.raises(ModelNotFoundError, match="unknown encoder"):
        resolve_encoder_spec("nonsense")
    with pytest.raises(ModelNotFoundError, match="minilm"):
        load_encoder("bge")  # not available offline: the error names the offline default
    with pytest.raises(ConfigError):
        load_encoder("minilm", cache=False).encode("a single string")
