"""The shared config system: flags generated from dataclasses, validation before work."""
from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field

import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    RunOptions,
    add_config_arguments,
    check_choices,
    check_fields,
    check_output_dir,
    check_range,
    config_from_args,
    config_from_dict,
    config_to_dict,
    option,
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


# ----------------------------------------------------------------------------- declared constraints

@dataclass(frozen=True)
class Declared:
    users: int = option(8, "users per slice", low=1, high=100)
    share: float = option(0.5, "a share", low=0.0, high=1.0)
    seeds: tuple[int, ...] = option((0, 1), "seeds", low=0, high=10, nonempty=True)
    kinds: tuple[str, ...] = option(("a",), "kinds", choices=("a", "b"), nonempty=True)
    mode: str = option("x", "mode", choices=("x", "y"))
    slate: int | None = option(None, "open until the run resolves it", low=1, high=50)

    def __post_init__(self):
        check_fields(self)


@pytest.mark.parametrize("kwargs, message", [
    ({"users": 0}, "users must be in [1, 100], got 0"),
    ({"users": 101}, "users must be in [1, 100], got 101"),
    ({"users": 2.0}, "users must be an integer, got 2.0"),
    ({"users": True}, "users must be an integer, got True"),
    ({"share": 1.5}, "share must be in [0.0, 1.0], got 1.5"),
    ({"seeds": (0, 11)}, "seeds must be in [0, 10], got 11"),
    ({"seeds": ()}, "seeds needs at least one value"),
    ({"kinds": ("a", "c")}, "kinds: unknown value(s) 'c'"),
    ({"kinds": ("a", "a")}, "kinds: value(s) given more than once: 'a'"),
    ({"kinds": ()}, "kinds needs at least one value"),
    ({"mode": "z"}, "mode must be one of x, y; got 'z'"),
    ({"slate": 0}, "slate must be in [1, 50], got 0"),
])
def test_declared_constraints_are_enforced_with_the_fields_name(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Declared(**kwargs)


def test_declared_constraints_allow_what_they_declare():
    assert Declared(users=100, share=0.0, seeds=(10,), kinds=("b", "a"), slate=None).users == 100
    assert Declared(slate=50).slate == 50


def test_the_help_names_each_bound_and_choice_once_from_the_declaration():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Declared)
    text = " ".join(parser.format_help().split())
    assert "users per slice (at most 100) [default: 8]" in text
    assert "a share (in [0.0, 1.0])" in text
    assert "mode (one of: x, y)" in text and "kinds (one of: a, b)" in text


def test_every_protocol_config_declares_its_bounds_on_its_fields():
    """No protocol config writes a bound into its help by hand: each bounded count is declared on
    the field (`option`), so the check and the help come from one place."""
    from ctrlsim.experiments import runner as runners

    for name in runners.RUNNER_MODULES:
        cls = runners.get_runner(name).config_cls
        if cls.__module__.startswith("ctrlsim.agents"):
            continue  # train-probe's config lives with its trainer (agents/rl.py)
        for f in dataclasses.fields(cls):
            assert "at most" not in f.metadata.get("help", ""), (name, f.name)
        declared = [f.name for f in dataclasses.fields(cls) if "high" in f.metadata or "low" in f.metadata]
        assert declared, name
