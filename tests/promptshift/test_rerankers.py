"""B0-B3 rerankers: identity, protected prefix, slice-popularity push-down, unmatched positions."""
import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.metrics.promptshift import SliceTable
from ctrlsim.recommenders.promptshift.rerankers import (
    PAPER_PARAMS,
    FixedWeightReranker,
    OriginalOrder,
    PromptShiftReranker,
    RerankParams,
    arrange,
    make_reranker,
    order_to_action,
    param_grid,
    select_params,
)


@pytest.fixture(scope="module")
def table():
    """10 items (rows 0-9). In slice "g" (10 users): items 0-5 liked by all, 6-7 by one, 8-9 by none,
    so phi(i, g) = 1, 1, 1, 1, 1, 1, 0.1, 0.1, 0, 0. Outside g, 10 users like items 8 and 9 only."""
    g_users = [f"g{k}" for k in range(10)]
    h_users = [f"h{k}" for k in range(10)]
    users, items = [], []
    for i in range(6):
        users += g_users
        items += [str(i)] * 10
    users += ["g0", "g1"]
    items += ["6", "7"]
    for i in (8, 9):
        users += h_users
        items += [str(i)] * 10
    return SliceTable.build(users, items, {"g": g_users, "h": h_users}, [str(i) for i in range(10)],
                            shrinkage_users=1)


def rerankers(table, **kw):
    means = {"g": 0.5, "h": 0.5}
    return {v: make_reranker(v, table, slice_means=means, **kw) for v in ("B0", "B1", "B2", "B3")}


CANDS = np.arange(10)
MAINSTREAM = np.array([0, 1])       # phi_bar_u = 1   -> alpha_u = clip(0.7 + 0.2 * 1) = 0.9
NICHE = np.array([8, 9])            # phi_bar_u = 0   -> alpha_u = 0.7 - 0.2 = 0.5


def test_table_is_what_the_tests_assume(table):
    np.testing.assert_allclose(table.phi_rows(CANDS, "g"), [1, 1, 1, 1, 1, 1, 0.1, 0.1, 0, 0])


def test_b0_is_the_identity(table):
    b0 = rerankers(table)["B0"]
    cands = np.array([5, -1, 3, 7, -2, -2])
    np.testing.assert_array_equal(b0.order(cands, "g"), [0, 1, 2, 3])
    obs = {"candidates": cands, "slice": 0, "history": MAINSTREAM}
    action = b0(obs)
    assert action.shape == (6,) and action.dtype == np.float32 and np.all(np.abs(action) <= 1)
    assert sorted(range(4), key=lambda s: (-action[s], s)) == [0, 1, 2, 3]


def test_alpha_u_follows_mainstreamness(table):
    b3 = rerankers(table)["B3"]
    assert b3.alpha_u("g", MAINSTREAM) == pytest.approx(0.9)
    assert b3.alpha_u("g", NICHE) == pytest.approx(0.5)


def test_b3_keeps_prefix_and_pushes_slice_popular_items_down_for_niche_users(table):
    b3 = rerankers(table)["B3"]
    niche = b3.order(CANDS, "g", NICHE).tolist()
    mainstream = b3.order(CANDS, "g", MAINSTREAM).tolist()
    assert niche[:5] == mainstream[:5] == [0, 1, 2, 3, 4]          # protected prefix K' = 5
    # Item 5 (phi = 1, LLM rank 6): alpha_u = 0.5 sends it to the bottom, 0.9 keeps it near its rank.
    # Hand-computed scores: niche 6: .628, 8: .622, 7: .600, 9: .600, 5: .212; mainstream 6: .411, 5: .382 ...
    assert niche == [0, 1, 2, 3, 4, 6, 8, 7, 9, 5]
    assert mainstream == [0, 1, 2, 3, 4, 6, 5, 7, 8, 9]
    # Without a prefix the popular head moves too.
    no_prefix = PromptShiftReranker(table, params=RerankParams(protected_prefix=0), slice_means={"g": 0.5})
    assert no_prefix.order(CANDS, "g", NICHE).tolist()[:5] != [0, 1, 2, 3, 4]


