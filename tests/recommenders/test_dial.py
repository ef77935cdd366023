"""The interactive dial box `dial:<lambda>`: its known answers, checked against rankings computed here
with pandas/numpy (never by the box itself)."""
from __future__ import annotations

import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.recommenders import make_recommender
from ctrlsim.recommenders.base import UserState
from ctrlsim.recommenders.dial import DialRecommender, parse_dial_spec
from ctrlsim.recommenders.registry import check_recommender_name


def popularity_order(ds) -> list[str]:
    """Item ids by distinct users, most first; ties by catalogue order (computed with pandas)."""
    items = ds.items.reset_index(drop=True).assign(pos=lambda d: range(len(d)))
    return items.sort_values(["popularity", "pos"], ascending=[False, True])["item_id"].astype(str).tolist()


def tag_overlap(ds, followed) -> np.ndarray:
    """For each item, summed over its tags, how many followed items carry the tag."""
    tags = ds.item_tags
    carriers = tags[tags["item_id"].astype(str).isin(set(followed))]["tag"].value_counts()
    per_item = tags.assign(w=tags["tag"].map(carriers).fillna(0)).groupby("item_id")["w"].sum()
    return per_item.reindex(ds.items["item_id"]).fillna(0).to_numpy()


def test_lambda_zero_gives_every_history_the_same_slate(ml100k):
    noir = ml100k.items_with_tag("Film-Noir")[:4]
    comedy = ml100k.items_with_tag("Comedy")[-4:]
    box = make_recommender("dial:0", ml100k, mask_shown=True)
    a, b = box.recommend([UserState(history=tuple(noir), shown=tuple(noir)),
                          UserState(history=tuple(comedy), shown=tuple(comedy))], k=10)
    expected = [i for i in popularity_order(ml100k) if i not in set(noir) | set(comedy)][:10]
    assert a.item_ids == b.item_ids == expected


def test_lambda_one_ranks_film_noir_for_a_film_noir_history(ml100k):
    noir = set(ml100k.items_with_tag("Film-Noir"))
    noir_history = tuple(sorted(noir, key=int)[:3])
    comedy_history = tuple(i for i in ml100k.items_with_tag("Comedy") if i not in noir)[:3]
    for follow, shown in (("history", False), ("feedback", True)):
        box = make_recommender(f"dial:1:follow={follow}", ml100k)
        states = [UserState(history=h, shown=h if shown else ()) for h in (noir_history, comedy_history)]
        noir_slate, comedy_slate = box.recommend(states, k=10)
        rank_noir = [n for n, i in enumerate(noir_slate.item_ids) if i in noir]
        assert len(rank_noir) >= 5, follow  # the slate follows the Film-Noir likes
        assert sum(i in noir for i in comedy_slate.item_ids) == 0, follow
        # the top item is the one of highest tag overlap with the liked items (ties by popularity)
        overlap = tag_overlap(ml100k, noir_history)
        allowed = [i for i in popularity_order(ml100k) if i not in set(noir_history)]
        best = max(allowed, key=lambda i: (overlap[ml100k.item_index[i]], -allowed.index(i)))
        assert noir_slate.item_ids[0] == best


def test_feedback_dial_follows_only_what_it_showed(ml100k):
    noir = tuple(ml100k.items_with_tag("Film-Noir")[:3])
    box = make_recommender("dial:1", ml100k)  # follow=feedback by default
    start_only = box.recommend([UserState(history=noir)], k=5)[0]  # liked, but never shown by the box
    assert start_only.item_ids == [i for i in popularity_order(ml100k) if i not in noir][:5]


def test_positions_mix_draws_each_position_from_one_ranking(ml100k):
    """At lambda in (0, 1) every slate position holds the best unused item of the base ranking or of
    the affinity ranking, the affinity one at a rate near lambda."""
    lam, k = 0.3, 10
    box = make_recommender(f"dial:{lam}", ml100k)
    base = popularity_order(ml100k)
    rng = np.random.default_rng(5)
    from_affinity = decided = 0
    for _ in range(40):
        liked = tuple(str(i) for i in rng.choice(ml100k.item_ids, size=3, replace=False))
        overlap = tag_overlap(ml100k, liked)
        affinity = sorted(base, key=lambda i: -overlap[ml100k.item_index[i]])  # stable: ties by popularity
        slate = box.recommend([UserState(history=liked, shown=liked)], k=k)[0].item_ids
        used: set[str] = set(liked)
        for item in slate:
            next_base = next(i for i in base if i not in used)
            next_aff = next(i for i in affinity if i not in used)
            assert item in (next_base, next_aff)
            if next_base != next_aff:
                decided += 1
                from_affinity += item == next_aff
            used.add(item)
    share = from_affinity / decided
    assert abs(share - lam) < 3 * np.sqrt(lam * (1 - lam) / decided), (share, decided)


def test_score_mix_by_hand(ml100k):
    box = DialRecommender(ml100k, lam=0.25, mix="scores", follow="history")
    liked = ("302",)  # L.A. Confidential: Crime, Film-Noir, Mystery, Thriller
    scores = box.score_all([UserState(history=liked)])[0]
    n = len(ml100k.items)
    base = popularity_order(ml100k)
    overlap = tag_overlap(ml100k, liked)
    affinity = sorted(base, key=lambda i: -overlap[ml100k.item_index[i]])
    for item in ("50", "302", "1"):
        r_b = 1 - base.index(item) / (n - 1)
        r_a = 1 - affinity.index(item) / (n - 1)
        assert scores[ml100k.item_index[item]] == pytest.approx(0.75 * r_b + 0.25 * r_a, abs=1e-12)


def test_random_base_is_a_seeded_permutation(ml100k):
    from ctrlsim.seeding import derive_rng

    box = make_recommender("dial:0:base=random:seed=4", ml100k)
    perm = derive_rng(4, "dial-base").permutation(len(ml100k.items))
    assert box.recommend([UserState()], k=5)[0].item_ids == [str(ml100k.item_ids[i]) for i in perm[:5]]


@pytest.mark.parametrize("spec", ["dial:1.5", "dial:-0.1", "dial:x", "dial:nan", "dial:0.5:mix=bad",
                                  "dial:0.5:base", "dial:0.5:mix=scores:mix=positions", "dial:0.5:colour=red",
                                  "dial:0.5:mask_shown=maybe"])
def test_bad_dial_specs_are_config_errors(ml100k, spec):
    with pytest.raises(ConfigError):
        make_recommender(spec, ml100k)


def test_dial_specs_parse_and_register():
    spec = parse_dial_spec("dial:0.250:base=random")
    assert (spec.kind, spec.lam, dict(spec.options)) == ("dial", 0.25, {"base": "random"})
    assert spec.name == "dial:0.25:base=random"
    check_recommender_name("dial-profile:1")
    with pytest.raises(ConfigError, match="unknown recommender"):
        check_recommender_name("dials:0.5")
