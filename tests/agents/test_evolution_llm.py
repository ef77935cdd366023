"""An 8 -> 4 -> 2 evolution with SmolLM2-135M on the MiniLM embedding box (no LLM inside the box):
it completes, its artefacts load, the same seed gives the same rosters, and a run killed after
a phase (or in the middle of one) resumes to the same result without paying an LLM call twice.

Three runs of the whole loop on the smallest bundled model: slow on a 2-core machine.
"""

import json

import pytest
from ctrlsim.agents.evolution import roster_from_json
from ctrlsim.agents.evolution.clustering import Clustering

import ctrlsim
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.evolve.config import EvolveConfig

pytestmark = [pytest.mark.llm, pytest.mark.slow]

CONFIG = EvolveConfig(
    agents=8,
    merges=2,
    rounds_per_merge=1,
    eval_rounds=2,
    llm="smollm2-135m",
    recommender="embedding",
    target=("Film-Noir",),
    seed=3,
    debate_max_tokens=48,
    merge_max_tokens=200,
)


class CallLog:
    """The real LLM, with each `chat` call's batch size written down (to check batching)."""

    def __init__(self, llm):
        self.llm, self.batches = llm, []

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def chat(self, conversations, **kwargs):
        self.batches.append(len(conversations))
        return self.llm.chat(conversations, **kwargs)


def fresh_calls(llm) -> int:
    total = llm.meter.total
    return total.calls - total.cached_calls


def run(llm_or_skip, out, stop_after=None):
    llm = llm_or_skip("smollm2-135m", cache=out / "llm-cache.sqlite")
    result = ctrlsim.run("evolve", config=CONFIG, options=RunOptions(out=str(out)), show_progress=False,
                         llms={CONFIG.llm: llm}, resources={"stop_after": stop_after} if stop_after else None)
    return result, llm


@pytest.fixture(scope="module")
def straight(tmp_path_factory, llm_or_skip):
    out = tmp_path_factory.mktemp("straight")
    result, llm = run(llm_or_skip, out)
    return out, result, fresh_calls(llm)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, llm_or_skip):
    """The same config in another folder and cache, stopped after the first debate, then resumed."""
    out = tmp_path_factory.mktemp("interrupted")
    first, llm1 = run(llm_or_skip, out, stop_after="debate_g0")
    assert first.summary["stopped_after"] == "debate_g0" and not (out / "merge_g0.json").exists()
    llm2 = CallLog(llm_or_skip("smollm2-135m", cache=out / "llm-cache.sqlite"))
    result = ctrlsim.run("evolve", config=CONFIG, options=RunOptions(out=str(out)), show_progress=False,
                         llms={CONFIG.llm: llm2})
    return out, result, fresh_calls(llm1), fresh_calls(llm2.llm), llm2.batches


def test_the_run_completes_and_its_artefacts_load(straight):
    out, result, _ = straight
    assert [g["probes"] for g in result.summary["generations"]] == [8, 4]
    assert [len(roster_from_json(json.loads((out / f"roster_g{g}.json").read_text()))) for g in range(3)] == [
        8,
        4,
        2,
    ]
    clusters = Clustering.from_dict(json.loads((out / "clusters_g0.json").read_text()))
    assert clusters.k == 4 and sorted(i for m in clusters.members for i in m) == list(range(8))
    transcript = json.loads((out / "transcript_g0.json").read_text())["clusters"]
    for cluster, members in zip(transcript, clusters.members):
        speakers = [(t["round"], t["probe_id"]) for t in cluster["turns"]]
        expected = [(r, m) for r in (1, 2) for m in cluster["members"]] if len(members) >= 2 else []
        assert speakers == expected  # everyone speaks once in each of the two rounds
    merges = json.loads((out / "merge_g0.json").read_text())["outcomes"]
    for outcome in merges:  # a usable merge, or the best member, flagged
        assert (
            outcome["valid"]
            or "merge_fallback_best_member" in outcome["persona"]["flags"]
            or "filter_fallback_unchanged" in outcome["persona"]["flags"]
        )
    phases = json.loads((out / "phases.json").read_text())["phases"]
    assert list(phases)[0] == "profiles" and list(phases)[-1] == "align"
    assert all("seconds" in e and "tokens" in e for e in phases.values())
    assert phases["debate_g0"]["tokens"]["completion_tokens"] > 0
    assert (out / "tables.md").read_text().count("Generations") == 1
    assert (out / "figures" / "evaluation.png").stat().st_size > 0
    evaluation = result.summary["evaluation"]
    assert evaluation["rounds"] == 2 and len(evaluation["new_discoveries"]) == 2