def test_fixed_weight_variants_use_their_popularity(table):
    rr = rerankers(table)
    # B2 (slice g) demotes the g-popular items 0-5; B1 (all users) demotes 8 and 9, popular overall.
    b2 = rr["B2"].order(CANDS, "g").tolist()
    b1 = rr["B1"].order(CANDS, "g").tolist()
    assert b2.index(8) < b2.index(5) and b2.index(6) < b2.index(2)
    assert b1.index(9) == 9 and b1[0] == 0
    assert rr["B2"].alpha == PAPER_PARAMS.alpha0 and rr["B2"].protected() == 0


def test_unmatched_keep_their_positions(table):
    cands = np.array([0, 1, 2, 3, 4, 5, -1, 6, -1, 8, -2])
    for name, r in rerankers(table).items():
        order = r.order(cands, "g", NICHE).tolist()
        assert len(order) == 10 and sorted(order) == list(range(10))
        assert order[6] == 6 and order[8] == 8, name                  # unmatched slots stay put
        unmatched = [s for s in order if cands[s] == -1]
        assert unmatched == [6, 8]                                     # and keep their relative order
    # the matched movable slots 5, 7, 9 (phi 1, 0.1, 0) refill positions 5, 7, 9 by score
    assert rerankers(table)["B3"].order(cands, "g", NICHE).tolist() == [0, 1, 2, 3, 4, 9, 6, 7, 8, 5]


def test_arrange_and_action_round_trip():
    cands = np.array([3, -1, 4, 5, -2])
    order = arrange(cands, np.array([0.1, 0.0, 0.9, 0.5, 0.0]))
    assert order.tolist() == [2, 1, 3, 0]
    action = order_to_action(order, 5)
    assert sorted(range(4), key=lambda s: (-action[s], s)) == order.tolist()
    assert arrange(cands, None).tolist() == [0, 1, 2, 3]


def test_policy_reads_the_observation(table):
    b3 = make_reranker("B3", table, slice_names=("g", "h"), slice_means={"g": 0.5, "h": 0.5})
    obs = {"candidates": CANDS, "ranks": np.arange(1, 11), "slice": 0, "history": np.append(NICHE, -1)}
    action = b3(obs)
    assert sorted(range(10), key=lambda s: (-action[s], s)) == [0, 1, 2, 3, 4, 6, 8, 7, 9, 5]


def test_parameter_validation_and_grid(table):
    with pytest.raises(ConfigError):
        RerankParams(q=1.0)
    with pytest.raises(ConfigError):
        make_reranker("B7", table)
    with pytest.raises(ConfigError):
        FixedWeightReranker(table, popularity="global")
    with pytest.raises(ConfigError):
        PromptShiftReranker(table).order(CANDS, "g", NICHE)  # no phi_bar_s for "g"
    assert len(param_grid()) == 27 and PAPER_PARAMS in param_grid()


def test_select_params_maximises_validation_difficulty_without_hit_loss():
    # Difficulty grows with the prefix and falls with gamma; alpha0 = 0.6 loses hits against B0.
    def evaluate(p):
        return {"hit_rate@20": 0.5 if p.alpha0 > 0.6 else 0.4,
                "difficulty@20": p.protected_prefix - p.gamma, "slice_shift": 9.0}
    chosen, rows = select_params(evaluate, {"hit_rate@20": 0.5})
    assert len(rows) == 27
    # Best admissible: prefix 8, gamma 0.1; alpha0 0.7 and 0.8 tie, the paper's 0.7 comes first.
    assert (chosen.alpha0, chosen.gamma, chosen.protected_prefix) == (0.7, 0.1, 8)
    fallback, _ = select_params(evaluate, {"hit_rate@20": 0.9})
    assert fallback == PAPER_PARAMS
    # A tie with the paper's values keeps them.
    flat, _ = select_params(lambda p: {"hit_rate@20": 1.0, "difficulty@20": 3.0}, {"hit_rate@20": 0.0})
    assert flat == PAPER_PARAMS
    assert isinstance(OriginalOrder(SliceTable.build(["u"], ["i"], {"g": ["u"]})).config, dict)
