"""An unwritable $CTRLSIM_CACHE (issue 20): a run that needs no LLM never touches the cache folder;
a run that needs it is refused before any unit runs, with one `ConfigError` naming the folder and
the variable (exit code 2 from the CLI, no model imported).

The unwritable folder is a folder of mode 0o500, or for root (whom modes do not bind) a folder
under sysfs, which refuses new entries even to root.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from ctrlsim.backends.bundled import cache_dir, check_cache_writable
from ctrlsim.backends.encoders import Encoder, EncoderSpec
from ctrlsim.errors import CacheUnavailableWarning, CacheUnwritableError, ConfigError

HEAVY = ("llama_cpp", "torch", "sentence_transformers")


def _unwritable(tmp: Path) -> Path:
    folder = tmp / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    if not os.access(folder, os.W_OK):
        return folder
    sysfs = Path("/sys/kernel") / "ctrlsim-cache"
    if sysfs.parent.is_dir() and not sysfs.exists():
        try:
            sysfs.mkdir()
        except OSError:
            return sysfs
        sysfs.rmdir()
    pytest.skip("no unwritable folder available (running as root without sysfs)")


def _untouched(folder: Path) -> bool:
    """Nothing was created in (or as) the unwritable cache folder."""
    return not folder.exists() or not any(folder.iterdir())


@pytest.fixture
def unwritable(tmp_path) -> Path:
    return _unwritable(tmp_path)


def test_a_cache_folder_that_cannot_be_created_is_a_typed_error_naming_it_and_the_variable(
        monkeypatch, unwritable):
    monkeypatch.setenv("CTRLSIM_CACHE", str(unwritable))
    with pytest.raises(CacheUnwritableError) as caught:
        cache_dir("ctrlbench")
    assert str(unwritable / "ctrlbench") in str(caught.value) and "CTRLSIM_CACHE" in str(caught.value)


def test_the_up_front_check_names_the_folder_what_needs_it_and_the_variable(monkeypatch, unwritable):
    monkeypatch.setenv("CTRLSIM_CACHE", str(unwritable))
    check_cache_writable({})  # nothing to keep: the folder is not even looked at
    with pytest.raises(ConfigError) as caught:
        check_cache_writable({"ctrlbench": "the LLM replies of base-small"})
    message = str(caught.value)
    assert str(unwritable / "ctrlbench") in message and "CTRLSIM_CACHE" in message
    assert "the LLM replies of base-small" in message


def test_a_writable_cache_folder_passes_the_check(monkeypatch, tmp_path):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    check_cache_writable({"ctrlbench": "replies", "models": "a model"})
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["ctrlbench", "models"]


@pytest.mark.parametrize("fields, needs", [
    ({"methods": ("random", "oracle"), "recommenders": ("popularity", "embedding")}, set()),
    ({"methods": ("random", "base-small")}, {"models"}),  # replies and personas live in the run folder
    ({"methods": ("base-small",), "llm": "http://127.0.0.1:9/v1#m"}, set()),
    ({"methods": ("base-small",), "cache": False, "llm": "http://127.0.0.1:9/v1#m"}, set()),
    ({"methods": ("base-small",), "cache": False}, {"models"}),  # the bundled GGUF is verified there
    ({"methods": ("kmeans-fusion",), "cache": False, "llm": "http://127.0.0.1:9/v1#m"}, {"ctrlbench"}),
    ({"methods": ("random",), "recommenders": ("sasrec",)}, {"recbole"}),
    ({"methods": ("random",), "recommenders": ("keyword-bm25",)}, {"models"}),
])
def test_what_a_ctrlbench_run_keeps_in_the_cache_folder(fields, needs):
    from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig
    from ctrlsim.experiments.ctrlbench.inputs import cache_uses

    assert set(cache_uses(CtrlBenchConfig(**{"recommenders": ("popularity",), **fields}))) == needs


class _FakeEncoder(Encoder):
    def __init__(self, **options):
        super().__init__("fake", EncoderSpec("fake-model", "st"), **options)
        self.embedded: list[str] = []

    def _load(self):
        return object()

    def _embed(self, texts):
        self.embedded.extend(texts)
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


def test_an_encoder_opens_its_disk_cache_lazily_and_runs_in_memory_where_it_cannot(monkeypatch, unwritable):
    monkeypatch.setenv("CTRLSIM_CACHE", str(unwritable))
    encoder = _FakeEncoder()  # built without touching the cache folder
    with pytest.warns(CacheUnavailableWarning, match="in memory only"):
        first = encoder.encode(["abc", "de"])
    expected = np.array([[3, 1], [2, 1]], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(first, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not on every call
        again = encoder.encode(["abc", "de"])
    assert np.array_equal(again, first) and encoder.embedded == ["abc", "de"]  # memory cache answered
    assert _untouched(unwritable)


def test_an_encoder_with_a_writable_cache_creates_nothing_until_it_must(monkeypatch, tmp_path):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    encoder = _FakeEncoder()
    assert not (tmp_path / "cache").exists()
    encoder.encode(["abc"])
    assert len(list((tmp_path / "cache" / "embeddings").glob("*.sqlite"))) == 1
    assert _FakeEncoder().encode(["abc"]).shape == (1, 2)  # a second encoder reads it back


SNIPPET = textwrap.dedent("""
    import contextlib, io, json, sys
    from pathlib import Path
    from ctrlsim.experiments.cli import main

    results = {}
    for case_id, argv, out in json.load(open(sys.argv[1])):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except BaseException as exc:
                code = f"raised {type(exc).__name__}: {exc}"
        records = Path(out) / "records.jsonl"
        results[case_id] = {"code": code, "err": err.getvalue(),
                            # the lines after the header: one per stored unit
                            "records": len(records.read_text().splitlines()[1:]) if records.exists() else 0,
                            "heavy": [m for m in %r if m in sys.modules]}
    print(json.dumps(results))
