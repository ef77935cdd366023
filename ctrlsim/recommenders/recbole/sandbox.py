"""Importing and running RecBole without its process-wide side effects, on numpy 1 or 2.

RecBole 1.2.1 changes global state: `Config` reads `--key=value` flags from
`sys.argv` and assigns numpy 1 aliases into the numpy module, training writes
`log_tensorboard/` and `saved/` into the working directory and reseeds every
global RNG, and importing `recbole.model.sequential_recommender` (its `sine.py`)
turns on autograd anomaly detection for the whole process. The helpers here
provide what RecBole needs and undo the rest.

numpy 2 compatibility (this module is the only place it lives): RecBole's
`Config.compatibility_settings` reads `np.float_`, `np.complex_` and
`np.unicode_`, which numpy 2 removed, and then assigns `np.float`, `np.int`,
`np.bool`, ... that the rest of RecBole (metrics, data) reads while it runs.
`numpy_aliases` supplies the three removed names, only where numpy lacks them,
for as long as RecBole runs (import, training, model lookup), and afterwards
restores numpy's namespace exactly: every name RecBole touched is put back to
the object it was, or removed. Outside these blocks numpy is unchanged, so the
caller's code sees the numpy it installed. Scoring a loaded model needs no
alias (plain tensors into `full_sort_predict`). Not covered: `recbole.quick_start`
and hyper-parameter tuning, which import Ray and which ctrlsim never imports.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import numpy as np

from ctrlsim.backends._torch import import_torch as _import_torch_for
from ctrlsim.backends._torch import torch_threads
from ctrlsim.data.registry import recbole_missing
from ctrlsim.errors import MissingDependencyError

PURPOSE = "RecBole sequential recommenders"

# Removed in numpy 2, read by RecBole 1.2.1's Config.compatibility_settings: alias -> numpy's own name.
_NUMPY_ALIASES = {"float_": "float64", "complex_": "complex128", "unicode_": "str_"}
# What RecBole's Config.compatibility_settings assigns into the numpy module.
_NUMPY_TOUCHED = ("bool", "int", "float", "complex", "object", "str", "long", "unicode", *_NUMPY_ALIASES)


def import_torch():
    """torch, or `MissingDependencyError` naming the `recbole` extra."""
    return _import_torch_for("recbole", PURPOSE)


def import_recbole() -> SimpleNamespace:
    """The parts of RecBole ctrlsim uses, imported without changing global state."""
    torch = import_torch()
    first_import = "recbole.model.sequential_recommender" not in sys.modules
    anomaly_before = torch.is_anomaly_enabled()
    try:
        # Some of RecBole's imports reseed the global RNGs; importing must not change them.
        with numpy_aliases(), preserved_rngs():
            import recbole
            import recbole.model.sequential_recommender as seq_models
            from recbole.config import Config
            from recbole.data import create_dataset, data_preparation
            from recbole.data.interaction import Interaction
            from recbole.model.abstract_recommender import SequentialRecommender as SeqBase
            from recbole.utils import ModelType, get_model, get_trainer, init_seed
    except ImportError as exc:
        missing = str(getattr(exc, "name", None) or "recbole").split(".")[0]
        if missing == "recbole":
            raise recbole_missing(PURPOSE) from exc
        raise MissingDependencyError(missing, "recbole", PURPOSE) from exc
    finally:
        # recbole/model/sequential_recommender/sine.py calls set_detect_anomaly(True) at import.
        if first_import:
            torch.autograd.set_detect_anomaly(anomaly_before)
    return SimpleNamespace(
        torch=torch, recbole=recbole, seq_models=seq_models, Config=Config, create_dataset=create_dataset,
        data_preparation=data_preparation, Interaction=Interaction, SeqBase=SeqBase, ModelType=ModelType,
        get_model=get_model, get_trainer=get_trainer, init_seed=init_seed,
    )


@contextlib.contextmanager
def numpy_aliases() -> Iterator[None]:
    """Provide the numpy 1 aliases RecBole reads (numpy 2 lacks them); restore numpy's namespace on exit.

    On numpy 1.x nothing is added (the aliases exist); on either version every name that
    RecBole's `Config` assigns is restored to its previous object, or removed, on exit.
    """
    before = {name: np.__dict__[name] for name in _NUMPY_TOUCHED if name in np.__dict__}
    for alias, target in _NUMPY_ALIASES.items():
        if alias not in np.__dict__:
            setattr(np, alias, getattr(np, target))
    try:
        yield
    finally:
        for name in _NUMPY_TOUCHED:
            if name in before:
                setattr(np, name, before[name])
            elif name in np.__dict__:
                delattr(np, name)


@contextlib.contextmanager
def preserved_rngs() -> Iterator[None]:
    """Restore Python's, numpy's and torch's (CPU) global RNG states on exit."""
    torch = import_torch()
    py_rng, np_rng = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(py_rng)
        np.random.set_state(np_rng)


@contextlib.contextmanager
def recbole_sandbox(workdir: Path, threads: int) -> Iterator[None]:
    """Run RecBole in `workdir` with `threads` torch threads; undo its global changes on exit.

    Restored: working directory, `sys.argv`, `CUDA_VISIBLE_DEVICES`, cuDNN flags,
    the root logger's level and handlers, RNG states, torch's thread count,
    anomaly detection, numpy's namespace and the warning filters.
    """
    torch = import_torch()
    cwd = os.getcwd()
    argv = sys.argv
    cuda_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    cudnn = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    root = logging.getLogger()
    root_state = (root.level, list(root.handlers))
    with contextlib.ExitStack() as stack:
        stack.enter_context(preserved_rngs())
        stack.enter_context(torch.autograd.set_detect_anomaly(False))
        stack.enter_context(torch_threads(threads))
        stack.enter_context(numpy_aliases())
        # RecBole 1.2.1 on current pandas/torch warns about its own deprecated calls; not actionable here.
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"recbole(\.|$)")
        # numpy 2: RecBole's Interaction.sort calls np.argsort on a torch tensor, whose __array_wrap__
        # lacks numpy 2's arguments; numpy falls back (same result) and warns (docs/recbole.md).
        warnings.filterwarnings("ignore", category=DeprecationWarning,
                                message=r"__array_wrap__ must accept context and return_scalar")
        try:
            os.chdir(workdir)
            sys.argv = ["ctrlsim"]  # Config would read --key=value flags from the command line
            yield
        finally:
            os.chdir(cwd)
            sys.argv = argv
            if cuda_env is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = cuda_env
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn
            root.setLevel(root_state[0])
            root.handlers[:] = root_state[1]
