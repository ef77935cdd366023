"""A run lends its HTTP boxes the exchange log and the replay through `ctrlsim.run_settings`, not
through environment variables: the settings travel with each unit, and nothing outside a run (an
environment variable left behind, another run in the same process) can switch a box into replay."""
import functools
import pickle
import subprocess
import sys
import threading
from pathlib import Path

from ctrlsim.backends.http_deadline import RequestScope, concurrent_map
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.driver import exchange_settings
from ctrlsim.run_settings import (
    ExchangeSettings,
    current_exchange_settings,
    unit_with_exchange_settings,
    using_exchange_settings,
)


def seen_settings(payload, key):
    return {"key": key, "log": current_exchange_settings().log, "replay": current_exchange_settings().replay}


def test_a_run_names_its_own_log_and_the_replayed_one(tmp_path):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "exchanges.jsonl").write_text("")
    settings = exchange_settings(tmp_path / "run", RunOptions(replay=str(recorded)))
    assert settings == ExchangeSettings(log=str((tmp_path / "run" / "exchanges.jsonl").resolve()),
                                        replay=str((recorded / "exchanges.jsonl").resolve()))
    assert exchange_settings(tmp_path / "run", RunOptions()).replay is None


def test_the_settings_travel_with_the_unit_and_end_with_it(tmp_path):
    settings = ExchangeSettings(log=str(tmp_path / "a.jsonl"), replay=str(tmp_path / "b.jsonl"))
    unit = functools.partial(unit_with_exchange_settings, settings, seen_settings)
    shipped = pickle.loads(pickle.dumps(unit))  # as a Ray task would carry it
    assert shipped(None, "u1") == {"key": "u1", "log": settings.log, "replay": settings.replay}
    assert current_exchange_settings() == ExchangeSettings()  # outside the unit: nothing


def test_request_threads_see_the_callers_settings(tmp_path):
    settings = ExchangeSettings(log=str(tmp_path / "x.jsonl"))
    threads = set()

    def log_path(_):
        threads.add(threading.get_ident())
        return current_exchange_settings().log

    with using_exchange_settings(settings):
        seen = concurrent_map(log_path, list(range(8)), 4, RequestScope())
    assert seen == [settings.log] * 8 and threading.get_ident() not in threads


def test_no_environment_variable_switches_a_box_into_replay():
    """The driver's settings are not in the environment, and the old variables are read by nothing."""
    code = ("import os, sys\n"
            "os.environ['CTRLSIM_REPLAY'] = '/nonexistent/exchanges.jsonl'\n"
            "from ctrlsim.run_settings import current_exchange_settings\n"
            "print(current_exchange_settings().replay)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "None"
    source = "\n".join(p.read_text(encoding="utf-8") for p in Path(__file__).resolve().parents[2]
                       .joinpath("ctrlsim").rglob("*.py"))
    assert "CTRLSIM_REPLAY" not in source and "CTRLSIM_EXCHANGES" not in source


def test_exchange_settings_import_neither_the_http_contract_nor_pydantic():
    code = ("import sys\n"
            "from ctrlsim.experiments.driver import exchange_settings\n"
            "names = ('pydantic', 'ctrlsim.recommenders.http.contract')\n"
            "print(sorted(m for m in names if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
