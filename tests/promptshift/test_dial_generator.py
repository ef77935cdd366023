"""The dial list generator: PromptShift lists whose dependence on the identity cue is known.

Expected lists are recomputed here with numpy / pandas from the dataset and the slice table
(not by calling the generator again); metric values are checked against their definitions.
"""
import numpy as np
import pandas as pd
import pytest

from ctrlsim.data import load_dataset
from ctrlsim.data.matching import TitleMatcher
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.promptshift.data import PromptShiftData, prompt_titles, sample_users
from ctrlsim.recommenders.promptshift.dial import (
    DialListGenerator,
    make_list_generator,
    substituted_positions,
)
from ctrlsim.recommenders.promptshift.engine import PromptShiftEngine
from ctrlsim.recommenders.promptshift.generation import (
    HISTORY_ONLY,
    PARAPHRASE_CONDITIONS,
    PromptCondition,
)

LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)


@pytest.fixture(scope="module")
def data():
    # As ctrlsim.experiments.promptshift.units.build_data does with the paper's defaults.
    return PromptShiftData.build(load_dataset("ml-100k"))


@pytest.fixture(scope="module")
def users(data):
    return sample_users(data, 6, seed=0)


@pytest.fixture(scope="module")
def engines(data, users):
    """One engine per lambda over the sampled users (N = 30, K = 20), lists generated on demand."""
    return {lam: PromptShiftEngine(data, None, users=users, generator=DialListGenerator(data, lam))
            for lam in LAMBDAS}


@pytest.fixture(scope="module")
def expected(data):
    """What the rule implies, computed independently: tag cosines, popularity, listable items."""
    ds = data.dataset
    ids = [str(i) for i in ds.item_ids]
    tags = ds.item_tags.assign(item_id=ds.item_tags["item_id"].astype(str))
    onehot = pd.crosstab(tags["item_id"], tags["tag"]).clip(upper=1).reindex(ids, fill_value=0)
    vectors = onehot.to_numpy(dtype=float)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = np.where(norms > 0, vectors / np.where(norms > 0, norms, 1.0), 0.0)
    star = data.table.slice_ids.index("*")
    popularity = data.table.counts[:, star]
    titles = prompt_titles(ds, ids)
    matcher = TitleMatcher(ds.items)
    listable = np.array([matcher.match(t).item_id == i and matcher.match(t).kind == "exact"
                         for i, t in zip(ids, titles)])
    return {"ids": ids, "vectors": vectors, "popularity": popularity, "listable": listable, "star": star}


def _ranked(score, popularity):
    return np.lexsort((np.arange(len(score)), -popularity, -score))


def _top(order, banned_ids, expected, n):
    ids, listable = expected["ids"], expected["listable"]
    return [ids[r] for r in order if listable[r] and ids[r] not in banned_ids][:n]


def _delta_order(data, expected, slice_id):
    table = data.table
    delta = table.phi[:, table.slice_ids.index(slice_id)] - table.phi[:, expected["star"]]
    return _ranked(delta, expected["popularity"])


# ----------------------------------------------------------------------------- the rule
def test_substituted_positions_by_hand():
    # floor((i+1) lambda) > floor(i lambda): 0.5 -> every second position, 0.25 -> every fourth.
    assert substituted_positions(8, 0.5) == [1, 3, 5, 7]
    assert substituted_positions(8, 0.25) == [3, 7]
    assert substituted_positions(8, 0.0) == []
    assert substituted_positions(8, 1.0) == list(range(8))
    assert substituted_positions(8, 0.75) == [1, 2, 3, 5, 6, 7]
    # 0.57 * 100 is 56.99999999999999 in floating point; the rule reads 0.57 as 57/100.
    assert len(substituted_positions(100, 0.57)) == 57


def test_reference_list_is_top_n_by_tag_affinity(data, users, engines, expected):
    n = 30
    for user in users[:2]:
        profile = engines[0.0].profile(user)
        # Every history title names one catalogue item here, so the query is the plain sum.
        assert all(prompt_titles(data.dataset, expected["ids"]).count(t) == 1 for t in profile.history_titles)
        rows = data.dataset.indices(profile.history)
        query = expected["vectors"][rows].sum(axis=0)
        affinity = np.round(expected["vectors"] @ (query / np.linalg.norm(query)), 12)
        want = _top(_ranked(affinity, expected["popularity"]), set(profile.history), expected, n)
        for lam in (0.0, 1.0):
            episode = engines[lam].episode(user, "gender")
            assert episode.reference.item_ids == want
            assert not set(episode.reference.item_ids) & set(profile.history)
            assert all(p.item_ids == want for p in episode.paraphrases)  # wording-blind
            assert episode.reference.kinds == ["exact"] * n


def test_lambda_zero_cue_changes_nothing(users, engines, data):
    engine = engines[0.0]
    for user in users:
        for scenario in data.scenarios:
            episode = engine.episode(user, scenario)
            assert episode.cue.item_ids == episode.reference.item_ids
            effect = engine.prompt_effect(episode)
            assert effect["cue_slice_shift"] == 0.0
            assert effect["delta_d"] == 0.0
            assert effect["paraphrase_drifts"] == [effect["cue_drift"]] * 3
            # Identical lists; ctrlsim.metrics.ranking.rbo sums p^d in floating point, so 1 - RBO of
            # a list against itself is 0 only up to rounding (2.2e-16 at K = 20).
            assert 0.0 <= effect["cue_drift"] < 1e-15


