import json
import subprocess
import sys

from ctrlsim.experiments.cli import main


def test_import_is_cheap():
    code = ("import sys, ctrlsim, ctrlsim.data, ctrlsim.backends, ctrlsim.recommenders, ctrlsim.metrics;"
            "print([m for m in ('torch', 'recbole', 'llama_cpp', 'vllm', 'transformers', "
            "'sentence_transformers', 'ray') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_info_lists_offline_resources(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {d["name"] for d in info["datasets"]} == {"ml-100k"}
    assert {m["name"] for m in info["llms"]} == {"qwen2.5-1.5b", "qwen2.5-0.5b", "smollm2-135m"}
    assert {"minilm", "bge", "twhin-bert"} <= {e["name"] for e in info["encoders"]}
    assert all("provided_by" in m for m in info["llms"] + info["encoders"])
    assert "movielens-dat" in info["formats"]


def test_info_table_and_data_summary(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-1.5b" in out and "<name>@q4_0 or @q8_0" in out
    assert main(["data", "ml-100k"]) == 0
    out = capsys.readouterr().out
    assert "1682" in out and "100000" in out and "Film-Noir" in out


def test_cli_reports_typed_errors(capsys):
    assert main(["data", "no-such-dataset"]) == 2
    assert "unknown dataset" in capsys.readouterr().err
