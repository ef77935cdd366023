"""The dial box's memory, `dial:<lambda>:window=W`: it follows only the last W of its followed likes.

Expected slates are computed here with pandas (tag overlap, popularity order), never by the box.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.recommenders import make_recommender
from ctrlsim.recommenders.base import UserState
from ctrlsim.recommenders.registry import check_recommender_name
from ctrlsim.seeding import derive_rng

W, K = 4, 10


def popularity_order(ds) -> list[str]:
    """Item ids by distinct users, most first; ties by catalogue order."""
    items = ds.items.reset_index(drop=True).assign(pos=lambda d: range(len(d)))
    return items.sort_values(["popularity", "pos"], ascending=[False, True])["item_id"].astype(str).tolist()


def affinity_order(ds, followed) -> list[str]:
    """Item ids by tag overlap with `followed` (for each of an item's tags, how many followed items
    carry it, summed), highest first; ties keep the popularity order."""
    tags = ds.item_tags.assign(item_id=ds.item_tags["item_id"].astype(str))
    carriers = tags[tags["item_id"].isin(set(followed))]["tag"].value_counts()
    overlap = tags.assign(w=tags["tag"].map(carriers).fillna(0)).groupby("item_id")["w"].sum()
    return sorted(popularity_order(ds), key=lambda i: -overlap.get(i, 0.0))  # sorted is stable


def steer_then_release(ds) -> tuple[list[str], list[str]]:
    """12 Film-Noir likes (the steering), then W Western likes (the release); no item carries both."""
    noir, western = set(ds.items_with_tag("Film-Noir")), set(ds.items_with_tag("Western"))
    steer = [str(i) for i in ds.items_with_tag("Film-Noir") if i not in western][:12]
    release = [str(i) for i in ds.items_with_tag("Western") if i not in noir][:W]
    assert len(steer) == 12 and len(release) == W
    return steer, release


def top(box, state, k=K) -> list[str]:
    return box.recommend([state], k=k)[0].item_ids


@pytest.mark.parametrize("follow", ["feedback", "history"])
def test_after_w_release_likes_the_slate_is_the_release_likes_ranking(ml100k, follow):
    """The known answer: at lambda = 1, once the last W followed likes are all non-target items, the
    slate is the affinity ranking of those W items alone, whatever was liked before them."""
    steer, release = steer_then_release(ml100k)
    history = tuple(steer + release)
    state = UserState(history=history, shown=history)
    box = make_recommender(f"dial:1:follow={follow}:window={W}", ml100k)
    expected = [i for i in affinity_order(ml100k, release) if i not in set(history)][:K]
    assert top(box, state) == expected  # less the excluded items: the whole history

    # with nothing excluded, the same slate as a user who liked only the W release items
    keep_all = make_recommender(f"dial:1:follow={follow}:window={W}", ml100k, exclude_history=False)
    only_release = UserState(history=tuple(release), shown=tuple(release))
    assert top(keep_all, state) == top(keep_all, only_release) == affinity_order(ml100k, release)[:K]

    # without a window the steering likes are still followed, and the slate shows it
    unbounded = top(make_recommender(f"dial:1:follow={follow}", ml100k), state)
    assert unbounded == [i for i in affinity_order(ml100k, history) if i not in set(history)][:K]
    assert unbounded != expected


def test_a_feedback_window_counts_followed_likes_not_history_entries(ml100k):
    """With follow=feedback the window is the last W likes the box showed: a later like the box did
    not show takes no place in it."""
    steer, release = steer_then_release(ml100k)
    elsewhere = next(i for i in ml100k.items_with_tag("Comedy")
                     if str(i) not in set(steer) | set(release))
    history = tuple(steer + release[:2] + [str(elsewhere)] + release[2:])
    state = UserState(history=history, shown=tuple(steer + release))  # `elsewhere` was never shown
    box = make_recommender(f"dial:1:window={W}", ml100k)
    assert top(box, state) == [i for i in affinity_order(ml100k, release) if i not in set(history)][:K]


@pytest.mark.parametrize("spec", ["dial:1", "dial:0.5", "dial:0.3:mix=scores",
                                  "dial:0.7:follow=history:base=random:seed=2", "dial:0.6:mask_shown=true"])
def test_a_window_at_least_as_long_as_f_changes_nothing(ml100k, spec):
    rng = np.random.default_rng(3)
    states = [UserState()]
    for size in (1, 3, 6):
        liked = tuple(str(i) for i in rng.choice(ml100k.item_ids, size=size, replace=False))
        states.append(UserState(history=liked, shown=liked[:5] + ("50",)))
    plain = make_recommender(spec, ml100k)
    for window in (6, 50):
        windowed = make_recommender(f"{spec}:window={window}", ml100k)
        assert np.array_equal(windowed.score_all(states), plain.score_all(states))
        assert [s.item_ids for s in windowed.recommend(states, k=K)] == \
            [s.item_ids for s in plain.recommend(states, k=K)]


def positions_by_hand(ds, state, lam, affinity, k=K, seed=0) -> list[str]:
    """The positions mix as documented: draws seeded by (seed, the whole history, shown); each position
    takes the best unused item of the affinity ranking with probability lambda, else of the base."""
    rng = derive_rng(seed, "dial-positions", "|".join(state.history), "|".join(state.shown))
    base = [i for i in popularity_order(ds) if i not in set(state.history)]
    affinity = [i for i in affinity if i not in set(state.history)]
    follows = rng.random(len(base)) < lam
    out: list[str] = []
    for follow in follows[:k]:
        out.append(next(i for i in (affinity if follow else base) if i not in out))
    return out


def test_draws_stay_seeded_by_the_whole_state(ml100k):
    """Without a window the slate is today's rule; with one, only the affinity ranking changes (to the
    window's), and the draws keep their full-state seed."""
    steer, release = steer_then_release(ml100k)
    history = tuple(steer + release)
    state = UserState(history=history, shown=history)
    plain = top(make_recommender("dial:0.5", ml100k), state)
    assert plain == positions_by_hand(ml100k, state, 0.5, affinity_order(ml100k, history))
    windowed = top(make_recommender("dial:0.5", ml100k, window=W), state)
    assert windowed == positions_by_hand(ml100k, state, 0.5, affinity_order(ml100k, release))