@pytest.mark.parametrize("lam, positions", [(0.5, {1, 3, 5, 7}), (0.25, {3, 7})])
def test_substitution_keeps_the_other_positions(data, users, expected, lam, positions):
    gen = DialListGenerator(data, lam, n=8)
    engine = PromptShiftEngine(data, None, users=users, n_candidates=8, k=8, generator=gen)
    user, scenario = users[0], "gender_age"
    episode = engine.episode(user, scenario)
    ref, cue = episode.reference.item_ids, episode.cue.item_ids
    assert len(ref) == len(cue) == 8
    kept = [i for i in range(8) if i not in positions]
    assert [cue[i] for i in kept] == [ref[i] for i in kept]
    history = set(episode.profile.history)
    fill = _top(_delta_order(data, expected, episode.slice_id), history | {ref[i] for i in kept},
                expected, len(positions))
    assert [cue[i] for i in sorted(positions)] == fill
    assert {i for i in range(8) if cue[i] != ref[i]} == positions


def test_lambda_one_is_the_slice_top_by_delta_phi(data, users, engines, expected):
    engine = engines[1.0]
    for scenario in data.scenarios:
        shifts = []
        for user in users:
            episode = engine.episode(user, scenario)
            want = _top(_delta_order(data, expected, episode.slice_id), set(episode.profile.history),
                        expected, 30)
            assert episode.cue.item_ids == want
            effect = engine.prompt_effect(episode)
            # SliceShift by its definition over the top K = 20.
            table, g = data.table, episode.slice_id
            delta = table.phi[:, table.slice_ids.index(g)] - table.phi[:, expected["star"]]
            rows = data.dataset.indices
            by_hand = delta[rows(want[:20])].mean() - delta[rows(episode.reference.item_ids[:20])].mean()
            assert effect["cue_slice_shift"] == pytest.approx(by_hand, abs=1e-12)
            shifts.append(effect["cue_slice_shift"])
        assert np.mean(shifts) > 0


def test_drift_grows_with_lambda(users, engines):
    for user, scenario in ((users[0], "gender"), (users[1], "age")):
        effects = [engines[lam].prompt_effect(engines[lam].episode(user, scenario)) for lam in LAMBDAS]
        drifts = [e["cue_drift"] for e in effects]
        assert all(a <= b for a, b in zip(drifts, drifts[1:])), drifts
        assert drifts[-1] > drifts[0]
        assert effects[-1]["cue_slice_shift"] > effects[0]["cue_slice_shift"]
        # The paraphrases never move, so Delta d is the cue drift less L^0's self-drift.
        assert all(e["paraphrase_drift"] < 1e-15 for e in effects)


# ------------------------------------------------------------------- interface, injection
def test_generated_lists_and_engine_injection(data, users, engines):
    gen = DialListGenerator(data, 0.5, n=5)
    profile = engines[0.0].profile(users[0])
    requests = [(list(profile.history_titles), c)
                for c in (HISTORY_ONLY, *PARAPHRASE_CONDITIONS, PromptCondition("history", "gender_F"))]
    lists = gen.generate(requests)
    assert [g.condition for g in lists] == ["history", "p1", "p2", "p3", "cue:gender_F"]
    for g in lists:
        assert len(g.titles) == g.raw_count == 5
        assert g.text == "\n".join(f"{k}. {t}" for k, t in enumerate(g.titles, 1))
        assert (g.prompt_tokens, g.completion_tokens, g.error, g.cached) == (0, 0, None, False)
    assert gen.config == {"generator": "dial", "lambda": 0.5, "n": 5, "rule": gen.config["rule"]}

    engine = engines[0.5]
    engine.episode(users[0], "gender")
    assert not engine.llm_loaded and engine.token_meter is None
    assert "llm" not in engine.config and engine.config["generator"]["lambda"] == 0.5
    with pytest.raises(ConfigError):
        engine.llm  # noqa: B018 - the property raises


def test_make_list_generator(data):
    gen = make_list_generator("dial:0.25", data, n=8)
    assert isinstance(gen, DialListGenerator) and (gen.lam, gen.n, gen.domain) == (0.25, 8, "movies")


@pytest.mark.parametrize("spec", ["dial:x", "dial:2", "dial:0.5:base=random", "dial-profile:0.5", "pop"])
def test_bad_specs(data, spec):
    with pytest.raises(ConfigError):
        make_list_generator(spec, data)


def test_bad_arguments(data):
    with pytest.raises(ConfigError):
        DialListGenerator(data, 2)
    with pytest.raises(ConfigError):
        DialListGenerator(data, 0.5, n=0)
    with pytest.raises(ConfigError, match="Not A Film"):
        DialListGenerator(data, 0.5).generate([(["Not A Film (1999)"], HISTORY_ONLY)])
    with pytest.raises(ConfigError):
        PromptShiftEngine(data, None)  # no LLM and no generator
    with pytest.raises(ConfigError):
        PromptShiftEngine(data, None, generator=object())
