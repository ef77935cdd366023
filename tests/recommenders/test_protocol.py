"""The batched recommender protocol, on the recommenders that need no trained model."""
import numpy as np
import pytest

from ctrlsim.errors import ConfigError, EmptyHistoryError, ModelNotFoundError, UnknownItemError
from ctrlsim.recommenders import UserState, make_recommender


@pytest.fixture(scope="module")
def emb(ml100k, minilm):
    return make_recommender("embedding", ml100k, encoder=minilm)


@pytest.fixture(scope="module")
def horror(ml100k):
    return ml100k.items_with_tag("Horror")


def share(ids, group):
    group = set(group)
    return np.mean([i in group for i in ids])


@pytest.mark.parametrize("name", ["embedding", "twhin-bert", "bge"])
def test_embedding_recommenders_follow_a_horror_history(ml100k, minilm, horror, name):
    rec = make_recommender(name, ml100k, encoder=minilm)
    state = UserState(history=tuple(horror[:10]))
    slate = rec.recommend([state], 20)[0]
    base_rate = len(horror) / len(ml100k.items)
    assert share(slate.item_ids, horror) > 2 * base_rate
    assert not set(slate.item_ids) & set(state.history)
    assert rec.identity["encoder"]["encoder"] == "minilm"  # the encoder that actually ran is recorded
    assert list(slate.scores) == sorted(slate.scores, reverse=True)


def test_named_embedding_boxes_default_to_their_papers_encoders(ml100k):
    # TwHIN-BERT and BGE are not available offline: a clear error that names the offline default.
    for name in ("twhin-bert", "bge"):
        with pytest.raises(ModelNotFoundError, match="minilm"):
            make_recommender(name, ml100k)


def test_query_mixes_profile_and_history(emb, ml100k, horror):
    h = UserState(history=tuple(horror[:5]))
    p = UserState(profile="romantic comedies set in Paris")
    both = UserState(history=tuple(horror[:5]), profile="romantic comedies set in Paris")
    qh, qp, qb = emb.query_vectors([h, p, both])
    mix = 0.2 * emb.encoder.encode([p.profile], kind="query")[0] + 0.8 * emb.item_vectors[
        ml100k.indices(horror[:5])].mean(0)
    assert np.allclose(qb, mix / np.linalg.norm(mix), atol=1e-5)
    assert qh @ qb > qp @ qb  # history weighs 0.8
    with pytest.raises(EmptyHistoryError):
        emb.recommend([UserState()], 5)


def test_batch_equals_one_by_one(emb, ml100k, horror):
    westerns = tuple(ml100k.items_with_tag("Western")[:4])
    states = [UserState(history=tuple(horror[:3])), UserState(history=westerns),
              UserState(profile="children's animation")]
    batch = emb.recommend(states, 15)
    for state, slate in zip(states, batch):
        single = emb.recommend([state], 15)[0]
        assert single.item_ids == slate.item_ids
        assert np.allclose(single.scores, slate.scores)


def test_exclusions_history_and_shown(ml100k, minilm, horror):
    rec = make_recommender("embedding", ml100k, encoder=minilm, mask_shown=True)
    first = rec.recommend([UserState(history=tuple(horror[:5]))], 10)[0]
    state = UserState(history=tuple(horror[:5]), shown=tuple(first.item_ids))
    second = rec.recommend([state], 10)[0]
    assert not set(second.item_ids) & (set(first.item_ids) | set(horror[:5]))
    keep = make_recommender("embedding", ml100k, encoder=minilm, exclude_history=False)
    assert set(horror[:5]) & set(keep.recommend([UserState(history=tuple(horror[:5]))], 10)[0].item_ids)


def test_candidate_pools_shared_and_per_state(emb, ml100k, horror):
    pool = horror[:10] + ml100k.items_with_tag("Romance")[:10]
    state = UserState(history=tuple(horror[10:15]))
    slate = emb.recommend([state], 5, candidates=pool)[0]
    assert set(slate.item_ids) <= set(pool)
    per_state = emb.recommend([state, state], 3, candidates=[pool[:4], pool[10:14]])
    assert set(per_state[0].item_ids) <= set(pool[:4]) and set(per_state[1].item_ids) <= set(pool[10:14])
    small = emb.recommend([UserState(history=tuple(pool[:2]))], 5, candidates=pool[:4])[0]
    assert len(small) == 2  # fewer than k left after excluding the history: a shorter slate


def test_bad_input(emb, ml100k):
    good = UserState(history=("1",))
    with pytest.raises(UnknownItemError, match="no-such-item"):
        emb.recommend([UserState(history=("no-such-item",))], 5)
    with pytest.raises(UnknownItemError):
        emb.recommend([good], 5, candidates=["1", "nope"])
    with pytest.raises(ConfigError, match="larger than the catalogue"):
        emb.recommend([good], len(ml100k.items) + 1)
    with pytest.raises(ConfigError, match="positive"):
        emb.recommend([good], 0)
    with pytest.raises(ConfigError, match="empty"):
        emb.recommend([good], 5, candidates=[])
    with pytest.raises(ConfigError, match="batch"):
        emb.recommend(good, 5)
    with pytest.raises(ConfigError, match="pools"):
        emb.recommend([good], 5, candidates=[["1"], ["2"]])
    with pytest.raises(ConfigError, match="unknown recommender"):
        make_recommender("nonesuch", ml100k)


def test_popularity_baseline(ml100k):
    rec = make_recommender("popularity", ml100k)
    slate = rec.recommend([UserState(history=("50",))], 5)[0]
    top = ml100k.items.sort_values("popularity", ascending=False, kind="stable")["item_id"].tolist()
    assert slate.item_ids == [i for i in top if i != "50"][:5]
