"""The shared config system: flags generated from dataclasses, validation before work."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    RunOptions,
    add_config_arguments,
    check_choices,
    check_output_dir,
    check_range,
    config_from_args,
    config_from_dict,
    config_to_dict,
)


@dataclass(frozen=True)
class ToyConfig:
    users: int = field(default=8, metadata={"help": "users per slice"})
    rate: float = 0.5
    conditions: tuple[str, ...] = ("default", "oracle")
    label: str | None = None
    verbose: bool = False

    def __post_init__(self):
        check_range("users", self.users, low=1)
        check_choices("conditions", self.conditions, ["default", "oracle", "random"])


def parse(argv, cls=ToyConfig):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, cls)
    return config_from_args(cls, parser.parse_args(argv))


def test_cli_defaults_are_the_dataclass_defaults():
    assert parse([]) == ToyConfig()


def test_flags_parse_every_field_type():
    cfg = parse(["--users", "3", "--rate", "0.25", "--conditions", "oracle,random", "--label", "x",
                 "--verbose"])
    assert cfg == ToyConfig(users=3, rate=0.25, conditions=("oracle", "random"), label="x", verbose=True)
    assert parse(["--verbose", "false"]).verbose is False


def test_help_shows_the_default_and_text():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ToyConfig)
    text = parser.format_help()
    assert "users per slice [default: 8]" in text
    assert "[default: default,oracle]" in text


@pytest.mark.parametrize("argv, names", [
    (["--users", "0"], "users must be in [1, inf], got 0"),
    (["--users", "-1"], "got -1"),
    (["--conditions", "bogus"], "'bogus'"),
    (["--conditions", "default,default"], "more than once: 'default'"),
])
def test_bad_values_are_config_errors_naming_the_value(argv, names):
    with pytest.raises(ConfigError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse(argv)


def test_wrong_type_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        parse(["--users", "many"])
    assert "expected int, got 'many'" in capsys.readouterr().err


def test_round_trip_through_json():
    cfg = ToyConfig(users=2, conditions=("random",))
    data = config_to_dict(cfg)
    assert data == {"users": 2, "rate": 0.5, "conditions": ["random"], "label": None, "verbose": False}
    assert config_from_dict(ToyConfig, data) == cfg
    with pytest.raises(ConfigError, match="unknown field.*typo"):
        config_from_dict(ToyConfig, {**data, "typo": 1})


def test_output_location_checked_before_work(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_output_dir(a_file / "run")
    check_output_dir(tmp_path / "new" / "run")  # creatable: fine
    with pytest.raises(ConfigError, match="needs --executor ray"):
        RunOptions(ray_address="auto")
    with pytest.raises(ConfigError, match="executor must be one of local, ray; got 'spark'"):
        RunOptions(executor="spark")


def test_run_options_figures_flag():
    """Figures are on by default; `--figures false` turns them off without touching the config."""
    assert parse([], RunOptions).figures is True
    assert parse(["--figures", "false"], RunOptions).figures is False
    assert parse(["--figures"], RunOptions).figures is True


def test_a_field_added_later_is_left_out_of_stored_configs_while_it_holds_its_default():
    from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig
    from ctrlsim.experiments.evolve.config import EvolveConfig

    stored = config_to_dict(CtrlBenchConfig())
    assert "conversation" not in stored  # a folder written before the field resumes as before
    assert config_from_dict(CtrlBenchConfig, stored).conversation == "memory"
    appended = config_to_dict(CtrlBenchConfig(conversation="append", decision="json"))
    assert appended["conversation"] == "append"  # a non-default value is recorded
    assert config_from_dict(CtrlBenchConfig, appended) == CtrlBenchConfig(conversation="append",
                                                                          decision="json")
    evolve = config_to_dict(EvolveConfig(eval_conversation="append", decision="json"))
    assert evolve["eval_conversation"] == "append" and "conversation" not in evolve
    with pytest.raises(ConfigError, match="conversation"):
        CtrlBenchConfig(conversation="summary")
