"""Reading a saved policy (`policy.zip`) without running anything in it.

Stable-Baselines3 saves a model as a zip: `policy.pth` (the network's tensors), `data` (JSON, where
every attribute JSON cannot hold, such as the spaces, the policy class and the schedules, is a base64
cloudpickle under `:serialized:`) and optimiser state. Its loader (`PPO.load`) unpickles every
`:serialized:` entry, and unpickling runs whatever the pickle names: a planted entry runs a shell
command the moment the zip is loaded. So ctrlsim never calls that loader and never unpickles:

- the weights come from `policy.pth` through `torch.load(weights_only=True)` (tensors and plain
  containers only), and must be finite and fit the network;
- the network is rebuilt from what ctrlsim itself wrote in `policy.json`: the observation space from
  the feature settings, the action space from the slate size and search menu, the layers and
  activation from its `policy` entry (Stable-Baselines3's defaults where an older file has none);
- `data` is not needed, but it is audited (`audit_policy_zip`): each `:serialized:` entry is read as
  pickle opcodes, never executed, and every global it would import must be one Stable-Baselines3
  itself writes there (`SB3_GLOBALS`: gymnasium spaces, numpy arrays and generators, its policy,
  buffer and schedule classes). Anything else (`os.system`, `builtins.exec`, a cloudpickled
  function's bytecode) is an `UnsafeArtefactError` naming the file and the entry: the file carries
  code, so it is not what `ctrlsim train-probe` wrote, and nothing of it is used.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import pickletools
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from ctrlsim.errors import DataFileError, UnsafeArtefactError

WEIGHTS, DATA = "policy.pth", "data"
MAX_MEMBER_BYTES = 1 << 30  # a member declaring more is refused before it is read (a zip bomb)

# Every global a `:serialized:` entry of Stable-Baselines3 2.x's `data` imports for an on-policy
# MlpPolicy model (PPO, A2C): exact names, never whole modules (numpy.load or SB3's own json_to_data
# would reach any code). numpy 1.x and 2.x name their array helpers under `core` and `_core`.
SB3_GLOBALS = frozenset({
    ("stable_baselines3.common.policies", "ActorCriticPolicy"),
    ("stable_baselines3.common.buffers", "RolloutBuffer"),
    ("stable_baselines3.common.utils", "FloatSchedule"),
    ("stable_baselines3.common.utils", "ConstantSchedule"),
    ("stable_baselines3.common.utils", "LinearSchedule"),
    ("torch.optim.rmsprop", "RMSprop"),  # A2C's optimiser, in its policy_kwargs
    ("torch.optim.adam", "Adam"),
    ("collections", "deque"),
    ("gymnasium.spaces.box", "Box"),
    ("gymnasium.spaces.multi_binary", "MultiBinary"),
    ("gymnasium.spaces.multi_discrete", "MultiDiscrete"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    *((f"numpy.{core}.{module}", name) for core in ("core", "_core")
      for module, name in (("numeric", "_frombuffer"), ("multiarray", "_reconstruct"),
                           ("multiarray", "scalar"))),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random._mt19937", "MT19937"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("numpy.random.bit_generator", "SeedSequence"),
})
# The layers' activation, by the name `policy.json` records (a name, never an import path).
ACTIVATIONS = ("Tanh", "ReLU", "ELU", "LeakyReLU", "GELU", "SiLU")

_STRINGS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
            "BINUNICODE8"}
_PUTS, _GETS = {"PUT", "BINPUT", "LONG_BINPUT"}, {"GET", "BINGET", "LONG_BINGET"}
_UNCHANGED = {"PROTO", "FRAME", "STOP"}  # opcodes that leave the stack as it is (with the memo stores)
_REFUSED = {"PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4"}  # reach objects by routes not audited here


def pickle_imports(raw: bytes) -> Iterator[tuple[str, str]]:
    """The (module, name) globals a pickle would import, read from its opcodes without running it.

    A model of the stack follows only strings (pushed, memoised, fetched back); every other opcode
    puts an unknown on top. So the two strings a STACK_GLOBAL takes are known only when the last two
    pushes were those very strings, as they are in what pickle itself writes; an import whose names
    this reading cannot follow raises ValueError (refused, never guessed)."""
    stack: list[str | None] = []
    memo: dict[int, str | None] = {}
    for opcode, arg, _ in pickletools.genops(raw):
        name = opcode.name
        if name in _REFUSED:
            raise ValueError(f"it uses the {name} opcode")
        if name in _STRINGS:
            stack.append(arg if isinstance(arg, str) else None)
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
        elif name in _PUTS:
            memo[int(arg)] = stack[-1] if stack else None
        elif name in _GETS:
            stack.append(memo.get(int(arg)))
        elif name in ("GLOBAL", "INST"):
            module, _, attribute = str(arg).partition(" ")
            yield module, attribute
            stack.append(None)
        elif name == "STACK_GLOBAL":
            if len(stack) < 2 or not isinstance(stack[-2], str) or not isinstance(stack[-1], str):
                raise ValueError("it imports a name computed while unpickling")
            module, attribute = stack[-2], stack[-1]
            del stack[-2:]
            yield module, attribute  # type: ignore[misc]  # both checked to be strings above
            stack.append(None)
        elif name not in _UNCHANGED:
            stack.append(None)


def _archive(path: Path) -> zipfile.ZipFile:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataFileError(path, f"is not a saved policy's zip archive ({exc})") from None
    names = archive.namelist()
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:  # which copy a reader takes is up to the reader: none is trusted
        archive.close()
        raise UnsafeArtefactError(path, f"holds two members named {doubled[0]!r}; a saved policy has one "
                                        "of each")
    return archive


def _member(archive: zipfile.ZipFile, path: Path, name: str) -> bytes | None:
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    if info.file_size > MAX_MEMBER_BYTES:
        raise DataFileError(path, f"member {name!r} declares {info.file_size} bytes, more than a saved "
                                  f"policy holds (at most {MAX_MEMBER_BYTES})")
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:  # a bad CRC, a cut-off stream
        raise DataFileError(path, f"member {name!r} cannot be read ({exc})") from None


def audit_policy_zip(path: str | Path) -> None:
    """Refuse a `policy.zip` whose `data` carries anything but Stable-Baselines3's own data (see the
    module docstring); nothing is unpickled and torch is not imported."""
    path = Path(path)
    with _archive(path) as archive:
        raw = _member(archive, path, DATA)
        if WEIGHTS not in archive.namelist():
            raise DataFileError(path, f"has no {WEIGHTS} (the policy's weights)")
    if raw is None:
        return  # the weights and policy.json are all ctrlsim reads
    try:
        entries = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DataFileError(path, f"member {DATA!r} is not JSON ({exc})") from None
    if not isinstance(entries, dict):
        raise DataFileError(path, f"member {DATA!r} is not a JSON object")
    for key, value in entries.items():
        if isinstance(value, Mapping) and ":serialized:" in value:
            _audit_entry(path, key, value[":serialized:"])


def _audit_entry(path: Path, key: str, encoded: Any) -> None:
    where = f"entry {key!r} of its {DATA!r} member"
    try:
        raw = base64.b64decode(str(encoded).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise UnsafeArtefactError(path, f"{where} is not base64 pickle data") from None
    try:
        foreign = sorted({f"{m}.{n}" for m, n in pickle_imports(raw) if (m, n) not in SB3_GLOBALS})
    except ValueError as exc:  # opcodes pickletools cannot read, or an import it cannot follow
        raise UnsafeArtefactError(path, f"{where} is a pickle that cannot be checked without running it "
                                        f"({exc}); ctrlsim never unpickles a saved policy") from None
    if foreign:
        raise UnsafeArtefactError(
            path, f"{where} would import {', '.join(foreign[:3])} when unpickled: it carries code, not "
                  "the data Stable-Baselines3 writes. ctrlsim never unpickles a saved policy and refuses "
                  "this one; use a policy trained with `ctrlsim train-probe`")


# ----------------------------------------------------------------------------- the network


def architecture(meta: Mapping[str, Any], meta_path: str | Path) -> dict[str, Any]:
    """The keyword arguments of the policy network `policy.json`'s `policy` entry describes (none for
    a file written before it existed: Stable-Baselines3's defaults, which ctrlsim trained with)."""
    described = meta.get("policy")
    if described is None:
        return {}
    if not isinstance(described, Mapping) or described.get("class") != "ActorCriticPolicy":
        raise DataFileError(meta_path, "its 'policy' entry is not an ActorCriticPolicy's description")
    net_arch = described.get("net_arch")
    layers = [net_arch] if isinstance(net_arch, list) else (
        [net_arch.get("pi"), net_arch.get("vf")] if isinstance(net_arch, Mapping) else [None])
    for sizes in layers:
        if not isinstance(sizes, list) or len(sizes) > 64 or not all(
                isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1 << 16 for n in sizes):
            raise DataFileError(meta_path, f"its policy net_arch {net_arch!r} is not a list of layer sizes "
                                           "(or pi/vf lists) in [1, 65536]")
    activation = described.get("activation")
    if activation not in ACTIVATIONS:
        raise DataFileError(meta_path, f"its policy activation {activation!r} is not one of {ACTIVATIONS}")
    shared = described.get("share_features_extractor", True)
    if not isinstance(shared, bool):
        raise DataFileError(meta_path, f"its policy share_features_extractor {shared!r} is not true/false")
    import torch.nn as nn

    return {"net_arch": net_arch, "activation_fn": getattr(nn, activation),
            "share_features_extractor": shared}


