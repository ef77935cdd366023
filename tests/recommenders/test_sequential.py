"""RecBole sequential black boxes (SASRec, NARM): training, caching, id mapping, behaviour.

The ml-100k models are trained once per cache (a few epochs, see TEST_CONFIG)
and reloaded from `cache_dir("recbole", ...)` on later runs. A tiny synthetic
dataset (seconds to train, in a temporary cache) covers odd item ids, unseen
items, the RecBole side-effect sandbox and cache corruption.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from ctrlsim.data import Dataset
from ctrlsim.errors import (
    ConfigError,
    EmptyHistoryError,
    MissingDependencyError,
    ModelError,
    UnknownItemError,
)
from ctrlsim.recommenders import make_recommender
from ctrlsim.recommenders.base import UserState
from ctrlsim.recommenders.recbole import SequentialConfig, SequentialRecommender

# Short training for tests (under a minute per model on one idle core): two epochs with
# history length 10 already show genre structure (horror share of the top 20 about 0.3 for
# SASRec and 0.9 for NARM against a 0.055 base rate); the slow test covers the default config.
TEST_CONFIG = SequentialConfig(epochs=2, train_batch_size=256, learning_rate=0.003, max_seq_length=10)
THREADS = 1  # robust on shared CPUs; oversubscribed OpenMP threads slow RecBole training badly
MODELS = ("SASRec", "NARM")


def _build(dataset, model, **kwargs):
    try:
        return SequentialRecommender(dataset, model, **kwargs)
    except MissingDependencyError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def seq_models(ml100k):
    """SASRec and NARM on ml-100k, trained on first use and cached."""
    return {m: _build(ml100k, m, config=TEST_CONFIG, threads=THREADS) for m in MODELS}


@pytest.fixture(scope="session")
def horror_history(ml100k):
    """The ten most popular ml-100k films whose only genre is Horror, most popular first."""
    horror = ml100k.items[ml100k.items["item_id"].isin(ml100k.items_with_tag("Horror"))]
    pure = horror[horror["tags"].apply(lambda tags: tags == ("Horror",))]
    top = pure.sort_values("popularity", ascending=False, kind="stable")["item_id"].head(10)
    return tuple(top.tolist())


def _user_states(ds, users):
    return [UserState(history=tuple(ds.history_ids(u)[-15:]), user_id=u) for u in users]


# ------------------------------------------------------------------ no training needed
def test_import_is_lazy():
    code = ("import sys, ctrlsim.recommenders.recbole; "
            "bad = [m for m in ('torch', 'recbole') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_json_round_trip():
    cfg = SequentialConfig(epochs=7, hidden_size=32, n_heads=4, seed=3,
                           recbole_params={"hidden_dropout_prob": 0.2, "hidden_act": "relu"})
    assert SequentialConfig.from_dict(cfg.to_dict()) == cfg
    assert SequentialConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["recbole_params"] == {"hidden_act": "relu", "hidden_dropout_prob": 0.2}
    assert SequentialConfig().to_dict()["max_seq_length"] == 20
    overrides = cfg.recbole_overrides()
    assert overrides["MAX_ITEM_LIST_LENGTH"] == 20 and overrides["hidden_size"] == 32
    assert "embedding_size" not in overrides  # None keeps RecBole's model default


@pytest.mark.parametrize("bad", [
    {"epochs": 0}, {"train_batch_size": -1}, {"learning_rate": 0}, {"seed": -1}, {"hidden_size": 0},
    {"recbole_params": {"epochs": 3}}, {"recbole_params": {"data_path": "/tmp"}},
    {"recbole_params": {"hidden_size": 8}}, {"recbole_params": {"x": object()}},
])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError):
        SequentialConfig(**bad)


def test_config_rejects_unknown_field():
    with pytest.raises(ConfigError, match="unknown SequentialConfig field"):
        SequentialConfig.from_dict({"epochs": 3, "hidden": 8})


def test_architecture_override_must_exist_for_the_model(ml100k):
    with pytest.raises(ConfigError, match="NARM has no parameter"):
        _build(ml100k, "NARM", config=SequentialConfig(n_heads=2))


@pytest.mark.parametrize("name, match", [
    ("NoSuchModel", "unknown RecBole sequential model"),
    ("BPR", "not a sequential one"),
    ("FDSA", "not supported"),
    ("", "model name is required"),
])
def test_bad_model_names_raise_model_error(ml100k, name, match):
    with pytest.raises(ModelError, match=match):
        _build(ml100k, name)


# ------------------------------------------------------------------ ml-100k behaviour
@pytest.mark.parametrize("model", MODELS)
def test_horror_history_gives_more_horror_than_base_rate(seq_models, ml100k, horror_history, model):
    rec = seq_models[model]
    horror = set(ml100k.items_with_tag("Horror"))
    base_rate = len(horror) / len(ml100k.items)
    slate = rec.recommend([UserState(history=horror_history)], 20)[0]
    share = np.mean([i in horror for i in slate.item_ids])
    assert share > base_rate, (model, share, base_rate, slate.item_ids)


@pytest.mark.parametrize("model", MODELS)
def test_history_items_never_come_back(seq_models, ml100k, horror_history, model):
    rec = seq_models[model]
    states = _user_states(ml100k, ml100k.user_ids[:20]) + [UserState(history=horror_history)]
    for state, slate in zip(states, rec.recommend(states, 50)):
        assert len(slate) == 50
        assert not set(slate.item_ids) & set(state.history)
    # score_all itself does not mask history; the exclusion is the recommender option.
    scores = rec.score_all(states[-1:])
    assert np.isfinite(scores[0, ml100k.indices(horror_history)]).all()


@pytest.mark.parametrize("model", MODELS)
def test_batch_equals_one_by_one(seq_models, ml100k, horror_history, model):
    rec = seq_models[model]
    long_history = tuple(ml100k.history_ids(ml100k.user_ids[0]))  # longer than MAX_ITEM_LIST_LENGTH
    assert len(long_history) > TEST_CONFIG.max_seq_length
    states = [UserState(history=horror_history[:1]), UserState(history=horror_history),
              UserState(history=long_history), UserState(history=("50", "50", "181"))]
    batch = rec.score_all(states)
    single = np.vstack([rec.score_all([s]) for s in states])
    assert batch.shape == (len(states), len(ml100k.items))
    np.testing.assert_allclose(batch, single, rtol=1e-5, atol=1e-5)
    slates_batch = [s.item_ids for s in rec.recommend(states, 20)]
    slates_single = [rec.recommend([s], 20)[0].item_ids for s in states]
    assert slates_batch == slates_single
    # Only the last MAX_ITEM_LIST_LENGTH items matter.
    tail = UserState(history=long_history[-TEST_CONFIG.max_seq_length:])
    np.testing.assert_array_equal(rec.score_all([tail])[0], single[2])


@pytest.mark.parametrize("model", MODELS)
def test_cached_reload_gives_identical_scores(seq_models, ml100k, horror_history, model):
    rec = seq_models[model]
    again = _build(ml100k, model, config=TEST_CONFIG, threads=THREADS, progress=False)
    assert again.loaded_from_cache and again.cache_key == rec.cache_key
    states = _user_states(ml100k, ml100k.user_ids[:10]) + [UserState(history=horror_history)]
    np.testing.assert_array_equal(again.score_all(states), rec.score_all(states))


def test_cached_model_loads_its_weights_on_the_first_scores(seq_models, ml100k, horror_history):
    trained = seq_models["NARM"]
    again = _build(ml100k, "narm", config=TEST_CONFIG, threads=THREADS, progress=False)
    assert again.loaded_from_cache and not again.model_loaded
    # Metadata, the id mapping and input checks need no weights.
    assert again.identity["test_metrics"] == trained.test_metrics
    np.testing.assert_array_equal(again.internal_ids, trained.internal_ids)
    with pytest.raises(EmptyHistoryError):
        again.recommend([UserState()], 5)
    with pytest.raises(UnknownItemError):
        again.recommend([UserState(history=("no-such-film",))], 5)
    assert not again.model_loaded
    slate = again.recommend([UserState(history=horror_history)], 10)[0]
    assert again.model_loaded
    assert slate.item_ids == trained.recommend([UserState(history=horror_history)], 10)[0].item_ids


def test_cached_construction_imports_neither_torch_nor_recbole(seq_models):
    """A run whose slates are all stored builds its boxes without loading torch or RecBole."""
    code = (
        "import sys; from ctrlsim.data import load_dataset; "
        "from ctrlsim.recommenders import make_recommender; "
        "from ctrlsim.recommenders.recbole import SequentialConfig; "
        f"cfg = SequentialConfig.from_json({TEST_CONFIG.to_json()!r}); ds = load_dataset('ml-100k'); "
        "boxes = [make_recommender(n, ds, config=cfg, progress=False) for n in ('sasrec', 'narm')]; "
        "assert all(b.loaded_from_cache and not b.model_loaded for b in boxes); "
        "bad = [m for m in ('torch', 'recbole') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("model", MODELS)
def test_id_mapping_is_exact(seq_models, ml100k, model):
    rec = seq_models[model]
    tokens, internal = rec.item_tokens, rec.internal_ids
    assert tokens[0] is None and len(tokens) == len(ml100k.items) + 1  # every ml-100k item is rated
    for i, item_id in enumerate(ml100k.item_ids):
        assert internal[i] > 0 and tokens[internal[i]] == item_id
    # Catalogue column i carries the model's score for the item's own internal id (no shift).
    states = _user_states(ml100k, ml100k.user_ids[:5])
    np.testing.assert_array_equal(rec.score_all(states), rec.score_internal(states)[:, internal])


@pytest.mark.parametrize("model", MODELS)
def test_scores_reproduce_recboles_own_test_metrics(seq_models, ml100k, model):
    """Leave-one-out by time over all users, ranked with score_all, gives RecBole's test NDCG@10/Hit@10.

    An off-by-one between item ids and model indices would collapse both to ~0.
    """
    rec = seq_models[model]
    states, targets = [], []
    for user in ml100k.user_ids:
        history = ml100k.history_ids(user)
        states.append(UserState(history=tuple(history[:-1]), user_id=user))
        targets.append(history[-1])
    scores = rec.score_all(states)
    target_scores = scores[np.arange(len(states)), ml100k.indices(targets)]
    rank = (scores > target_scores[:, None]).sum(axis=1)
    ndcg = float(np.where(rank < 10, 1.0 / np.log2(rank + 2.0), 0.0).mean())
    hit = float((rank < 10).mean())
    assert ndcg == pytest.approx(rec.test_metrics["ndcg@10"], abs=2e-3)
    assert hit == pytest.approx(rec.test_metrics["hit@10"], abs=3e-3)
    assert rec.test_metrics["ndcg@10"] > 0.03  # the popularity baseline is ~0.022


@pytest.mark.parametrize("model", MODELS)
def test_empty_history_raises(seq_models, model):
    rec = seq_models[model]
    with pytest.raises(EmptyHistoryError, match="state 1 \\(user 'u9'\\) has an empty history"):
        rec.score_all([UserState(history=("50",)), UserState(user_id="u9")])
    with pytest.raises(EmptyHistoryError):
        rec.recommend([UserState()], 5)


def test_unknown_item_is_rejected(seq_models):
    with pytest.raises(UnknownItemError):
        seq_models["SASRec"].recommend([UserState(history=("50", "no-such-film"))], 5)


def test_identity_and_metadata(seq_models, ml100k):
    for model, rec in seq_models.items():
        ident = rec.identity
        assert ident["model"] == model and ident["recommender"] == model.lower()
        assert ident["dataset"] == "ml-100k" and ident["cache_key"] == rec.cache_key
        assert set(ident["test_metrics"]) == {"ndcg@10", "hit@10"}
        assert rec.cache_path.name == rec.cache_key
        assert rec.meta["config"] == TEST_CONFIG.to_dict()
        assert rec.meta["model_config"]["MAX_ITEM_LIST_LENGTH"] == TEST_CONFIG.max_seq_length
        assert rec.meta["model_config"]["train_neg_sample_args"] is None or \
            rec.meta["model_config"]["train_neg_sample_args"].get("distribution") == "none"
        assert rec.meta["n_interactions"] == len(ml100k.interactions)
        assert 1 <= rec.meta["epochs_run"] <= TEST_CONFIG.epochs and rec.train_seconds > 0
    sas = seq_models["SASRec"].meta["model_config"]
    assert (sas["hidden_size"], sas["n_layers"], sas["n_heads"]) == (64, 2, 2)  # CtrlBench-Rec's SASRec
    assert seq_models["SASRec"].cache_key != seq_models["NARM"].cache_key


def test_mask_shown(seq_models, ml100k, horror_history):
    first = seq_models["NARM"].recommend([UserState(history=horror_history)], 10)[0].item_ids
    masking = _build(ml100k, "NARM", config=TEST_CONFIG, threads=THREADS, mask_shown=True, progress=False)
    second = masking.recommend([UserState(history=horror_history, shown=tuple(first))], 10)[0].item_ids
    assert len(second) == 10 and not set(first) & set(second)


# ------------------------------------------------------------------ tiny dataset (trains in seconds)
ODD_IDS = ["NA", "None", "a b", '"quoted"', "007", "7", "x,y", "[PAD]", "é"]


@pytest.fixture
def tiny():
    """Odd item ids, one item nobody rated, 60 users with structured sequences."""
    ids = ODD_IDS + [f"m{i}" for i in range(40)] + ["never-rated"]
    rated = ids[:-1]
    rng = np.random.default_rng(0)
    rows = []
    for user in range(60):
        start = int(rng.integers(0, len(rated)))
        for t in range(12):
            rows.append((f"user {user}", rated[(start + t) % len(rated)], 4.0, 10_000 + 10 * t + user))
    items = pd.DataFrame({"item_id": ids, "title": ids})
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "timestamp"])
    return Dataset.build("tiny odd/ids", items, inter)


TINY_CONFIG = SequentialConfig(epochs=2, hidden_size=16, n_heads=1, train_batch_size=128, max_seq_length=5)


def _torch():
    from ctrlsim.recommenders.recbole.sandbox import import_torch

    try:
        return import_torch()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))


def test_tiny_training_sandbox_mapping_and_reload(tiny, tmp_path, monkeypatch):
    torch = _torch()
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "argv", ["prog", "--epochs=1", "--hidden_size=8"])  # must be ignored
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    before = {
        "py": random.getstate(), "np": np.random.get_state()[1].copy(), "torch": torch.get_rng_state(),
        "threads": torch.get_num_threads(), "anomaly": torch.is_anomaly_enabled(),
        "np_float": "float" in np.__dict__, "handlers": list(logging.getLogger().handlers),
        "level": logging.getLogger().level, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }

    rec = _build(tiny, "SASRec", config=TINY_CONFIG, threads=1, progress=False)
    assert not rec.loaded_from_cache

    # RecBole's global side effects are undone; nothing is written in the working directory.
    assert list(workdir.iterdir()) == []
    assert sys.argv == ["prog", "--epochs=1", "--hidden_size=8"]
    assert rec.meta["epochs_run"] == 2 and rec.meta["model_config"]["hidden_size"] == 16
    assert random.getstate() == before["py"]
    assert (np.random.get_state()[1] == before["np"]).all()
    assert torch.equal(torch.get_rng_state(), before["torch"])
    assert torch.get_num_threads() == before["threads"]
    assert torch.is_anomaly_enabled() is False
    assert ("float" in np.__dict__) == before["np_float"]
    assert logging.getLogger().handlers == before["handlers"] and logging.getLogger().level == before["level"]
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before["cuda"]

    # Odd ids map exactly; the unrated item scores -inf and never appears.
    tokens, internal = rec.item_tokens, rec.internal_ids
    for i, item_id in enumerate(tiny.item_ids):
        if item_id == "never-rated":
            assert internal[i] == 0
        else:
            assert tokens[internal[i]] == item_id
    states = [UserState(history=("NA", "[PAD]", "a b")), UserState(history=tuple(ODD_IDS)),
              UserState(history=("never-rated", "007"))]
    scores = rec.score_all(states)
    assert np.isneginf(scores[:, tiny.item_index["never-rated"]]).all()
    assert np.isfinite(np.delete(scores, tiny.item_index["never-rated"], axis=1)).all()
    # The unrated history item is skipped: same scores as without it.
    without = rec.score_all([UserState(history=("007",))])[0]
    np.testing.assert_array_equal(rec.score_all(states[2:])[0], without)
    for slate in rec.recommend(states, len(tiny.items) - 1):
        assert "never-rated" not in slate.item_ids
    with pytest.raises(EmptyHistoryError, match="none of its history items"):
        rec.score_all([UserState(history=("never-rated",), user_id="x")])

    # In-memory and cached models score identically.
    again = SequentialRecommender(tiny, "SASRec", config=TINY_CONFIG, progress=False)
    assert again.loaded_from_cache
    np.testing.assert_array_equal(again.score_all(states), scores)

    # Damaged weights are a ModelError naming the folder, raised when the weights load (first scores).
    (rec.cache_path / "model.pt").write_bytes(b"not a checkpoint")
    broken = SequentialRecommender(tiny, "SASRec", config=TINY_CONFIG, progress=False)
    folder = re.escape(str(rec.cache_path))
    with pytest.raises(ModelError, match=f"cannot load the cached SASRec from {folder}"):
        broken.score_all(states)


def test_tiny_other_model_key_and_progress(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    cfg = SequentialConfig(epochs=1, train_batch_size=128, max_seq_length=5)
    # A user's console log handler: during training its lines go through tqdm (above the bar).
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        try:  # through the registry, as envs and runners build it
            rec = make_recommender("recbole:gru4rec", tiny, config=cfg, progress=True)
        except MissingDependencyError as exc:
            pytest.skip(str(exc))
        assert handler in root.handlers  # the redirect put the user's handler back
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "GRU4Rec epoch 1: train loss" in err and "training GRU4Rec on tiny odd/ids" in err
    assert "GRU4Rec on tiny odd/ids: 100%" in err and "1/1 [" in err  # the per-epoch bar finished
    assert rec.name == "gru4rec" and rec.model_name == "GRU4Rec"
    assert (tmp_path / "cache" / "recbole" / rec.cache_key / "meta.json").is_file()
    assert rec.recommend([UserState(history=("NA", "m3"))], 5)[0].item_ids
    other = SequentialConfig(epochs=1, train_batch_size=128, max_seq_length=5, seed=7)
    from ctrlsim.recommenders.recbole import cache_key

    assert cache_key(tiny, "GRU4Rec", other) != rec.cache_key


# ------------------------------------------------------------------ slow: the full default config
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_default_config_reaches_reported_quality(ml100k, horror_history, model):
    """Full default training (about 3.5 min for NARM, 7 min for SASRec on one idle core), or its cache."""
    rec = _build(ml100k, model, threads=THREADS)
    assert rec.test_metrics["ndcg@10"] > 0.05 and rec.test_metrics["hit@10"] > 0.1
    horror = set(ml100k.items_with_tag("Horror"))
    slate = rec.recommend([UserState(history=horror_history)], 20)[0]
    assert np.mean([i in horror for i in slate.item_ids]) > 2 * len(horror) / len(ml100k.items)