""") % (HEAVY,)

SMALL = ["--recommenders", "popularity", "--targets", "War", "--agents", "2,1", "--rounds", "2",
         "--seeds", "0", "--figures", "false"]
CASES = {
    # token-free: must run although the cache folder cannot be created (expected code, units stored)
    "ctrlbench random": (["ctrlbench", "--methods", "random", *SMALL], 0, 1),
    "ctrlbench oracle": (["ctrlbench", "--methods", "oracle", *SMALL], 0, 1),
    "calibrate random": (["calibrate", "--methods", "random", "--dials", "0,1", "--seeds", "0",
                          "--rounds", "1", "--figures", "false"], 0, 2),
    # an LLM method: refused up front (its replies and the bundled LLM live in the cache folder)
    "ctrlbench base-small": (["ctrlbench", "--methods", "random,base-small", "--llm", "smollm2-135m",
                              *SMALL], 2, 0),
    "calibrate base-small": (["calibrate", "--methods", "base-small", "--dials", "0,1", "--seeds", "0",
                              "--rounds", "1", "--llm", "smollm2-135m", "--figures", "false"], 2, 0),
    "evolve": (["evolve", "--agents", "2", "--merges", "1", "--rounds-per-merge", "1", "--eval-rounds", "1",
                "--llm", "smollm2-135m", "--recommender", "popularity", "--figures", "false"], 2, 0),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache-folder")
    cache = _unwritable(tmp)
    spec = tmp / "cases.json"
    spec.write_text(json.dumps([[name, [*argv, "--out", str(tmp / f"run-{n}")], str(tmp / f"run-{n}")]
                                for n, (name, (argv, _, _)) in enumerate(CASES.items())]))
    env = {**os.environ, "CTRLSIM_THREADS": "1", "CTRLSIM_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-c", SNIPPET, str(spec)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _untouched(cache)  # not one run created anything in the cache folder
    return json.loads(proc.stdout.strip().splitlines()[-1]), cache


@pytest.mark.parametrize("case", list(CASES))
def test_an_unwritable_cache_folder_stops_only_the_runs_that_need_it(outcomes, case):
    results, cache = outcomes
    result, (_, expected, units) = results[case], CASES[case]
    assert result["code"] == expected, result["err"][-1500:]
    assert "Traceback" not in result["err"]
    if expected == 0:
        assert result["records"] == units  # every unit finished and was stored
        return
    assert str(cache) in result["err"] and "CTRLSIM_CACHE" in result["err"], result["err"][-1500:]
    assert result["records"] == 0 and result["heavy"] == []  # refused before any unit or model
