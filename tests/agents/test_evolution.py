"""The evolution loop's phases without an LLM: embedding mix, clustering rules, merge parsing,
best member, alignment, Task 2 level presets, artefact ledger."""

import math

import numpy as np
import pytest
from ctrlsim.agents.evolution import EvolutionSettings, cluster_population, probe_vectors
from ctrlsim.agents.evolution.alignment import FLAG_SEARCH_FILLED, align_roster
from ctrlsim.agents.evolution.artefacts import ArtefactFolder
from ctrlsim.agents.evolution.clustering import Clustering, silhouette_range
from ctrlsim.agents.evolution.levels import LEVELS, level_history
from ctrlsim.agents.evolution.merge import best_member, distil_behaviour, parse_merge_reply, select_best
from ctrlsim.agents.persona import Persona

import ctrlsim
from ctrlsim.errors import ConfigError, LLMOutputError


def persona(pid, behaviour=(), bio="A quiet viewer who likes old films.", interests=()):
    return Persona(probe_id=pid, name=pid, bio=bio, interests=interests, behaviour=behaviour)


# ----------------------------------------------------------------------------- embedding


def test_liked_items_move_the_vector_by_the_alpha_mix(ml100k, minilm):
    bio = "She loves dark crime stories and detectives."
    noir = [ml100k.items_with_tag("Film-Noir")[i] for i in range(3)]
    kids = [ml100k.items_with_tag("Children's")[i] for i in range(3)]
    a, b, bare = (persona("a", noir, bio), persona("b", kids, bio), persona("c", (), bio))
    v = probe_vectors([a, b, bare], ml100k, minilm, alpha=0.2)
    assert not np.allclose(v[0], v[1])  # same bio, different likes -> different V
    # Independently: 0.2 * enc(bio) + 0.8 * mean(enc(item texts)).
    texts = ml100k.items.set_index("item_id").loc[noir, "text"].tolist()
    expected = 0.2 * minilm.encode([bio])[0] + 0.8 * minilm.encode(texts).mean(axis=0)
    assert np.allclose(v[0], expected, atol=1e-5)
    assert np.allclose(v[2], minilm.encode([bio])[0], atol=1e-6)  # no likes: the bio alone
    only_bio = probe_vectors([a, b], ml100k, minilm, alpha=1.0)
    assert np.allclose(only_bio[0], only_bio[1], atol=1e-6)  # alpha = 1 ignores likes


def test_embedding_rejects_unknown_items(ml100k, minilm):
    with pytest.raises(Exception, match="no-such-item"):
        probe_vectors([persona("a", ("no-such-item",))], ml100k, minilm)


# ----------------------------------------------------------------------------- clustering


