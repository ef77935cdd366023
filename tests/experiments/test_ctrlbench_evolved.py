"""The evolved methods end to end through `ctrlsim ctrlbench`, on the smallest bundled LLM."""
import json

import pytest

from ctrlsim.experiments.commands import runner_main
from ctrlsim.experiments.ctrlbench.config import episode_key


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


@pytest.mark.llm
@pytest.mark.slow  # two evolutions with debates and merges: about 150 s on one thread
def test_kmeans_fusion_and_ctrlbench_through_the_command(ml100k, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--methods", "base-small,kmeans-fusion,ctrlbench", "--recommenders", "popularity",
            "--targets", "War+Film-Noir", "--agents", "4,1", "--rounds", "2", "--seeds", "0",
            "--llm", "smollm2-135m", "--out", str(out)]
    assert runner_main("ctrlbench", args) == 0
    records = {json.loads(line)["key"]: json.loads(line)["record"]
               for line in (out / "records.jsonl").read_text().splitlines()[1:]}
    for method in ("kmeans-fusion", "ctrlbench"):
        record = records[episode_key(method, "popularity", "War+Film-Noir", 0)]
        generations = record["artefacts"]["generations"]
        # Two fusions halve 4 -> 2 -> 1: the evaluated population is K_small = 1 super probe.
        assert [g["probes"] for g in generations] == [4, 2] and record["k"] == 1
        assert record["setup_tokens"] > 0 and record["decisions"] == 2
        assert len(record["probes"][0]["rounds"]) == 2
        assert record["target_tags"] == ["War", "Film-Noir"] and record["target_size"] == 95
    ctrlbench = records[episode_key("ctrlbench", "popularity", "War+Film-Noir", 0)]
    # Every cluster of more than one member was merged (a singleton is only filtered).
    clusters = sum(size > 1 for g in ctrlbench["artefacts"]["generations"] for size in g["sizes"])
    assert ctrlbench["merges"] == clusters >= 1
    assert 0 <= ctrlbench["merge_fallbacks"] == sum(g["merge_fallbacks"]
                                                    for g in ctrlbench["artefacts"]["generations"])
    assert ctrlbench["target_items_added"] == 0  # the paper's rule: nothing forced back
    tables = (out / "tables.md").read_text()
    row = next(line for line in tables.splitlines()
               if line.startswith("| CtrlBench-Rec ") and f"/{clusters} " in line)
    assert f"| {ctrlbench['merge_fallbacks']}/{clusters} " in row
    assert "Paired comparison with base-small" in tables
