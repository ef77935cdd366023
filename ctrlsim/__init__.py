"""ctrlsim: measure how controllable recommender systems are.

Importing this package is cheap: heavy dependencies (torch, recbole, LLM
runtimes) load only when a component that needs them is first used.

`ctrlsim.run(protocol, out=..., **config_fields)` runs any protocol (probe, ctrlbench, evolve,
steereval, promptshift) from Python with the CLI's resume and failure policy.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["run", "RunResult", "RunFailedError"]


def __getattr__(name: str) -> Any:
    # PEP 562: the driver (and what it imports) loads on first use, not with the package.
    if name in __all__:
        from ctrlsim.experiments import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'ctrlsim' has no attribute {name!r}")
