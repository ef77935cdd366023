"""The unit-of-work contract on the local executor, and the typed errors of `make_executor`."""
from __future__ import annotations

import socket
import sys

import pytest

from ctrlsim.errors import ConfigError, MissingDependencyError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.executor import (
    LocalExecutor,
    cached_names,
    executor_from_options,
    failure_record,
    is_failure,
    make_executor,
    run_unit,
    worker_cache,
)


def cube_or_fail(config, key):
    if key.startswith("bad"):
        raise ValueError(f"cannot cube {key!r}")
    return {"cube": int(key) ** 3 + config["offset"]}


def counting_unit(config, key):
    counter = worker_cache(f"counter:{config['tag']}", lambda: {"built": 0, "uses": 0})
    counter["uses"] += 1
    return {"uses": counter["uses"]}


def not_a_record(config, key):
    return [key]


def test_local_run_calls_on_record_once_per_key_and_records_failures():
    seen = []
    with make_executor("local") as executor:
        summary = executor.run(cube_or_fail, {"offset": 1}, ["2", "bad-1", "3"],
                               lambda k, r: seen.append((k, r)), progress=False)
    failure = {"failed": True, "error": "ValueError: cannot cube 'bad-1'"}
    assert seen == [("2", {"cube": 9}), ("bad-1", failure), ("3", {"cube": 28})]
    assert (summary.units, summary.failed, summary.succeeded) == (3, 1, 2)


def test_worker_cache_builds_once_per_process():
    builds = []

    def factory():
        builds.append(1)
        return {"uses": 0}

    first = worker_cache("test-local-cache", factory)
    second = worker_cache("test-local-cache", factory)
    assert first is second and len(builds) == 1
    assert "test-local-cache" in cached_names()
    records = {}
    LocalExecutor().run(counting_unit, {"tag": "local"}, ["a", "b", "c"], records.__setitem__, progress=False)
    assert [records[k]["uses"] for k in "abc"] == [1, 2, 3]  # one object reused by the three units


def test_worker_cache_rejects_empty_name():
    with pytest.raises(ConfigError, match="non-empty"):
        worker_cache("", dict)


def test_failure_record_shape_and_non_dict_record():
    assert failure_record(KeyError("x")) == {"failed": True, "error": "KeyError: 'x'"}
    assert is_failure({"failed": True, "error": "E: m"}) and not is_failure({"failed": False, "value": 1})
    record = run_unit(not_a_record, None, "k")
    assert record["failed"] and record["error"].startswith("TypeError: unit 'k'")


@pytest.mark.parametrize("kind, address, options, message", [
    ("spark", None, {}, "executor must be one of local, ray; got 'spark'"),
    ("local", "auto", {}, "needs the ray executor"),
    ("local", None, {"num_workers": 2}, "takes no options; got num_workers"),
    ("ray", "my-cluster", {}, "ray_address must be"),
    ("ray", "host:port", {}, "ray_address must be"),
])
def test_make_executor_rejects_bad_arguments(kind, address, options, message):
    with pytest.raises(ConfigError, match=message):
        make_executor(kind, address, **options)


def test_repeated_keys_are_an_error():
    with pytest.raises(ConfigError, match="repeated: '1'"):
        LocalExecutor().run(cube_or_fail, {"offset": 0}, ["1", "2", "1"], lambda k, r: None, progress=False)


def test_missing_ray_is_a_typed_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(MissingDependencyError) as info:
        make_executor("ray")
    assert info.value.extra == "ray" and 'pip install "ctrlsim[ray]"' in str(info.value)


def test_run_options_choose_the_executor():
    assert isinstance(executor_from_options(RunOptions()), LocalExecutor)
    with pytest.raises(ConfigError):
        RunOptions(executor="local", ray_address="auto")


def test_importing_the_executors_does_not_import_ray_or_openai():
    import subprocess

    code = ("import sys, ctrlsim.experiments.executor, ctrlsim.backends.openai_compat; "
            "print(sorted(m for m in ('ray', 'openai') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_unreachable_cluster_head_fails_fast_with_a_typed_error():
    import subprocess

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("from ctrlsim.experiments.executor import make_executor\n"
            "from ctrlsim.errors import ExecutorError\n"
            f"try:\n    make_executor('ray', '127.0.0.1:{port}')\n"
            "except ExecutorError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    message = done.stdout.strip()
    assert f"no Ray cluster head answers at '127.0.0.1:{port}'" in message and "ray start --head" in message
    # Refused by the socket check before ray.init, which would retry the connection for minutes.
    assert "Connection refused" in message
