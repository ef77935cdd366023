"""The Ray executor on a local two-CPU Ray cluster: same records as local, retries, failures, caching."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import ctrlsim
from ctrlsim.errors import MissingDependencyError
from ctrlsim.experiments.executor import LocalExecutor, is_failure, make_executor, worker_cache
from ctrlsim.seeding import derive_rng

try:
    from ctrlsim.experiments._ray_executor import import_ray

    ray = import_ray()
except MissingDependencyError as exc:
    pytest.skip(str(exc), allow_module_level=True)


@pytest.fixture(scope="module")
def ray_cluster():
    # Unit functions of this test module are not importable on Ray workers (pytest puts tests/
    # on the driver's sys.path only), so they travel by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def popularity_unit(config, key):
    """A real black box on real data: a seeded random history, the popularity box's slate."""
    from ctrlsim.data import load_dataset
    from ctrlsim.recommenders import UserState, make_recommender

    box = worker_cache("popularity:ml-100k", lambda: make_recommender("popularity", load_dataset("ml-100k")))
    if key == "user/unknown":
        raise LookupError("no such user")
    rng = derive_rng(config["seed"], key)
    history = tuple(rng.choice(box.dataset.item_ids, size=config["history"], replace=False).tolist())
    slate = box.recommend([UserState(history=history)], config["k"])[0]
    return {"history": list(history), "slate": list(slate.item_ids),
            "scores": np.round(slate.scores, 12).tolist(), "noise": float(rng.random())}


def counting_unit(config, key):
    counter = worker_cache(f"counter:{config['tag']}", lambda: {"uses": 0})
    counter["uses"] += 1
    time.sleep(0.05)
    return {"pid": os.getpid(), "uses": counter["uses"]}


def victim_unit(config, key):
    """Sleeps on its first attempt at the victim key, so the test can kill its worker there."""
    folder = Path(config["folder"])
    attempts = folder / f"{key}.attempts"
    with open(attempts, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    if key == config["victim"] and len(attempts.read_text().split()) == 1:
        (folder / "victim.pid").write_text(str(os.getpid()))
        time.sleep(120)
    return {"square": int(key) ** 2}


def self_crashing_unit(config, key):
    if key == "crash":
        os._exit(3)  # the worker process dies, every time
    return {"key": key}


def collect(executor, unit_fn, config, keys):
    calls = []
    summary = executor.run(unit_fn, config, keys, lambda k, r: calls.append((k, r)), progress=False)
    return calls, summary


def test_ray_gives_the_same_records_as_local(ray_cluster, ml100k):
    config = {"seed": 7, "history": 5, "k": 10}
    keys = [f"user/{i}" for i in range(12)] + ["user/unknown"]
    local_calls, _ = collect(LocalExecutor(), popularity_unit, config, keys)
    with make_executor("ray", num_workers=2) as executor:
        ray_calls, summary = collect(executor, popularity_unit, config, keys)
    assert sorted(k for k, _ in ray_calls) == sorted(keys)  # each key once
    assert dict(ray_calls) == dict(local_calls)
    assert dict(ray_calls)["user/unknown"] == {"failed": True, "error": "LookupError: no such user"}
    assert summary.failed == 1 and summary.units == len(keys)
    # Popular items the history holds are excluded: the slate never repeats the history.
    for key, record in local_calls[:-1]:
        assert not set(record["slate"]) & set(record["history"]), key


def test_ray_workers_load_each_object_once(ray_cluster):
    with make_executor("ray") as executor:
        calls, _ = collect(executor, counting_unit, {"tag": uuid.uuid4().hex}, [str(i) for i in range(16)])
    uses_by_pid: dict[int, list[int]] = {}
    for _, record in calls:
        uses_by_pid.setdefault(record["pid"], []).append(record["uses"])
    # Each worker process counted its own units 1, 2, ..., n: its factory ran once, not once per unit.
    for uses in uses_by_pid.values():
        assert sorted(uses) == list(range(1, len(uses) + 1))
    assert max(len(u) for u in uses_by_pid.values()) > 1


def test_killed_worker_is_retried_and_nothing_is_lost_or_repeated(ray_cluster, tmp_path):
    config = {"folder": str(tmp_path), "victim": "3"}
    killed = []

    def kill_victim_when_it_starts():
        pid_file = tmp_path / "victim.pid"
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_file.exists():
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_victim_when_it_starts, daemon=True)
    killer.start()
    keys = [str(i) for i in range(8)]
    with make_executor("ray", max_retries=2) as executor:
        calls, summary = collect(executor, victim_unit, config, keys)
    killer.join(timeout=5)
    assert killed, "the victim unit never started"
    assert Counter(k for k, _ in calls) == Counter(keys)  # every key recorded exactly once
    assert dict(calls) == {k: {"square": int(k) ** 2} for k in keys} and summary.failed == 0
    victim_attempts = (tmp_path / "3.attempts").read_text().split()
    assert len(victim_attempts) == 2 and int(victim_attempts[0]) == killed[0] != int(victim_attempts[1])


