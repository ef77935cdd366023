"""An encoder whose texts are all in its caches imports no model library (checked in a subprocess)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ctrlsim.backends import load_encoder
from ctrlsim.backends.encoders import SentenceTransformerEncoder, TransformersEncoder, resolve_encoder_spec
from ctrlsim.errors import MissingDependencyError

TEXTS = ["a space opera", "a romantic comedy", "a haunted house"]
HEAVY = ("torch", "sentence_transformers", "transformers")

# Encodes TEXTS with `spec` in a fresh interpreter and prints the vectors and the heavy modules it imported.
ENCODE = """
import json, sys
from ctrlsim.backends import load_encoder
encoder = load_encoder(sys.argv[1])
vectors = encoder.encode(json.loads(sys.argv[2]))
print(json.dumps({"vectors": vectors.tolist(), "loaded": encoder.loaded,
                  "imported": [m for m in json.loads(sys.argv[3]) if m in sys.modules]}))
"""


def _encode_in_subprocess(spec: str, cache_root) -> dict:
    done = subprocess.run([sys.executable, "-c", ENCODE, spec, json.dumps(TEXTS), json.dumps(HEAVY)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "CTRLSIM_CACHE": str(cache_root)})
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def minilm_spec():
    try:
        load_encoder("minilm", cache=False)
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    return "minilm"


@pytest.mark.parametrize("spec_of", [lambda path: "minilm", lambda path: f"hf:{path}#mean"],
                         ids=["sentence-transformers", "plain-transformers"])
def test_a_fully_cached_encode_imports_no_model_library(tmp_path, monkeypatch, minilm_spec, spec_of):
    spec = spec_of(resolve_encoder_spec("minilm")[1].model)
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path))
    expected = load_encoder(spec).encode(TEXTS)  # computed here: the weights load, the cache fills
    warm = _encode_in_subprocess(spec, tmp_path)
    assert warm["imported"] == [] and warm["loaded"] is False
    assert np.array_equal(np.asarray(warm["vectors"], dtype=np.float32), expected)


def test_a_cache_miss_still_loads_the_weights(tmp_path, minilm_spec):
    cold = _encode_in_subprocess("minilm", tmp_path)  # empty cache: the model runs
    assert cold["loaded"] is True and {"torch", "sentence_transformers"} <= set(cold["imported"])


def test_construction_imports_no_runtime_and_reports_a_missing_one(monkeypatch):
    name, spec = resolve_encoder_spec("minilm")
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match="sentence_transformers"):
        SentenceTransformerEncoder(name, spec)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependencyError, match="transformers"):
        TransformersEncoder(name, spec)


def test_transformers_encoder_resolves_its_device_on_first_use(minilm_spec):
    name, spec = resolve_encoder_spec("hf:" + resolve_encoder_spec("minilm")[1].model)
    assert TransformersEncoder(name, spec, device="cpu").device == "cpu"
    assert TransformersEncoder(name, spec).device in ("cpu", "cuda")