def blobs(sizes, spread=0.01, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.eye(len(sizes)) * 10
    return np.vstack(
        [centres[c] + spread * rng.standard_normal((n, len(sizes))) for c, n in enumerate(sizes)]
    )


def test_halving_rule_takes_ceil_half_and_records_membership():
    vectors = blobs([2, 2, 2, 2, 1])  # 9 probes
    c = cluster_population(vectors, seed=3, k_rule="halve")
    assert c.k == math.ceil(9 / 2) == 5
    assert sorted(i for m in c.members for i in m) == list(range(9))
    assert c.labels[0] == 0 and all(c.labels[i] == lab for lab, m in enumerate(c.members) for i in m)
    assert c.members == ((0, 1), (2, 3), (4, 5), (6, 7), (8,))  # the blobs, in first-member order
    from sklearn.metrics import silhouette_score

    assert c.silhouette == pytest.approx(silhouette_score(vectors, list(c.labels)))
    assert Clustering.from_dict(c.to_dict()) == c


def test_silhouette_rule_searches_half_to_three_quarters():
    assert list(silhouette_range(100)) == list(range(50, 76))
    assert list(silhouette_range(8)) == [4, 5, 6]
    vectors = blobs([2, 2, 2, 1, 1])  # 8 probes in 5 groups: k = 5 is in [4, 6] and best
    c = cluster_population(vectors, seed=0, k_rule="silhouette")
    assert c.k == 5 and set(c.candidates) == {4, 5, 6}
    assert c.candidates[5] == max(v for v in c.candidates.values() if v is not None)
    assert sorted(map(len, c.members)) == [1, 1, 2, 2, 2]


def test_clustering_is_seeded_and_handles_tiny_populations():
    vectors = np.random.default_rng(1).standard_normal((10, 4))
    assert cluster_population(vectors, seed=7) == cluster_population(vectors, seed=7)
    one = cluster_population(vectors[:1], seed=0)
    assert one.k == 1 and one.members == ((0,),) and one.silhouette is None
    with pytest.raises(ConfigError):
        cluster_population(vectors, seed=0, k_rule="elbow")


# ----------------------------------------------------------------------------- merge


def test_distil_keeps_known_ids_and_adds_back_target_items_only_when_forced():
    allowed = ["1", "2", "3", "4"]
    kept, added = distil_behaviour(["3", "99", "1"], allowed, target_items={"4", "7"})
    assert kept == ["1", "3"] and added == []  # 99 invented; the dropped target item 4 stays out
    kept, added = distil_behaviour(["3", "99", "1"], allowed, {"4", "7"}, force_target_items=True)
    assert kept == ["1", "3", "4"] and added == ["4"]  # forced: 4 is a target item, added back


def test_merge_reply_parsing():
    reply = (
        '```json\n{"name": "Noir Club", "bio": "Fans of shadowy crime films.", '
        '"interests": ["noir", "crime", "mystery", "drama", "thriller", "extra"], '
        '"behaviour": ["2: Some Title (1950), (Film-Noir)", 1, "77"]}\n```'
    )
    fields, added = parse_merge_reply(reply, ["1", "2", "3"], target_items={"3"})
    assert fields["behaviour"] == ["1", "2"] and added == []
    forced, added = parse_merge_reply(reply, ["1", "2", "3"], target_items={"3"}, force_target_items=True)
    assert forced["behaviour"] == ["1", "2", "3"] and added == ["3"]
    assert len(fields["interests"]) == 5 and fields["name"] == "Noir Club"
    for bad in (
        '{"bio": "1996, 1997, 1998, 2002", "interests": ["a"], "behaviour": ["1"]}',
        "no json here",
        '{"bio": "x", "interests": ["a"], "behaviour": ["1"]}',
        '{"bio": "a long enough bio", "interests": ["a"], "behaviour": ["99"]}',
    ):
        with pytest.raises(LLMOutputError):
            parse_merge_reply(bad, ["1", "2"], target_items=set())


def test_best_member_ranks_by_target_likes_then_behaviour():
    a = persona("a", ("1", "2"))
    b = persona("b", ("3", "9"))
    c = persona("c", ("9", "8"))
    recent = {"a": ["2"], "b": ["9"], "c": ["9", "8"]}
    assert best_member([a, b, c], {"9", "8"}, recent).probe_id == "c"  # 2 target likes
    assert best_member([a, b], {"9"}, recent).probe_id == "b"
    assert best_member([a, b], set(), {}).probe_id == "a"  # tie: earliest
    kept = select_best([[a, b], [c]], target_items={"9"}, recent_likes=recent)
    assert [o.persona.probe_id for o in kept] == ["b", "c"] and kept[0].members == ("a", "b")


# ----------------------------------------------------------------------------- alignment, levels, ledger


def test_alignment_fills_short_behaviour_by_search(ml100k):
    noir = ml100k.items_with_tag("Film-Noir")[0]
    short = persona("s", (noir, noir), interests=("Film-Noir", "crime"))
    full = persona("f", tuple(ml100k.item_ids[:5]))
    aligned, records = align_roster([short, full], ml100k, min_behaviour=4)
    assert len(aligned[0].behaviour) == 4 and aligned[0].behaviour[0] == noir
    assert FLAG_SEARCH_FILLED in aligned[0].flags and len(records[0].searched) == 3
    ml100k.check_items(aligned[0].behaviour)
    assert aligned[1].behaviour == full.behaviour and not records[1].searched


@pytest.mark.parametrize(
    "name,counts",
    [
        ("level-1", {"Romance": 2, "Thriller": 2}),
        ("level-2", {"Action": 11, "Adventure": 11}),
        ("level-3", {"Romance": 7, "Thriller": 4}),
    ],
)
def test_level_presets_match_table6(ml100k, name, counts):
    preset = LEVELS[name]
    history = level_history(ml100k, preset, np.random.default_rng(0))
    tags = [set(ml100k.item(i)["tags"]) for i in history]
    assert len(history) == len(set(history)) == preset.l_init
    assert {t: sum(t in x for x in tags) for t in counts} == counts  # round(share * L_init) per tag
    assert not any(x & preset.excluded_tags for x in tags)  # no target item in the seed
    assert level_history(ml100k, preset, np.random.default_rng(0)) == history


def test_ledger_and_artefacts_round_trip(tmp_path):
    folder = ArtefactFolder(tmp_path)
    folder.write_json("a.json", {"x": [1, 2]})
    folder.write_array("v.npy", np.arange(6.0).reshape(2, 3))
    folder.finish("embed_g0", {"seconds": 1.5})
    again = ArtefactFolder(tmp_path)
    assert again.done("embed_g0") and not again.done("cluster_g0")
    assert again.read_json("a.json") == {"x": [1, 2]}
    assert np.array_equal(again.read_array("v.npy"), np.arange(6.0).reshape(2, 3))
    with pytest.raises(Exception, match="missing"):
        again.read_json("clusters_g0.json")


def test_settings_validate():
    with pytest.raises(ConfigError, match="merges"):
        EvolutionSettings(merges=0)
    with pytest.raises(ConfigError, match="fusion"):
        EvolutionSettings(fusion="vote")
    with pytest.raises(ConfigError, match="alpha"):
        EvolutionSettings(alpha=1.5)


# ----------------------------------------------------------------------------- runner and registry


def test_evolve_flags_build_a_validated_config(tmp_path):
    from ctrlsim.experiments.commands import build_parser
    from ctrlsim.experiments.config import RunOptions, config_from_args
    from ctrlsim.experiments.evolve.config import EvolveConfig
    from ctrlsim.experiments.evolve.runner import RUNNER

    args = build_parser(RUNNER).parse_args(
        [
            "--agents",
            "8",
            "--merges",
            "2",
            "--rounds-per-merge",
            "1",
            "--target",
            "War,Film-Noir",
            "--k-rule",
            "silhouette",
            "--seed",
            "4",
        ]
    )
    config = config_from_args(EvolveConfig, args)
    assert (config.agents, config.merges, config.rounds_per_merge, config.k_rule) == (8, 2, 1, "silhouette")
    assert config.target == ("War", "Film-Noir") and config.schedule() == [8, 4, 2]
    assert EvolveConfig().schedule() == [100, 50, 25]  # the paper's 100 -> 50 -> 25
    with pytest.raises(ConfigError, match="k_rule"):
        EvolveConfig(k_rule="elbow")
    with pytest.raises(ConfigError, match="alpha"):
        EvolveConfig(alpha=-0.1)
    # A bad target fails before any model loads (no LLM is given or loaded here).
    with pytest.raises(ConfigError, match="NoSuchTag"):
        ctrlsim.run("evolve", config=EvolveConfig(target=("NoSuchTag",)),
                    options=RunOptions(out=str(tmp_path / "run")))


def test_the_evolution_methods_are_registered_for_ctrlbench():
    from ctrlsim.agents.evolution.methods import settings_from_options
    from ctrlsim.agents.methods import get_method, known_methods

    assert {"kmeans-fusion", "ctrlbench", "ctrlbench-logic"} <= set(known_methods())
    assert get_method("kmeans-fusion").label == "KMeans-Fusion"
    settings, encoder = settings_from_options(
        {"merges": 1, "encoder": "bge"}, fusion="select-best", alpha=0.0
    )
    assert (settings.merges, settings.fusion, settings.alpha, encoder) == (1, "select-best", 0.0, "bge")
    with pytest.raises(ConfigError, match="bogus"):
        settings_from_options({"bogus": 1})
