import json

from ctrlsim.experiments.cli import main


def test_probe_job_prints_table1_and_ceiling(tmp_path, capsys, minilm):
    out = tmp_path / "probe.json"
    assert main(["probe", "--recommender", "embedding", "--agents", "4", "--rounds", "10", "--target", "Horror",
                 "--ceiling-states", "40", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Cov% t=5" in text and "Eff t=10" in text and "Ceiling" in text
    result = json.loads(out.read_text())
    assert set(result["metrics"]) == {"5", "10"}
    assert result["config"]["slate_size"] == 3 and result["recommender"]["encoder"]["encoder"] == "minilm"
    cov = result["metrics"]["10"]["coverage"]
    assert 0 <= result["metrics"]["5"]["coverage"] <= cov <= 1
