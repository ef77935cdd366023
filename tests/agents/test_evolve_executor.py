"""`ctrlsim evolve --executor ray` is refused before anything loads."""

import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.experiments import evolve


def test_ray_executor_is_a_config_error_before_any_model_loads(tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model or dataset was loaded before the executor was checked")

    monkeypatch.setattr("ctrlsim.backends.load_llm", no_loading)
    monkeypatch.setattr("ctrlsim.data.load_dataset", no_loading)
    with pytest.raises(ConfigError, match="--executor ray is not supported yet"):
        evolve.main(["--executor", "ray", "--out", str(tmp_path / "run"), "--agents", "4"])
    assert not (tmp_path / "run").exists()