def test_the_final_roster_loads_for_ctrlbench(straight, ml100k):
    from ctrlsim.experiments.ctrlbench.inputs import load_roster

    out, result, _ = straight
    personas = load_roster(out / "final_roster.json")
    assert [p.probe_id for p in personas] == [p.probe_id for p in result.summary["final"]]
    from ctrlsim.recommenders.search import CatalogueSearch

    search = CatalogueSearch(ml100k)
    for p in personas:
        ml100k.check_items(p.behaviour)
        assert p.bio
        if len(p.behaviour) < CONFIG.align_min_behaviour:
            # short only when the catalogue search for the probe's interests finds nothing more (a
            # merged persona whose interests name no film, genre or word of the catalogue)
            query = " ".join(p.interests) or p.bio
            more = search.search(query, CONFIG.align_min_behaviour, exclude=ml100k.indices(p.behaviour))
            assert len(more) == 0, (p.probe_id, query)


def test_same_seed_and_kill_resume_give_identical_rosters(straight, interrupted):
    out_a, result_a, calls_a = straight
    out_b, result_b, calls_b1, calls_b2, batches = interrupted
    for g in range(3):
        assert json.loads((out_a / f"roster_g{g}.json").read_text()) == json.loads(
            (out_b / f"roster_g{g}.json").read_text()
        )
    assert [p.to_dict() for p in result_a.summary["final"]] == \
        [p.to_dict() for p in result_b.summary["final"]]
    # No LLM call paid twice: the interrupted run's two sessions together made the straight run's calls.
    assert calls_b1 + calls_b2 == calls_a
    # The resumed session's first calls are merge_g0 (no profile, interaction or debate call again).
    assert batches and batches[0] <= 4


def test_a_phase_killed_midway_replays_from_the_cache(interrupted, llm_or_skip):
    out, result, *_ = interrupted
    ledger = json.loads((out / "phases.json").read_text())
    for phase in ("merge_g1", "align"):  # as if killed after merge_g1's calls, before its ledger entry
        ledger["phases"].pop(phase)
    (out / "phases.json").write_text(json.dumps(ledger))
    (out / "final_roster.json").unlink()
    again, llm = run(llm_or_skip, out)
    assert fresh_calls(llm) == 0 and llm.meter.total.cached_calls > 0
    assert [p.to_dict() for p in again.summary["final"]] == [p.to_dict() for p in result.summary["final"]]


def test_task2_levels_run_with_the_probes(llm_or_skip, tmp_path):
    """Table 2 / Figure 7 figures of a level run, checked against the seed histories by hand."""
    from dataclasses import replace

    import numpy as np
    from ctrlsim.agents import DecisionSettings, Persona
    from ctrlsim.agents.evolution.levels import LEVELS, level_persona

    from ctrlsim.data import load_dataset
    from ctrlsim.experiments.evolve.evaluation import evaluate_level
    from ctrlsim.recommenders import make_recommender
    from ctrlsim.seeding import derive_rng

    dataset = load_dataset("ml-100k")
    box = make_recommender("popularity", dataset, mask_shown=True)
    probes = [
        Persona(
            probe_id=f"p{i}",
            name=f"P{i}",
            bio="Enjoys romantic thrillers.",
            interests=("Romance", "Thriller"),
        )
        for i in range(2)
    ]
    config = replace(CONFIG, eval_rounds=3, levels=("level-3",))
    llm = llm_or_skip("smollm2-135m", cache=tmp_path / "cache.sqlite")
    record = evaluate_level(config, "level-3", probes, box, llm, DecisionSettings())
    assert len(record["accuracy"]) == len(record["old_interest"]) == 4  # t = 0 .. 3
    assert record["intervals"] == ["t0-t3"] and len(record["smoothness"]) == 1
    assert -1.0 <= record["smoothness"][0] <= 1.0
    # t = 0 is the seed history alone: recompute the target similarity from Table 6's seeds.
    rng = derive_rng(config.seed, "level", "level-3")
    seeds = [level_persona(p, dataset, LEVELS["level-3"], rng).behaviour for p in probes]
    # Appendix D.7 by hand with numpy: centre the item embeddings by their mean; a probe's vector is
    # the mean of its seed items' centred vectors; compare with the Action items' centroid.
    from ctrlsim.backends import load_encoder

    vectors = load_encoder(config.encoder).encode(dataset.items["text"].tolist()).astype(np.float64)
    centred = vectors - vectors.mean(axis=0)
    target = centred[dataset.indices(dataset.items_with_tag("Action"))].mean(axis=0)

    def cosine(a, b):
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    start = np.mean([cosine(centred[dataset.indices(s)].mean(axis=0), target) for s in seeds])
    assert record["accuracy"][0] == pytest.approx(start, abs=1e-6)
