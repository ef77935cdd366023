"""Import-time costs a fully cached rerun pays: checked in a fresh interpreter each time.

A test process has already imported nearly everything, so only a subprocess can tell
what importing one module pulls in.
"""
from __future__ import annotations

import json
import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_steering_module_does_not_import_the_envs_or_gymnasium():
    code = ("import sys, json, ctrlsim.agents.steering;"
            "print(json.dumps([m for m in ('gymnasium', 'ctrlsim.envs', 'ctrlsim.agents.llm_probe')"
            " if m in sys.modules]))")
    assert json.loads(_run(code)) == []


def test_agents_public_names_still_import():
    code = ("import json, ctrlsim.agents as a;"
            "from ctrlsim.agents import LLMPopulationPolicy, METHODS, RandomProbe, prompts;"
            "from ctrlsim.agents.llm_probe import LLMPopulationPolicy as direct;"
            "from ctrlsim.agents.methods import METHODS as registry;"
            "print(json.dumps([LLMPopulationPolicy is direct, METHODS is registry, a.METHODS is METHODS,"
            " RandomProbe.__module__, prompts.__name__, sorted(set(a.__all__) - set(dir(a)))]))")
    assert json.loads(_run(code)) == [True, True, True, "ctrlsim.agents.random_probe",
                                      "ctrlsim.agents.prompts", []]


def test_unknown_agents_attribute_is_an_attribute_error():
    code = ("import ctrlsim.agents as a\n"
            "try:\n    a.NoSuchPolicy\nexcept AttributeError as e:\n    print('AttributeError', e)\n")
    assert _run(code) == "AttributeError module 'ctrlsim.agents' has no attribute 'NoSuchPolicy'"
