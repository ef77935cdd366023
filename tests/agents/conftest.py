import pytest

from ctrlsim.recommenders import make_recommender


@pytest.fixture(scope="session")
def pop_rec(ml100k):
    """The popularity black box: no model to load, so LLM-probe tests spend their time on the probes."""
    return make_recommender("popularity", ml100k, mask_shown=True)
