"""SIGKILL and resume, for every runner: the finished run equals an uninterrupted one (issue 14, points 1,
9 and 10).

Per runner, the smallest real config (the bundled smollm2-135m where an LLM is needed, the non-LLM
`popularity` box where a black box is needed) runs three times, each as `python -m
ctrlsim.experiments.cli <runner> ...` in its own process:

1. the reference: uninterrupted, into its own folder (and its own $CTRLSIM_CACHE);
2. the same command on a second folder, SIGKILLed as soon as its first record is on disk;
3. the same command again on that folder, to completion.

The resumed folder's records must equal the reference's: the same keys, each written once (a line
torn by the kill is ignored, as the store's readers ignore it), and the same values except the
wall-clock fields named in `TIMING` for each runner. The kill must land mid-run (some records still
missing), or the test fails as inconclusive rather than passing. The reference runs at the same
time as the interrupted run, which halves the wall time on a busy machine.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ctrlsim.experiments.store import REPAIR_MARKER


@dataclass(frozen=True)
class RunnerCase:
    runner: str
    flags: tuple[str, ...]
    keys: int  # records of a finished run
    timing: tuple[str, ...]  # top-level record fields that hold wall-clock time (may differ)
    kill_when: str = "first record"  # or "phases" (evolve), "training" (train-probe: before its record)
    # Fields that differ after a resume because of a known runner defect (checked by an xfail test).
    history_dependent: tuple[str, ...] = ()


CASES = {
    # units: episode, then ceiling (a 2000-state beam search: seconds, so the kill lands in it)
    "probe": RunnerCase("probe", ("--recommender", "popularity", "--agents", "4", "--rounds", "8",
                                  "--ceiling-states", "2000"), keys=2, timing=("seconds",)),
    # units: one user x Horror x (increase, decrease); the profile is written in the first unit, which
    # also pays its tokens after a resume (shared work counts towards its first unit).
    "steereval": RunnerCase("steereval", ("--llm", "smollm2-135m", "--users", "1", "--tags", "Horror",
                                          "--pool-size", "2", "--history-len", "3", "--min-ratings", "4",
                                          "--conditions", "default", "--table8-samples", "1"),
                            keys=2, timing=()),
    # units: random (no LLM, first), then base-small (LLM probes): the kill lands in the LLM episode
    "ctrlbench": RunnerCase("ctrlbench", ("--methods", "random,base-small", "--recommenders", "popularity",
                                          "--targets", "War", "--agents", "1,1", "--rounds", "2",
                                          "--seeds", "0", "--llm", "smollm2-135m", "--decision", "json"),
                            keys=2,
                            timing=("timing",)),
    # units: one per sampled user; each generates 5 lists (L0, P1-P3, one gender cue)
    "promptshift": RunnerCase("promptshift", ("--llms", "smollm2-135m", "--users", "2", "--scenarios",
                                              "gender", "--n-candidates", "3", "--k", "2", "--history-len",
                                              "3", "--min-fit-positives", "3"), keys=2, timing=()),
    # the loop's phases (profiles, interact, embed, cluster, debate, merge, align) and the evaluation
    "evolve": RunnerCase("evolve", ("--agents", "2", "--merges", "1", "--rounds-per-merge", "1",
                                    "--eval-rounds", "1", "--llm", "smollm2-135m", "--recommender",
                                    "popularity", "--debate-max-tokens", "16", "--merge-max-tokens", "64"),
                         keys=8, timing=("seconds", "cpu_seconds"), kill_when="phases"),
    # units: random on dial:0 (no LLM, first), then base-small on it: the kill lands in the LLM unit
    "calibrate": RunnerCase("calibrate", ("--methods", "random,base-small", "--dials", "0,1", "--seeds", "0",
                                          "--rounds", "1", "--llm", "smollm2-135m", "--decision", "json"),
                            keys=4,
                            timing=("timing",)),
    # one unit, the policy, trained in the driver: the kill lands mid-training (before any record),
    # and the resumed run trains again from the start to the same (seeded) policy
    "train-probe": RunnerCase("train-probe", ("--recommender", "dial:1", "--timesteps", "3000", "--n-steps",
                                              "256", "--budget", "10"), keys=1,
                              timing=("seconds", "cpu_seconds"), kill_when="training"),
    # units: the reference box's two controls at three values and its non-profiled check (no LLM)
    "controls": RunnerCase("controls", ("--boxes", "reference-controls", "--users", "6", "--points", "3",
                                        "--seeds", "0"), keys=7, timing=("timing",)),
}
# Why these are slow (more than ~30 s each on a loaded 2-core machine, three runs each):
# promptshift's smallest run generates 10 lists and selects thresholds on validation (~50 s a run);
# evolve's runs every loop phase with the LLM and the encoder (~2 min a run).
SLOW = {"promptshift", "evolve"}


def read_records(path: Path) -> tuple[dict, dict[str, dict], list[str]]:
    """(header, key -> first record, keys in file order); torn lines and repair markers skipped."""
    lines = path.read_text().split("\n")
    header = json.loads(lines[0])
    records: dict[str, dict] = {}
    order: list[str] = []
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # empty tail or a line torn by the kill
            continue
        if row == REPAIR_MARKER:
            continue
        order.append(row["key"])
        records.setdefault(row["key"], row["record"])
    return header, records, order


def _command(case: RunnerCase, out: Path) -> list[str]:
    return [sys.executable, "-m", "ctrlsim.experiments.cli", case.runner, *case.flags, "--out", str(out)]


def _env(cache: Path) -> dict:
    return {**os.environ, "CTRLSIM_THREADS": "1", "CTRLSIM_CACHE": str(cache)}


def _ready_to_kill(case: RunnerCase, out: Path) -> bool:
    if case.kill_when == "training":  # the run folder is open and the training has had a second
        config = out / "config.json"
        if not config.exists():
            return False
        return time.time() - config.stat().st_mtime > 1.0
    if case.kill_when == "phases":  # two loop phases finished (phases.json is written after each)
        phases = out / "phases.json"
        try:
            return len(json.loads(phases.read_text())["phases"]) >= 2
        except (OSError, json.JSONDecodeError, KeyError):
            return False
    records = out / "records.jsonl"
    return records.exists() and len(read_records(records)[1]) >= 1


def _log(tmp: Path, name: str):
    return open(tmp / f"{name}.log", "w")


def _finish(proc: subprocess.Popen, log: Path, timeout: float) -> None:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    assert code == 0, f"exit code {code}:\n{log.read_text()[-3000:]}"


def _comparable(record: dict, timing: tuple[str, ...]) -> dict:
    return {k: v for k, v in record.items() if k not in timing}


def _kill_and_resume(case: RunnerCase, tmp: Path) -> tuple:
    ref_out, out = tmp / "reference", tmp / "interrupted"
    with _log(tmp, "reference") as ref_log:
        reference = subprocess.Popen(_command(case, ref_out), env=_env(tmp / "cache-reference"),
                                     stdout=ref_log, stderr=subprocess.STDOUT)
    try:
        cache = tmp / "cache-interrupted"  # shared by the killed run and its resume, as for a user
        with _log(tmp, "killed") as log:
            killed = subprocess.Popen(_command(case, out), env=_env(cache), stdout=log,
                                      stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not _ready_to_kill(case, out):
            assert killed.poll() is None, \
                f"ended before the kill:\n{(tmp / 'killed.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no record within 10 minutes"
            time.sleep(0.05)
        killed.send_signal(signal.SIGKILL)
        assert killed.wait() == -signal.SIGKILL
        _, partial, _ = read_records(out / "records.jsonl")
        assert len(partial) < case.keys, "the run finished before the kill landed: test inconclusive"
        with _log(tmp, "resumed") as log:
            resumed = subprocess.Popen(_command(case, out), env=_env(cache), stdout=log,
                                       stderr=subprocess.STDOUT)
        _finish(resumed, tmp / "resumed.log", 600)
        _finish(reference, tmp / "reference.log", 600)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()

    ref_header, expected, _ = read_records(ref_out / "records.jsonl")
    header, got, order = read_records(out / "records.jsonl")
    assert header == ref_header
    return expected, got, order, partial


_OUTCOMES: dict[str, tuple | Exception] = {}


def outcome(name: str, tmp_path_factory) -> tuple:
    """(reference records, resumed records, keys in file order, records at the kill), run once per runner."""
    pytest.importorskip("recbole")  # ml-100k comes from the recbole wheel
    if name not in _OUTCOMES:
        try:
            _OUTCOMES[name] = _kill_and_resume(CASES[name], tmp_path_factory.mktemp(f"resume-{name}"))
        except Exception as exc:  # noqa: BLE001 - kept so a second test on this runner does not rerun it
            _OUTCOMES[name] = exc
    if isinstance(_OUTCOMES[name], Exception):
        raise _OUTCOMES[name]
    return _OUTCOMES[name]


def _param(name: str):
    marks = [pytest.mark.slow] if name in SLOW else []
    if "--llm" in CASES[name].flags or "--llms" in CASES[name].flags:
        marks.append(pytest.mark.llm)
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in CASES])
def test_sigkill_then_resume_gives_the_uninterrupted_records(name, tmp_path_factory):
    case = CASES[name]
    expected, got, order, partial = outcome(name, tmp_path_factory)
    assert len(expected) == case.keys
    repeated = sorted({k for k in order if order.count(k) > 1})
    assert not repeated, f"keys written twice: {repeated}"
    assert set(got) == set(expected)
    ignored = case.timing + case.history_dependent
    for key in expected:
        assert set(got[key]) == set(expected[key]), key
        assert _comparable(got[key], ignored) == _comparable(expected[key], ignored), key
    for key in partial:  # what the killed run had finished was kept, not recomputed
        assert got[key] == partial[key]


@pytest.mark.parametrize("name", [_param(n) for n in CASES if CASES[n].history_dependent])
@pytest.mark.xfail(strict=True, reason="runner defect: token counts of a resumed unit include cache replays "
                                       "of work an uninterrupted run did in an earlier unit")
def test_token_counts_do_not_depend_on_the_interruption(name, tmp_path_factory):
    case = CASES[name]
    expected, got, _, _ = outcome(name, tmp_path_factory)
    for key in expected:
        assert _comparable(got[key], case.timing) == _comparable(expected[key], case.timing), key


def test_every_runner_is_covered():
    from ctrlsim.experiments.cli import PROTOCOLS

    assert set(CASES) == set(PROTOCOLS)


@pytest.mark.llm
def test_a_missing_model_file_is_refused_before_any_work_and_the_rerun_runs_everything(tmp_path):
    """A model file that is not there can only fail: the run refuses it up front (exit 2, nothing
    runs, not even the units that need no LLM); once the file is there, the same command runs all."""
    pytest.importorskip("recbole")
    from ctrlsim.backends.bundled import bundled_llm_path

    model = tmp_path / "models" / "probe-llm.gguf"  # not there yet
    case = RunnerCase("ctrlbench", ("--methods", "random,base-small", "--recommenders", "popularity",
                                    "--targets", "War", "--agents", "1,1", "--rounds", "1",
                                    "--seeds", "0", "--llm", str(model)), keys=2, timing=("timing",))
    out, env = tmp_path / "run", _env(tmp_path / "cache")
    first = subprocess.run(_command(case, out), env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 2 and f"no model file or folder at {model}" in first.stderr
    assert not (out / "records.jsonl").exists()  # refused before the run folder was opened
    model.parent.mkdir()
    model.symlink_to(bundled_llm_path("smollm2-135m"))
    second = subprocess.run(_command(case, out), env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    _, records, order = read_records(out / "records.jsonl")
    assert sorted(order) == ["base-small|popularity|War|seed=0", "random|popularity|War|seed=0"]
    assert records["base-small|popularity|War|seed=0"]["llm"]["path"] == str(model)
