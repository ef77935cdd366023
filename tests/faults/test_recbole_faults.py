"""Damaged RecBole caches fail with a `ModelError` that names the cache folder (issue 11 point 2,
issue 14 point 8).

Kinds covered (12): meta.json without `test_metrics`, `item_tokens`, `model_config` or
`format` (4); a NaN test metric; an item-token list without the padding; a field of the wrong
type; a model config without a field the scorer reads; meta.json that is not JSON or is a
list (2); NaN or infinite weights (2).

A tiny SASRec is trained once (seconds) into a temporary cache; each test damages a copy.
"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from ctrlsim.data import Dataset
from ctrlsim.errors import MissingDependencyError, ModelError
from ctrlsim.recommenders.base import UserState
from ctrlsim.recommenders.recbole import SequentialConfig, SequentialRecommender

CONFIG = SequentialConfig(epochs=1, hidden_size=8, n_heads=1, train_batch_size=128, max_seq_length=5)


@pytest.fixture(scope="module")
def tiny() -> Dataset:
    ids = [f"m{i}" for i in range(30)]
    rng = np.random.default_rng(0)
    rows = []
    for user in range(40):
        start = int(rng.integers(0, len(ids)))
        rows += [(f"u{user}", ids[(start + t) % len(ids)], 4.0, 1000 + 10 * t + user) for t in range(8)]
    return Dataset.build("tiny", pd.DataFrame({"item_id": ids, "title": ids}),
                         pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "timestamp"]))


@pytest.fixture(scope="module")
def trained_cache(tiny, tmp_path_factory):
    """The cache root holding one trained tiny SASRec."""
    root = tmp_path_factory.mktemp("recbole-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTRLSIM_CACHE", str(root))
        try:
            rec = SequentialRecommender(tiny, "SASRec", config=CONFIG, progress=False)
        except MissingDependencyError as exc:
            pytest.skip(str(exc))
    return root, rec.cache_key


@pytest.fixture
def damaged(trained_cache, tmp_path, monkeypatch):
    """A private copy of the trained cache; returns its model folder (for the test to damage)."""
    root, key = trained_cache
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    monkeypatch.setenv("CTRLSIM_CACHE", str(copy))
    return copy / "recbole" / key


def _edit_meta(folder, change) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    change(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


def _open(tiny):
    return SequentialRecommender(tiny, "SASRec", config=CONFIG, progress=False)


def test_the_undamaged_copy_loads_and_scores(tiny, damaged):
    rec = _open(tiny)
    assert rec.loaded_from_cache and rec.cache_path == damaged
    assert np.isfinite(rec.score_all([UserState(history=("m1", "m2"))])[0]).all()


@pytest.mark.parametrize("field", ["test_metrics", "item_tokens", "model_config", "format"])
def test_missing_metadata_field(tiny, damaged, field):
    _edit_meta(damaged, lambda meta: meta.pop(field))
    with pytest.raises(ModelError, match=re.escape(str(damaged))) as err:
        _open(tiny)
    assert f"lacks field(s) ['{field}']" in str(err.value)


@pytest.mark.parametrize("change, named", [
    (lambda m: m["test_metrics"].update({"ndcg@10": float("nan")}), "test_metrics['ndcg@10'] is nan"),
    (lambda m: m.__setitem__("item_tokens", m["item_tokens"][1:]), "item_tokens must be null"),
    (lambda m: m.__setitem__("n_users", "40"), "field 'n_users' is '40'"),
    (lambda m: m["model_config"].pop("MAX_ITEM_LIST_LENGTH"), "model_config lacks ['MAX_ITEM_LIST_LENGTH']"),
])
def test_bad_metadata_value(tiny, damaged, change, named):
    _edit_meta(damaged, change)
    with pytest.raises(ModelError, match=re.escape(str(damaged))) as err:
        _open(tiny)
    assert named in str(err.value)


@pytest.mark.parametrize("text, named", [("{not json", "cannot read meta.json"),
                                         ("[1, 2]", "meta.json holds a list")])
def test_unreadable_metadata(tiny, damaged, text, named):
    (damaged / "meta.json").write_text(text)
    with pytest.raises(ModelError, match=re.escape(str(damaged))) as err:
        _open(tiny)
    assert named in str(err.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights(tiny, damaged, value):
    import torch

    state = torch.load(damaged / "model.pt", weights_only=True)
    name = "item_embedding.weight"
    state[name][3, 0] = value
    torch.save(state, damaged / "model.pt")
    rec = _open(tiny)  # metadata is fine; the weights are checked when they load
    with pytest.raises(ModelError, match=re.escape(str(damaged))) as err:
        rec.recommend([UserState(history=("m1",))], 5)
    assert f"weights ['{name}'] hold NaN or infinite values" in str(err.value)