def test_worker_that_always_dies_is_recorded_as_failed_after_its_retries(ray_cluster):
    with make_executor("ray", max_retries=1) as executor:
        calls, summary = collect(executor, self_crashing_unit, None, ["a", "crash", "b"])
    records = dict(calls)
    assert records["a"] == {"key": "a"} and records["b"] == {"key": "b"}
    assert is_failure(records["crash"]) and records["crash"]["error"].startswith("WorkerCrashedError")
    assert summary.failed == 1


@pytest.mark.slow  # about 30 s on 2 busy cores (the ceiling's beam search runs twice)
def test_probe_runner_gives_the_same_records_with_both_executors(ray_cluster, tmp_path, ml100k):
    from ctrlsim.experiments.config import RunOptions
    from ctrlsim.experiments.probe.config import ProbeRunConfig
    config = ProbeRunConfig(recommender="popularity", agents=4, rounds=5, target="War", ceiling_states=20)
    local = ctrlsim.run("probe", config=config, options=RunOptions(out=str(tmp_path / "local")),
                        show_progress=False).records_by_key
    on_ray = ctrlsim.run("probe", config=config,
                         options=RunOptions(out=str(tmp_path / "ray"), executor="ray"),
                         show_progress=False).records_by_key

    def without_timing(records):
        return {key: {k: v for k, v in record.items() if k != "seconds"} for key, record in records.items()}

    assert set(local) == {"episode", "ceiling"}
    assert without_timing(on_ray) == without_timing(local)
    assert ray.is_initialized()  # the executor reused the test's cluster and left it running


def test_calibration_gives_the_same_records_with_both_executors(ray_cluster, tmp_path, monkeypatch):
    """Dial boxes on Ray workers: the ctrlbench and SteerEval calibrations' observations match local."""
    from ctrlsim.experiments.calibrate.config import CalibrateConfig
    from ctrlsim.experiments.config import RunOptions

    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    for protocol, extra in (("ctrlbench", {}), ("steereval", {"tags": ("Comedy",), "users": 1})):
        config = CalibrateConfig(protocol=protocol, dials=(0.0, 1.0), seeds=(0,), **extra)
        local = ctrlsim.run("calibrate", config=config,
                            options=RunOptions(out=str(tmp_path / f"{protocol}-local"), figures=False),
                            show_progress=False, raise_on_failure=False)
        on_ray = ctrlsim.run("calibrate", config=config,
                             options=RunOptions(out=str(tmp_path / f"{protocol}-ray"), executor="ray",
                                                figures=False), show_progress=False, raise_on_failure=False)
        assert not local.failed and not on_ray.failed
        strip = {key: {k: v for k, v in r.items() if k != "timing"}
                 for key, r in local.records_by_key.items()}
        assert {key: {k: v for k, v in r.items() if k != "timing"}
                for key, r in on_ray.records_by_key.items()} == strip


def test_a_run_started_locally_resumes_on_ray_without_recomputing(ray_cluster, tmp_path, ml100k):
    import json

    from ctrlsim.experiments.config import RunOptions
    from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig

    config = CtrlBenchConfig(methods=("random",), recommenders=("popularity",), targets=("War",), rounds=3,
                             seeds=(0, 1, 2))
    full = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "full")),
                       show_progress=False, raise_on_failure=False).records_by_key
    resumed_out = tmp_path / "resumed"
    first = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(resumed_out)),
                        show_progress=False, max_units=1, raise_on_failure=False)
    assert len(first.records_by_key) == 1
    resumed = ctrlsim.run("ctrlbench", config=config,
                          options=RunOptions(out=str(resumed_out), executor="ray"), show_progress=False,
                          raise_on_failure=False)

    def without_timing(records):
        return {key: {k: v for k, v in record.items() if k != "timing"} for key, record in records.items()}

    assert without_timing(resumed.records_by_key) == without_timing(full) and len(full) == 3
    lines = (resumed_out / "records.jsonl").read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines if '"key"' in line]
    assert sorted(keys) == sorted(full) and keys[0] == next(iter(first.records_by_key))  # nothing recomputed


def environment_unit(config, key):
    """What a worker sees of the driver's settings."""
    from ctrlsim.backends.bundled import cache_dir

    return {"CTRLSIM_CACHE": os.environ.get("CTRLSIM_CACHE"), "cache_dir": str(cache_dir())}


def test_workers_use_the_drivers_cache_folder_resolved_on_the_driver(ray_cluster, tmp_path, monkeypatch):
    """A relative $CTRLSIM_CACHE is the driver's folder, made absolute before it travels: a worker
    started elsewhere resolves nothing against its own working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CTRLSIM_CACHE", "relative-cache")
    records: dict[str, dict] = {}
    with make_executor("ray") as executor:
        executor.run(environment_unit, {}, ["a", "b"], records.__setitem__, progress=False)
    expected = str(tmp_path / "relative-cache")
    assert {r["CTRLSIM_CACHE"] for r in records.values()} == {expected}
    assert {r["cache_dir"] for r in records.values()} == {expected}
