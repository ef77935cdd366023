"""Candidate-list matching, the engine's list cache, `evaluate_ranking`'s restriction to T^C_u, by hand."""
import numpy as np
import pytest

from ctrlsim.data.matching import TitleMatcher
from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import EMPTY_SLOT, UNMATCHED_SLOT, SliceTable, evaluate_ranking
from ctrlsim.recommenders.promptshift.engine import CandidateList, PromptShiftEngine
from ctrlsim.recommenders.promptshift.generation import GeneratedList, PromptCondition


def test_candidate_list_matching_by_hand(hand_data):
    matcher = TitleMatcher(hand_data.dataset.items, threshold=90)
    gen = GeneratedList("history", ["Bravo (1991)", "the bravo", "Charlie (1992)", "Zulu Nights (1999)",
                                    "Delta", "Echo (1977)"], "", 0, 0)
    cand = CandidateList.from_generated(gen, matcher, history=["i3"])
    # "the bravo" is i2 again (dropped); Charlie is in the history (kept, counted); Zulu matches nothing;
    # "Delta" without a year is exact; "Echo (1977)" agrees on the title only.
    assert cand.item_ids == ["i2", "i3", None, "i4", "i5"]
    assert cand.kinds == ["exact", "exact", "none", "exact", "exact_title"]
    assert cand.keys == ["i2", "i3", "?zulu nights", "i4", "i5"]
    counts = cand.counts()
    assert [counts[c] for c in ("matched", "unmatched", "dropped_duplicates", "in_history")] == [4, 1, 1, 1]
    np.testing.assert_array_equal(cand.slots(hand_data.dataset.item_index, 7),
                                  [1, 2, UNMATCHED_SLOT, 3, 4, EMPTY_SLOT, EMPTY_SLOT])
    dropped = CandidateList.from_generated(gen, matcher, history=["i3"], exclude_history=True)
    assert dropped.item_ids == ["i2", None, "i4", "i5"] and dropped.in_history == 1


def test_engine_threshold_rematches_without_generating(hand_data):
    engine = PromptShiftEngine(hand_data, "never-loaded", match_threshold=100)
    engine.preload("u1", GeneratedList("history", ["Foxtrott (1995)"], "", 0, 0))
    assert engine.cached_list("u1", PromptCondition("history")).item_ids == [None]  # exact only
    engine.set_match_threshold(80)  # "foxtrott" vs "foxtrot": token_sort_ratio 93.3
    assert engine.cached_list("u1", PromptCondition("history")).item_ids == ["i6"]
    assert engine.cached_list("u1", PromptCondition("p1")) is None and not engine.llm_loaded


def test_engine_checks_its_settings(hand_data):
    with pytest.raises(ConfigError):
        PromptShiftEngine(hand_data, k=31)
    with pytest.raises(ConfigError):
        PromptShiftEngine(hand_data, domain="books")
    with pytest.raises(ConfigError):
        PromptShiftEngine(hand_data, unmatched="drop")


@pytest.fixture
def flat_table():
    """Three items, one slice "g" of 30 users who like item a only; everyone else likes b."""
    g = [f"g{n}" for n in range(30)]
    h = [f"h{n}" for n in range(30)]
    return SliceTable.build(g + h, ["a"] * 30 + ["b"] * 30, {"g": g, "h": h}, ["a", "b", "c"])


def test_evaluate_ranking_restricts_relevant_items_to_the_pool(flat_table):
    # phi(., g) = 1, 0, 0 and phi(., *) = 1, 1, 0; relevant = {c, z}; z was never generated.
    out = evaluate_ranking(flat_table, "g", ["b", "c"], ["a", "b"], {"c", "z"}, pool=["b", "c", "a"], k=2)
    # T^C = {c}: one hit at rank 2. NDCG's ideal uses |T^C| = 1, not |T| = 2.
    assert out["pool_positives"] == 1.0
    assert out["hit_rate@2"] == 1.0 and out["mrr@2"] == pytest.approx(0.5)
    assert out["ndcg@2"] == pytest.approx(1 / np.log2(3))
    # w_c = 10 (1 - phi(c, g)) (1 + 0.2 (2 - 2 + 1) / 2) = 11.
    assert out["difficulty@2"] == pytest.approx(11.0)
    # mean dphi(g): ranking (b: 0 - 1, c: 0 - 0) / 2 = -1/2; reference (a: 0, b: -1) / 2 = -1/2.
    assert out["slice_shift"] == pytest.approx(0.0)
    # RBO_{0.9}(a b, b c): X = 0, 1 -> 0.1/0.9 * (1/2 * 0.81) + 1/2 * 0.81 = 0.045 + 0.405 = 0.45.
    assert out["drift"] == pytest.approx(0.55)


def test_evaluate_ranking_without_pool_positives_scores_zero(flat_table):
    out = evaluate_ranking(flat_table, "g", ["a", None], ["a"], {"z"}, k=2)
    assert out["pool_positives"] == 0.0
    assert out["hit_rate@2"] == out["mrr@2"] == out["ndcg@2"] == out["difficulty@2"] == 0.0
    # The unmatched entry is a key of its own: a prefix of length 1 agrees with the reference fully.
    assert out["drift"] == pytest.approx(0.0)
    # Unmatched counts in |L| with 0: ranking (0 + 0) / 2, reference 0 -> 0.
    assert out["slice_shift"] == 0.0


def test_engine_asks_the_data_for_each_user_once(hand_data, u1_lists, monkeypatch):
    calls = []
    ask = type(hand_data).user
    monkeypatch.setattr(type(hand_data), "user", lambda self, u: calls.append(u) or ask(self, u))
    engine = PromptShiftEngine(hand_data, "never-loaded", n_candidates=4, k=3)
    assert calls == ["u1", "u2"]  # U's profiles, once, at construction (phi_bar_s needs them)
    for gen in u1_lists:
        engine.preload("u1", gen)
    ep = engine.episode("u1", "gender")
    engine.evaluate(ep, range(len(ep.cue.item_ids)), part="valid")
    engine.history_slots("u1")
    assert calls == ["u1", "u2"] and ep.profile is engine.profile("u1") and ep.user == "u1"