def describe(policy: Any) -> dict[str, Any]:
    """What `architecture` rebuilds `policy` (a Stable-Baselines3 ActorCriticPolicy) from, for policy.json."""
    return {"class": type(policy).__name__, "net_arch": policy.net_arch,
            "activation": policy.activation_fn.__name__,
            "share_features_extractor": bool(policy.share_features_extractor)}


def load_policy(path: str | Path, observation_space, action_space, network: Mapping[str, Any]):
    """The policy network of `policy.zip` at `path`, audited, built from the given spaces and
    `architecture(...)`, with its weights read as tensors only; in evaluation mode."""
    import torch
    from stable_baselines3.common.policies import ActorCriticPolicy

    path = Path(path)
    audit_policy_zip(path)
    with _archive(path) as archive:
        raw = _member(archive, path, WEIGHTS)
    if raw is None:
        raise DataFileError(path, f"has no {WEIGHTS} (the policy's weights)")
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # the weights-only reader met a global it does not allow
        said = [line.strip() for line in str(exc).splitlines() if "WeightsUnpickler error" in line]
        raise UnsafeArtefactError(path, f"member {WEIGHTS!r} is not plain tensors: torch's weights-only "
                                        f"reader refused it ({(said or ['no detail'])[0][:200]})") from None
    except (RuntimeError, EOFError, KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DataFileError(path, f"member {WEIGHTS!r} is not a readable torch file "
                                  f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(state, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise DataFileError(path, f"member {WEIGHTS!r} is not a mapping of tensor names to tensors")
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if bad:
        raise DataFileError(path, f"member {WEIGHTS!r} holds NaN or infinite weights in {', '.join(bad[:3])}")
    # Building the network draws initial weights from torch's global generator; they are replaced at
    # once, and the generator is put back so loading a policy changes no other random draw.
    with torch.random.fork_rng(devices=[]):
        policy = ActorCriticPolicy(observation_space, action_space, lambda _: 0.0, **network)
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0][:300]
        raise DataFileError(path, f"the weights in {WEIGHTS!r} do not fit the network policy.json "
                                  f"describes ({first})") from None
    policy.set_training_mode(False)
    return policy


__all__ = ["SB3_GLOBALS", "architecture", "audit_policy_zip", "describe", "load_policy", "pickle_imports"]
