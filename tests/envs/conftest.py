import pytest

from ctrlsim.recommenders import make_recommender


@pytest.fixture(scope="session")
def emb_rec(ml100k, minilm):
    return make_recommender("embedding", ml100k, encoder=minilm, mask_shown=True)


@pytest.fixture(scope="session")
def pop_rec(ml100k):
    return make_recommender("popularity", ml100k, mask_shown=True)
