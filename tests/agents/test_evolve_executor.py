"""`ctrlsim evolve --executor ray`: each cluster's debate and merge is one unit on a local two-CPU
Ray cluster, and the run's artefacts are the local (batched) run's, byte for byte.

Two small evolutions with SmolLM2-135M on the MiniLM embedding box (no LLM inside the box).
"""

import json

import pytest

import ctrlsim
from ctrlsim.errors import MissingDependencyError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.evolve.config import EvolveConfig

pytestmark = [pytest.mark.llm, pytest.mark.slow]


CONFIG = EvolveConfig(
    agents=5,  # k = 3 clusters: at least one debates, and with 5 probes one may be a single (filter)
    merges=1,
    rounds_per_merge=1,
    eval_rounds=0,
    # Bit-identical artefacts need each reply to depend on its own prompt alone: the local run
    # batches every cluster's debate turns together, Ray runs each cluster apart, and batched
    # sequences differ by floating-point noise that can move a sampled token (docs/scale-out.md).
    # So one sequence at a time from a fresh KV cache, a setting the spec carries to every worker.
    llm="smollm2-135m@n_parallel=1",
    recommender="embedding",
    target=("Film-Noir",),
    seed=3,
    debate_max_tokens=40,
    merge_max_tokens=160,
)
ARTEFACTS = ("clusters_g0.json", "transcript_g0.json", "merge_g0.json", "roster_g1.json", "final_roster.json")


@pytest.fixture(scope="module")
def ray():
    try:
        from ctrlsim.experiments._ray_executor import import_ray

        ray = import_ray()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def stored(out) -> dict:
    lines = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return {line["key"]: line["record"] for line in lines if "key" in line}


def phase_tokens(out, name):
    return {k: v for k, v in stored(out)[f"phase/{name}"]["tokens"].items() if k != "cached_calls"}


def test_ray_cluster_units_give_the_local_batched_artefacts(tmp_path, llm_or_skip, ray):
    llm_or_skip("smollm2-135m")  # skips without llama.cpp / the bundled model
    local = ctrlsim.run("evolve", config=CONFIG, options=RunOptions(out=str(tmp_path / "local")),
                        show_progress=False)
    remote = ctrlsim.run("evolve", config=CONFIG,
                         options=RunOptions(out=str(tmp_path / "ray"), executor="ray"),
                         show_progress=False)

    clusters = json.loads((tmp_path / "local" / "clusters_g0.json").read_text())["members"]
    assert any(len(m) >= 2 for m in clusters)  # the debate really ran
    for name in ARTEFACTS:
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    for phase in ("debate_g0", "merge_g0"):
        assert phase_tokens(tmp_path / "ray", phase) == phase_tokens(tmp_path / "local", phase)
        assert phase_tokens(tmp_path / "ray", phase)["calls"] > 0
    assert [p.to_dict() for p in remote.summary["final"]] == [p.to_dict() for p in local.summary["final"]]

    # One stored record per cluster, written by the driver; a rerun runs no unit again.
    unit_keys = [f"fusion/g0/cluster-{c}" for c in range(len(clusters))]
    assert sorted(k for k in stored(tmp_path / "ray") if k.startswith("fusion/")) == sorted(unit_keys)
    assert not any(k.startswith("fusion/") for k in stored(tmp_path / "local"))
    again = ctrlsim.run("evolve", config=CONFIG,
                        options=RunOptions(out=str(tmp_path / "ray"), executor="ray"), show_progress=False)
    assert [p.to_dict() for p in again.summary["final"]] == [p.to_dict() for p in local.summary["final"]]
