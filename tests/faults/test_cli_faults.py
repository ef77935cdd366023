"""Every runner rejects bad values before any model loads (issue 14, point 7), and two runs on one
run folder at once: the second is refused with an error naming the holder (point 1).

All bad commands run in ONE fresh interpreter (`ctrlsim.experiments.cli.main([...])` per case):
after each case it records the exit code, what was printed on stderr, whether a run folder was
left behind, and which of `llama_cpp`, `torch`, `sentence_transformers` had been imported. A
fresh interpreter is needed because this test process may already hold those modules; one for
all cases keeps the file fast (imports cost seconds on a loaded 2-core machine). Each case
starts from a tiny valid command, so a value that slipped through would run briefly, not for hours.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HEAVY = ("llama_cpp", "torch", "sentence_transformers")

# The smallest valid command of each runner: its own `--preset smoke` (declared beside its config) on
# the smallest bundled LLM; a case's flags are appended (an explicit flag wins over the preset).
LLM_FLAG = {"steereval": "--llm", "promptshift": "--llms", "ctrlbench": "--llm", "evolve": "--llm",
            "calibrate": "--llm"}
BASE = {runner: ["--preset", "smoke", *((LLM_FLAG[runner], "smollm2-135m") if runner in LLM_FLAG else ())]
        for runner in ("probe", "steereval", "promptshift", "ctrlbench", "evolve", "calibrate",
                       "train-probe", "controls")}
SEED_FLAG = {"ctrlbench": "--seeds", "calibrate": "--seeds", "controls": "--seeds"}
HUGE = "1000000000000"  # 1e12, as a typo or an adversary would give it
TOO_BIG_SEED = str(2**63)  # one past int64

# (kind, runner, flags, texts the error message must contain: the field and the offending value)
VALUE_CASES = [
    *[("negative seed", r, [SEED_FLAG.get(r, "--seed"), "-1"], [SEED_FLAG.get(r, "--seed").strip("-"), "-1"])
      for r in BASE],
    ("negative or zero count", "probe", ["--agents", "0"], ["agents", "0"]),
    ("negative or zero count", "probe", ["--rounds", "-1"], ["rounds", "-1"]),
    ("negative or zero count", "probe", ["--slate-size", "0"], ["slate_size", "0"]),
    ("negative or zero count", "probe", ["--ceiling-states", "0"], ["ceiling_states", "0"]),
    ("number out of range", "probe", ["--like-prob", "2"], ["like_prob", "2"]),
    ("negative or zero count", "steereval", ["--users", "-1"], ["users", "-1"]),
    ("negative or zero count", "steereval", ["--users", "0"], ["users", "0"]),
    ("negative or zero count", "steereval", ["--pool-size", "0"], ["pool_size", "0"]),
    ("negative or zero count", "steereval", ["--k", "0"], ["k", "0"]),
    ("negative or zero count", "promptshift", ["--users", "0"], ["users", "0"]),
    ("negative or zero count", "promptshift", ["--users", "-1"], ["users", "-1"]),
    ("negative or zero count", "promptshift", ["--n-candidates", "0"], ["n_candidates", "0"]),
    ("negative or zero count", "promptshift", ["--k", "-1"], ["k", "-1"]),
    ("negative or zero count", "ctrlbench", ["--rounds", "0"], ["rounds", "0"]),
    ("negative or zero count", "ctrlbench", ["--agents", "0,0"], ["agents", "0"]),
    ("negative or zero count", "ctrlbench", ["--slate-size", "0"], ["slate_size", "0"]),
    ("number out of range", "ctrlbench", ["--like-prob", "2"], ["like_prob", "2"]),
    ("negative or zero count", "evolve", ["--agents", "0"], ["agents", "0"]),
    ("negative or zero count", "evolve", ["--merges", "-1"], ["merges", "-1"]),
    ("negative or zero count", "evolve", ["--eval-rounds", "-1"], ["eval_rounds", "-1"]),
    ("negative or zero count", "evolve", ["--slate-size", "0"], ["slate_size", "0"]),
    ("negative or zero count", "calibrate", ["--rounds", "0"], ["rounds", "0"]),
    ("negative or zero count", "calibrate", ["--users", "0"], ["users", "0"]),
    ("number out of range", "calibrate", ["--dials", "0,1.5"], ["dials", "1.5"]),
    ("text where a number belongs", "probe", ["--agents", "many"], ["--agents", "many"]),
    ("text where a number belongs", "promptshift", ["--users", "1.5"], ["--users", "1.5"]),
    ("unknown name", "probe", ["--recommender", "bogus-box"], ["bogus-box"]),
    ("unknown name", "probe", ["--task", "bogus-task"], ["bogus-task"]),
    ("unknown name", "probe", ["--target", "Bogus-Genre"], ["Bogus-Genre"]),
    ("unknown name", "steereval", ["--conditions", "bogus"], ["conditions", "bogus"]),
    ("unknown name", "steereval", ["--tags", "Horror,Nope"], ["Nope"]),
    ("unknown name", "steereval", ["--rating", "bogus-rating"], ["bogus-rating"]),
    ("unknown name", "promptshift", ["--scenarios", "bogus"], ["scenarios", "bogus"]),
    ("unknown name", "promptshift", ["--unmatched", "bogus-rule"], ["bogus-rule"]),
    ("retired flag", "promptshift", ["--llm-cache", "replies.sqlite"], ["--llm-cache", "--shared-cache"]),
    ("unknown name", "ctrlbench", ["--methods", "random,bogus-method"], ["bogus-method"]),
    ("unknown name", "ctrlbench", ["--recommenders", "bogus-box"], ["bogus-box"]),
    ("unknown name", "ctrlbench", ["--targets", "Bogus-Genre"], ["Bogus-Genre"]),
    ("unknown name", "evolve", ["--recommender", "bogus-box"], ["bogus-box"]),
    ("unknown name", "evolve", ["--target", "Bogus-Genre"], ["Bogus-Genre"]),
    ("unknown name", "evolve", ["--k-rule", "bogus-rule"], ["bogus-rule"]),
    ("unknown name", "evolve", ["--fusion", "bogus-fusion"], ["bogus-fusion"]),
    ("unknown name", "calibrate", ["--methods", "random,bogus-method"], ["bogus-method"]),
    ("unknown name", "calibrate", ["--protocol", "bogus-protocol"], ["protocol", "bogus-protocol"]),
    ("repeated list value", "probe", ["--checkpoints", "2,2"], ["checkpoints", "2, 2"]),
    ("repeated list value", "steereval", ["--conditions", "default,default"], ["conditions", "default"]),
    ("repeated list value", "steereval", ["--tags", "Horror,Horror"], ["tags", "Horror"]),
    ("repeated list value", "promptshift", ["--scenarios", "gender,gender"], ["scenarios", "gender"]),
    ("repeated list value", "promptshift", ["--llms", "smollm2-135m,smollm2-135m"], ["llms", "smollm2-135m"]),
    ("repeated list value", "ctrlbench", ["--methods", "random,random"], ["methods", "random"]),
    ("repeated list value", "ctrlbench", ["--targets", "War,War"], ["targets", "War"]),
    ("repeated list value", "ctrlbench", ["--recommenders", "popularity,popularity"],
     ["recommenders", "popularity"]),
    ("repeated list value", "ctrlbench", ["--seeds", "0,0"], ["seeds", "0"]),
    ("repeated list value", "evolve", ["--target", "Film-Noir,Film-Noir"], ["target", "Film-Noir"]),
    ("repeated list value", "calibrate", ["--dials", "0,0"], ["dials", "0"]),
    ("repeated list value", "calibrate", ["--seeds", "0,0"], ["seeds", "0"]),
    # Issue 20: absurd counts fail at once naming the field and its bound (ctrlsim.experiments.config),
    # instead of hanging or exhausting memory; each bound is written out here, not imported.
    ("number above its bound", "probe", ["--agents", HUGE], ["agents", "100000", HUGE]),
    ("number above its bound", "probe", ["--rounds", HUGE], ["rounds", "10000", HUGE]),
    ("number above its bound", "probe", ["--slate-size", HUGE], ["slate_size", "10000"]),
    ("number above its bound", "probe", ["--ceiling-states", HUGE], ["ceiling_states", "1000000"]),
    ("number above its bound", "probe", ["--seed", TOO_BIG_SEED], ["seed", str(2**63 - 1)]),
    ("number above its bound", "steereval", ["--users", HUGE], ["users", "1000000"]),
    ("number above its bound", "steereval", ["--pool-size", HUGE], ["pool_size", "10000000"]),
    ("number above its bound", "steereval", ["--history-len", HUGE], ["history_len", "10000000"]),
    ("number above its bound", "steereval", ["--k", HUGE], ["k", "10000"]),
    ("number above its bound", "steereval", ["--table8-samples", HUGE], ["table8_samples", "1000000"]),
    ("number above its bound", "steereval", ["--seed", TOO_BIG_SEED], ["seed", str(2**63 - 1)]),
    ("number above its bound", "promptshift", ["--users", HUGE], ["users", "1000000"]),
    ("number above its bound", "promptshift", ["--n-candidates", HUGE], ["n_candidates", "10000"]),
    ("number above its bound", "promptshift", ["--max-tokens", HUGE], ["max_tokens", "1048576"]),
    ("number above its bound", "promptshift", ["--seed", TOO_BIG_SEED], ["seed", str(2**63 - 1)]),
    ("number above its bound", "ctrlbench", ["--agents", f"{HUGE},1"], ["agents", "100000"]),
    ("number above its bound", "ctrlbench", ["--rounds", HUGE], ["rounds", "10000"]),
    ("number above its bound", "ctrlbench", ["--slate-size", HUGE], ["slate_size", "10000"]),
    ("number above its bound", "ctrlbench", ["--memory-rounds", HUGE], ["memory_rounds", "10000"]),
    ("number above its bound", "ctrlbench", ["--min-target-items", HUGE], ["min_target_items", "10000000"]),
    ("number above its bound", "ctrlbench", ["--seeds", TOO_BIG_SEED], ["seeds", str(2**63 - 1)]),
    ("number above its bound", "evolve", ["--agents", HUGE], ["agents", "100000"]),
    ("number above its bound", "evolve", ["--merges", HUGE], ["merges", "64"]),
    ("number above its bound", "evolve", ["--eval-rounds", HUGE], ["eval_rounds", "10000"]),
    ("number above its bound", "evolve", ["--debate-max-tokens", HUGE], ["debate_max_tokens", "1048576"]),
    ("number above its bound", "calibrate", ["--rounds", HUGE], ["rounds", "10000"]),
    ("number above its bound", "calibrate", ["--users", HUGE], ["users", "1000000"]),  # unused by ctrlbench
    ("number above its bound", "calibrate", ["--agents", f"{HUGE},1"], ["agents", "100000"]),
    ("number above its bound", "calibrate", ["--seeds", TOO_BIG_SEED], ["seeds", str(2**63 - 1)]),
    ("negative or zero count", "train-probe", ["--timesteps", "0"], ["timesteps", "0"]),
    ("negative or zero count", "train-probe", ["--n-steps", "1"], ["n_steps", "1"]),
    ("unknown name", "train-probe", ["--recommender", "bogus-box"], ["bogus-box"]),
    ("unknown name", "train-probe", ["--target", "Bogus-Tag"], ["Bogus-Tag"]),
    ("unknown name", "train-probe", ["--algorithm", "DQN"], ["DQN"]),
    ("repeated list value", "train-probe", ["--target", "War,War"], ["target", "War"]),
    ("number above its bound", "train-probe", ["--timesteps", HUGE], ["timesteps", "10000000"]),
    ("number above its bound", "train-probe", ["--budget", HUGE], ["budget", "10000"]),
    ("number above its bound", "train-probe", ["--seed", str(2**32)], ["seed", str(2**32 - 1)]),
    ("negative or zero count", "controls", ["--users", "0"], ["users", "0"]),
    ("negative or zero count", "controls", ["--points", "0"], ["points", "0"]),
    ("unknown name", "controls", ["--boxes", "bogus-box"], ["bogus-box"]),
    ("repeated list value", "controls", ["--boxes", "popularity,popularity"], ["boxes", "popularity"]),
    ("number above its bound", "controls", ["--users", HUGE], ["users", "1000000"]),
]
KINDS_EVERY_RUNNER_HAS = ("negative seed", "negative or zero count", "unknown name", "repeated list value",
                          "number above its bound")
OUT_CASES = [(r, kind) for r in BASE for kind in ("under-a-file", "unwritable")]


def _case_id(case) -> str:
    _, runner, flags, _ = case
    return f"{runner}:{' '.join(flags)}"


def _unwritable_dir(tmp: Path) -> Path:
    """A folder nobody here can create files in: mode 0o500, or for root a sysfs folder."""
    folder = tmp / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        (folder / "probe").touch()
    except OSError:
        return folder
    (folder / "probe").unlink()
    if Path("/sys/kernel").is_dir():  # root ignores modes; sysfs refuses new files even to root
        try:
            (Path("/sys/kernel") / "ctrlsim-probe").mkdir()
        except OSError:
            return Path("/sys/kernel")
        (Path("/sys/kernel") / "ctrlsim-probe").rmdir()
    pytest.skip("no unwritable folder available (running as root without sysfs)")


SNIPPET = textwrap.dedent("""
    import contextlib, io, json, sys
    from pathlib import Path
    from ctrlsim.experiments.cli import main

    HEAVY = {heavy!r}
    results = {{}}
    for case_id, argv, out in json.load(open(sys.argv[1])):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own errors
                code = exc.code
            except BaseException as exc:  # a raw traceback: what these tests exist to catch
                code = f"raised {{type(exc).__name__}}: {{exc}}"
        results[case_id] = {{"code": code, "err": err.getvalue(),
                            "records_left": (Path(out) / "records.jsonl").exists(),
                            "heavy": [m for m in HEAVY if m in sys.modules]}}
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Run every bad command in one fresh interpreter; case id -> outcome."""
    tmp = tmp_path_factory.mktemp("cli-faults")
    a_file = tmp / "a-file.txt"
    a_file.write_text("not a folder\n")
    read_only = _unwritable_dir(tmp)
    cases, outs = [], {}
    for n, case in enumerate(VALUE_CASES):
        _, runner, flags, _ = case
        out = tmp / f"run-{n}"
        cases.append([_case_id(case), [runner, *BASE[runner], *flags, "--out", str(out)], str(out)])
    for runner, kind in OUT_CASES:
        out = (a_file / "run") if kind == "under-a-file" else (read_only / f"ctrlsim-{runner}")
        outs[(runner, kind)] = out
        cases.append([f"{runner}:--out {kind}", [runner, *BASE[runner], "--out", str(out)], str(out)])
    spec = tmp / "cases.json"
    spec.write_text(json.dumps(cases))
    env = {**os.environ, "CTRLSIM_THREADS": "1", "CTRLSIM_CACHE": str(tmp / "cache")}
    proc = subprocess.run([sys.executable, "-c", SNIPPET.format(heavy=HEAVY), str(spec)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), outs


def _check_rejected(result: dict, must_name: list[str]) -> None:
    assert result["code"] == 2, \
        f"expected exit code 2, got {result['code']!r}; stderr: {result['err'][-600:]}"
    assert "Traceback" not in result["err"]
    for text in must_name:
        assert text in result["err"], f"{text!r} not named in: {result['err'][-600:]}"
    assert result["heavy"] == [], f"loaded {result['heavy']} before rejecting the command"
    assert not result["records_left"], "a rejected command left a run folder with records.jsonl"


@pytest.mark.parametrize("case", VALUE_CASES, ids=_case_id)
def test_bad_value_is_exit_code_2_naming_it_before_any_model_loads(outcomes, case):
    _check_rejected(outcomes[0][_case_id(case)], case[-1])


@pytest.mark.parametrize("runner, kind", OUT_CASES, ids=[f"{r}-{k}" for r, k in OUT_CASES])
def test_bad_output_location_is_exit_code_2_naming_it_before_any_work(outcomes, runner, kind):
    results, outs = outcomes
    out = outs[(runner, kind)]
    _check_rejected(results[f"{runner}:--out {kind}"], [str(out)])
    assert not out.exists()


def test_every_runner_is_tried_with_every_kind_of_bad_value():
    """The table above keeps covering every runner (a new runner needs its cases)."""
    from ctrlsim.experiments.cli import PROTOCOLS

    assert set(BASE) == set(PROTOCOLS)
    for runner in BASE:
        kinds = {kind for kind, r, _, _ in VALUE_CASES if r == runner}
        assert set(KINDS_EVERY_RUNNER_HAS) <= kinds, runner


# A ceiling search that takes minutes, so the first run still holds its folder when the second starts.
HOLDER_FLAGS = ["--recommender", "popularity", "--agents", "20", "--rounds", "20",
                "--ceiling-states", "100000"]


def test_second_run_on_the_same_folder_is_refused_naming_the_holder(tmp_path):
    """A probe run holds its folder; a second run on it exits 2 naming the first one's pid."""
    out = tmp_path / "shared"
    env = {**os.environ, "CTRLSIM_THREADS": "1", "CTRLSIM_CACHE": str(tmp_path / "cache")}
    first = subprocess.Popen([sys.executable, "-m", "ctrlsim.experiments.cli", "probe",
                              *HOLDER_FLAGS, "--out", str(out)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = out / "records.jsonl.lock"
    try:
        deadline = time.monotonic() + 120
        while not (lock.exists() and f"pid {first.pid} " in lock.read_text()):
            assert first.poll() is None, "the first run ended before the second could start"
            assert time.monotonic() < deadline, "the first run never took its folder"
            time.sleep(0.1)
        second = subprocess.run([sys.executable, "-m", "ctrlsim.experiments.cli", "probe",
                                 *HOLDER_FLAGS, "--out", str(out)], env=env,
                                capture_output=True, text=True, timeout=300)
        assert first.poll() is None, "the first run ended before the second was refused: test inconclusive"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"is being written by pid {first.pid} on " in second.stderr
    assert str(out / "records.jsonl") in second.stderr
    assert "Traceback" not in second.stderr
