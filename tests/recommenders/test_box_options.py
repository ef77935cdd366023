"""A registered box with constructor options in its name (`NAME#key=value&...`): built as with
keyword options, recorded in its identity, and checked before anything is built."""
import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.recommenders import UserState, make_recommender
from ctrlsim.recommenders.registry import box_options, check_recommender_name


def test_named_options_build_the_same_box_as_keyword_options(ml100k):
    named = make_recommender("embedding#negative_weight=0.25&alpha=0.3", ml100k)
    keyword = make_recommender("embedding", ml100k, negative_weight=0.25, alpha=0.3)
    assert named.identity == keyword.identity and named.identity["negative_weight"] == 0.25
    state = [UserState(history=("1", "50"), disliked=("71",))]
    assert np.array_equal(named.score_all(state), keyword.score_all(state))
    assert box_options("bge#alpha=0.5") == ("bge", {"alpha": 0.5})  # options of the base class too
    assert make_recommender("embedding#alpha=0.3", ml100k, alpha=0.4).alpha == 0.4  # keywords win


@pytest.mark.parametrize("spec, message", [
    ("embedding#colour=red", "takes no option"),
    ("nothing#a=1", "unknown recommender 'nothing'"),
    ("embedding#encoder", "key=value pairs"),
    ("embedding#alpha=1&alpha=2", "given twice"),
])
def test_bad_named_options_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        check_recommender_name(spec)
