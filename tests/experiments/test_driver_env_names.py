"""The driver names the HTTP boxes' environment variables itself, so a run imports no pydantic for them."""
import subprocess
import sys


def test_the_driver_names_the_variables_the_http_boxes_read():
    from ctrlsim.experiments import driver
    from ctrlsim.recommenders.http import contract as http_contract

    assert driver.EXCHANGES_ENV == http_contract.EXCHANGES_ENV
    assert driver.REPLAY_ENV == http_contract.REPLAY_ENV


def test_exchange_settings_import_neither_the_http_contract_nor_pydantic(tmp_path):
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ctrlsim.experiments.config import RunOptions\n"
        "from ctrlsim.experiments.driver import exchange_settings\n"
        f"with exchange_settings(Path({str(tmp_path)!r}), RunOptions()):\n"
        "    import os; assert os.environ['CTRLSIM_EXCHANGES'].endswith('exchanges.jsonl')\n"
        "print(sorted(m for m in ('pydantic', 'ctrlsim.recommenders.http.contract') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