def test_identity_has_the_window_only_when_set(ml100k):
    plain = make_recommender("dial:0.5", ml100k)
    assert plain.identity == {"recommender": "dial", "dataset": ml100k.name, "lambda": 0.5,
                              "base": "popularity", "affinity": "tags", "mix": "positions",
                              "follow": "feedback", "seed": 0}
    assert make_recommender("dial:0.5", ml100k, window=None).identity == plain.identity
    assert make_recommender("dial:0.5:window=4", ml100k).identity == {**plain.identity, "window": 4}
    assert make_recommender("dial:0.5", ml100k, window=4).identity == {**plain.identity, "window": 4}
    assert make_recommender("dial:0.5:window=4", ml100k, window=7).identity["window"] == 7  # keywords win


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "abc", "1e2"])
def test_bad_window_in_a_spec_is_a_config_error_before_anything_runs(ml100k, value):
    spec = f"dial:0.5:window={value}"
    message = re.escape(f"window={value!r}")
    with pytest.raises(ConfigError, match=message):
        check_recommender_name(spec)  # parsed, nothing built
    with pytest.raises(ConfigError, match=message):
        make_recommender(spec, ml100k)


@pytest.mark.parametrize("value", [0, -2, 2.5, "abc", True])
def test_bad_window_keyword_is_a_config_error(ml100k, value):
    with pytest.raises(ConfigError, match=re.escape(f"window={value!r}")):
        make_recommender("dial:0.5", ml100k, window=value)
