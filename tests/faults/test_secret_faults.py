"""Secrets never land on disk or on screen (issue 20, point 5): credentials in an LLM spec (URL
userinfo, a query token) are absent from every file of the run folder and the cache, and from
everything the command printed, while the run still works (here: fails its units naming the server)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ctrlsim.experiments.cli import main
from ctrlsim.redact import redact_obj, redact_secrets

PASSWORD, TOKEN = "hunter2secret", "XYZSECRETTOKEN"
SPEC = f"http://user:{PASSWORD}@127.0.0.1:9/v1?api_key={TOKEN}#m"  # nothing listens on port 9


@pytest.mark.parametrize("text, expected", [
    ("http://user:pw@host/v1#m", "http://***@host/v1#m"),
    ("openai:https://u:p@host:8000/v1?api_key=XYZ&x=1#m", "openai:https://***@host:8000/v1?api_key=***&x=1#m"),
    ("https://host/v1?access_token=abc", "https://host/v1?access_token=***"),
    ("Authorization: Bearer sk-abcdefgh12345", "Authorization: Bearer ***"),
    ("x-api-key: zzz", "x-api-key: ***"),
    ("http://host:8000/v1#qwen", "http://host:8000/v1#qwen"),  # nothing secret: unchanged
    ("qwen2.5-0.5b", "qwen2.5-0.5b"),
])
def test_redaction_by_hand(text, expected):
    assert redact_secrets(text) == expected
    assert redact_secrets(expected) == expected  # idempotent: a stored config compares equal on resume


def test_redact_obj_walks_keys_and_values():
    obj = {"llm": "http://a:b@h/v1", "list": ["x", "http://c:d@h"], "n": 3, "http://e:f@h": None}
    assert redact_obj(obj) == {"llm": "http://***@h/v1", "list": ["x", "http://***@h"], "n": 3,
                               "http://***@h": None}


def _everything_written(*folders: Path) -> bytes:
    return b"".join(p.read_bytes() for folder in folders if folder.exists()
                    for p in sorted(folder.rglob("*")) if p.is_file())


@pytest.mark.parametrize("runner, flags", [
    ("ctrlbench", ["--methods", "random,base-small", "--recommenders", "popularity", "--targets", "War",
                   "--agents", "1,1", "--rounds", "1", "--seeds", "0", "--llm", SPEC]),
    ("promptshift", ["--llms", SPEC, "--users", "1", "--scenarios", "gender", "--n-candidates", "3",
                     "--k", "2", "--history-len", "3", "--min-fit-positives", "3"]),
    ("calibrate", ["--methods", "base-small", "--dials", "0,1", "--seeds", "0", "--rounds", "1",
                   "--llm", SPEC]),
])
def test_credentials_in_an_llm_spec_reach_no_file_and_no_output(runner, flags, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CTRLSIM_CACHE", str(cache))
    out = tmp_path / "run"
    code = main([runner, *flags, "--out", str(out), "--figures", "false"])
    printed = capsys.readouterr()
    assert code == 1  # the units that need the server failed, and said so
    assert "127.0.0.1:9" in printed.err
    written = _everything_written(out, cache)
    assert (out / "config.json").exists()
    for secret in (PASSWORD, TOKEN):
        assert secret not in printed.out and secret not in printed.err
        assert secret.encode() not in written
    assert b"***@127.0.0.1:9" in (out / "config.json").read_bytes()
