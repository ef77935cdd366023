"""No loaded artefact runs code (issue 45, item 1).

A saved learned probe (`rl:PATH`) is read without unpickling: a `policy.zip` whose pickled entries
would import anything Stable-Baselines3 does not write there, or whose weights are not plain tensors,
is refused naming the file and the entry, and nothing in it runs (each planted payload would create
a marker file when unpickled; the first test shows Stable-Baselines3's own loader running it). The
policies `ctrlsim train-probe` writes load and act exactly as Stable-Baselines3 loads them.

A `module:attribute` method runs the user's code, so its source is part of the run's provenance: an
edited module (or a helper of its package) refuses a resume that names it, `--allow-code-change`
resumes and records it, and a module with no source file cannot be shown unchanged.
"""
from __future__ import annotations

import base64
import io
import json
import pickle
import sys
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ctrlsim.errors import DataFileError, UnsafeArtefactError
from ctrlsim.experiments import provenance
from ctrlsim.experiments.cli import main

sb3 = pytest.importorskip("stable_baselines3")

TRAIN = ["train-probe", "--recommender", "dial:1", "--target", "War", "--timesteps", "128", "--n-steps",
         "64", "--budget", "5", "--figures", "false"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy")
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


class Payload:
    """Unpickling this creates `marker` (builtin `open`, as `io.open`): the planted code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _copy_policy(trained: Path, folder: Path, *, data=None, members=None) -> Path:
    """A copy of the trained policy folder whose zip has `data` edited (a function of the parsed JSON)
    and `members` (name -> bytes) replaced or added."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.json").write_bytes((trained / "policy.json").read_bytes())
    with zipfile.ZipFile(trained / "policy.zip") as source, \
            zipfile.ZipFile(folder / "policy.zip", "w") as zip_:
        for name in source.namelist():
            raw = source.read(name)
            if name == "data" and data is not None:
                raw = json.dumps(data(json.loads(raw))).encode()
            if members and name in members:
                raw = members.pop(name)
            zip_.writestr(name, raw)
        for name, raw in (members or {}).items():
            zip_.writestr(name, raw)
    return folder


def _serialized(raw: bytes) -> dict:
    return {":type:": "<class 'object'>", ":serialized:": base64.b64encode(raw).decode()}


def _planted(key: str, raw: bytes):
    return lambda entries: {**entries, key: _serialized(raw)}


def test_a_planted_pickle_entry_is_refused_and_never_run(trained, tmp_path, ml100k):
    from ctrlsim.agents.rl import LearnedProbe

    marker = tmp_path / "ran"
    payload = _planted("planted", pickle.dumps(Payload(marker)))
    folder = _copy_policy(trained, tmp_path / "planted", data=payload)
    with pytest.raises(UnsafeArtefactError) as caught:
        LearnedProbe.load(folder, ml100k)
    message = str(caught.value)
    assert str(folder / "policy.zip") in message and "entry 'planted'" in message and "io.open" in message
    assert not marker.exists()
    sb3.PPO.load(folder / "policy.zip", device="cpu")  # the hazard itself: SB3's loader runs it
    assert marker.exists()


def test_a_planted_policy_is_refused_up_front_by_the_cli(trained, tmp_path, capsys):
    marker = tmp_path / "ran"
    payload = _planted("planted", pickle.dumps(Payload(marker)))
    folder = _copy_policy(trained, tmp_path / "planted", data=payload)
    code = main(["ctrlbench", "--methods", f"rl:{folder}", "--recommenders", "dial:1", "--targets", "War",
                 "--agents", "1,1", "--rounds", "1", "--out", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err
    assert str(folder / "policy.zip") in err and "entry 'planted'" in err
    assert not marker.exists() and not (tmp_path / "run" / "records.jsonl").exists()


def test_a_payload_in_place_of_a_standard_entry_is_refused(trained, tmp_path, ml100k):
    from ctrlsim.agents.rl import LearnedProbe

    marker = tmp_path / "ran"
    payload = _planted("observation_space", pickle.dumps(Payload(marker)))
    folder = _copy_policy(trained, tmp_path / "p", data=payload)
    with pytest.raises(UnsafeArtefactError, match="entry 'observation_space'.*io.open"):
        LearnedProbe.load(folder, ml100k)
    assert not marker.exists()


def test_a_cloudpickled_function_is_code_and_refused(trained, tmp_path):
    import cloudpickle
    from ctrlsim.agents.rl.policy_file import audit_policy_zip

    payload = _planted("lr_schedule", cloudpickle.dumps(lambda _: 3e-4))
    folder = _copy_policy(trained, tmp_path / "p", data=payload)
    with pytest.raises(UnsafeArtefactError, match=r"entry 'lr_schedule'.*cloudpickle"):
        audit_policy_zip(folder / "policy.zip")


def test_an_import_disguised_behind_other_strings_is_refused(trained, tmp_path, ml100k):
    """io.open, with 'numpy' and 'dtype' pushed and popped after it: a reader that takes the last two
    strings before STACK_GLOBAL would see numpy.dtype; the real stack holds io.open."""
    from ctrlsim.agents.rl import LearnedProbe

    marker = tmp_path / "ran"

    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode()

    raw = (b"\x80\x04" + text("io") + text("open") + text("numpy") + text("dtype") + b"00" + b"\x93"
           + text(str(marker)) + text("w") + b"\x86" + b"R" + b".")
    assert pickle.loads(raw).close() is None and marker.exists()  # the bytes really open the marker
    marker.unlink()
    folder = _copy_policy(trained, tmp_path / "p", data=_planted("clip_range", raw))
    with pytest.raises(UnsafeArtefactError, match="entry 'clip_range'.*computed while unpickling"):
        LearnedProbe.load(folder, ml100k)
    assert not marker.exists()


def test_weights_that_are_not_plain_tensors_are_refused(trained, tmp_path, ml100k):
    import torch
    from ctrlsim.agents.rl import LearnedProbe

    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save({"mlp_extractor.policy_net.0.weight": Payload(marker)}, buffer)
    folder = _copy_policy(trained, tmp_path / "p", members={"policy.pth": buffer.getvalue()})
    with pytest.raises(UnsafeArtefactError, match="member 'policy.pth' is not plain tensors") as caught:
        LearnedProbe.load(folder, ml100k)
    assert str(folder / "policy.zip") in str(caught.value) and not marker.exists()


def test_a_second_member_of_the_same_name_is_refused(trained, tmp_path):
    from ctrlsim.agents.rl.policy_file import audit_policy_zip

    folder = _copy_policy(trained, tmp_path / "p")
    with zipfile.ZipFile(folder / "policy.zip", "a") as zip_, pytest.warns(UserWarning, match="Duplicate"):
        zip_.writestr("data", b"{}")  # the copy a reader picks would be up to the reader
    with pytest.raises(UnsafeArtefactError, match="two members named 'data'"):
        audit_policy_zip(folder / "policy.zip")


def _state(trained: Path) -> dict:
    import torch

    with zipfile.ZipFile(trained / "policy.zip") as zip_:
        return torch.load(io.BytesIO(zip_.read("policy.pth")), weights_only=True)


def test_nan_weights_and_weights_of_another_network_are_named(trained, tmp_path, ml100k):
    import torch
    from ctrlsim.agents.rl import LearnedProbe

    state = _state(trained)
    name = sorted(state)[0]
    buffer = io.BytesIO()
    torch.save({**state, name: torch.full_like(state[name], float("nan"))}, buffer)
    folder = _copy_policy(trained, tmp_path / "nan", members={"policy.pth": buffer.getvalue()})
    with pytest.raises(DataFileError, match=f"NaN or infinite weights in {name}"):
        LearnedProbe.load(folder, ml100k)
    other = _copy_policy(trained, tmp_path / "other")
    meta = json.loads((other / "policy.json").read_text())
    meta["policy"]["net_arch"] = {"pi": [32], "vf": [32]}
    (other / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(DataFileError, match="do not fit the network policy.json describes"):
        LearnedProbe.load(other, ml100k)


def test_an_activation_named_as_an_import_path_is_refused(trained, tmp_path, ml100k):
    from ctrlsim.agents.rl import LearnedProbe

    folder = _copy_policy(trained, tmp_path / "p")
    meta = json.loads((folder / "policy.json").read_text())
    meta["policy"]["activation"] = "os.system"
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(DataFileError, match="activation 'os.system' is not one of") as caught:
        LearnedProbe.load(folder, ml100k)
    assert str(folder / "policy.json") in str(caught.value)


def test_a_policy_zip_that_is_not_a_zip_is_named(trained, tmp_path, ml100k):
    from ctrlsim.agents.rl import LearnedProbe

    folder = _copy_policy(trained, tmp_path / "p")
    (folder / "policy.zip").write_bytes(b"not a zip")
    with pytest.raises(DataFileError, match="is not a saved policy's zip archive") as caught:
        LearnedProbe.load(folder, ml100k)
    assert str(folder / "policy.zip") in str(caught.value)


@pytest.mark.parametrize("flags", [[], ["--search-menu", "tags", "--algorithm", "A2C"]],
                         ids=["ppo", "a2c-menu"])
def test_policies_train_probe_writes_act_as_stable_baselines3_loads_them(flags, tmp_path, ml100k):
    """Results unchanged: the same actions and the same action probabilities, step by step, for the
    policy.json of this version (with `policy`) and of the last (without it: SB3's defaults)."""
    import torch
    from ctrlsim.agents.rl import LearnedProbe
    from ctrlsim.envs import ProbeEnv

    out = tmp_path / "policy"
    assert main([*TRAIN, *flags, "--out", str(out)]) == 0
    meta = json.loads((out / "policy.json").read_text())
    older = _copy_policy(out, tmp_path / "older")
    (older / "policy.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "policy"}))
    model = getattr(sb3, meta["algorithm"]).load(out / "policy.zip", device="cpu")
    search = bool(meta["search_menu"])
    for folder in (out, older):
        probe = LearnedProbe.load(folder, ml100k)
        env = ProbeEnv("dial:1", dataset=ml100k, target="War", budget=5, allow_search=search)
        for seed in range(3):
            observation, info = env.reset(seed=seed)
            for _ in range(5):
                action = probe.act(observation, info)
                features = probe.features.encode(observation)
                expected, _ = model.predict(features, deterministic=True)
                assert np.asarray(expected).ravel()[:3].tolist() == action["likes"].tolist()
                tensor = torch.as_tensor(features)[None]
                ours = probe.model.get_distribution(tensor).distribution
                theirs = model.policy.get_distribution(tensor).distribution
                for a, b in zip(*(d if isinstance(d, list) else [d] for d in (ours, theirs)), strict=True):
                    assert torch.equal(a.logits, b.logits)  # MultiDiscrete: one Categorical per entry
                observation, _, _, _, info = env.step(action)


# ----------------------------------------------------------------------------- user code in provenance

METHOD = '''
"""A user's method for the tests (no LLM): coin-flip probes on Base-Small's users."""
from ctrlsim.agents.methods import MethodSpec, Population
{imports}


def build(context):
    return Population(tuple(context.template_personas(context.k_small, context.small_sample)), "random")


METHOD = MethodSpec("mine", "Mine", build, uses_llm=False)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Writes a method module (or package) under a fresh name and forgets it afterwards."""
    from ctrlsim.agents import methods

    names: list[str] = []

    def write(package: bool = False) -> tuple[str, Path]:
        name = f"user_method_{uuid.uuid4().hex[:8]}"
        names.append(name)
        if package:
            root = tmp_path / "src" / name
            root.mkdir(parents=True)
            (root / "__init__.py").write_text("")
            (root / "helpers.py").write_text("LIKE_PROB = 0.5\n")
            (root / "methods.py").write_text(METHOD.format(imports="from .helpers import LIKE_PROB  # noqa"))
            module, path = f"{name}.methods", root / "helpers.py"
        else:
            path = tmp_path / "src" / f"{name}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(METHOD.format(imports=""))
            module = name
        return f"{module}:METHOD", path

    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield write
    for name in names:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        for key in [k for k in methods.METHODS if k.startswith(name)]:
            del methods.METHODS[key]


def _bench(method: str, run: Path, seeds: str, *extra: str) -> list[str]:
    return ["ctrlbench", "--methods", method, "--recommenders", "popularity", "--targets", "War",
            "--agents", "1,1", "--rounds", "1", "--figures", "false", "--seeds", seeds, "--out", str(run),
            *extra]


def test_an_edited_user_method_refuses_the_resume_unless_allowed(tmp_path, user_module, capsys):
    method, path = user_module()
    run = tmp_path / "run"
    assert main(_bench(method, run, "0")) == 0
    module = method.partition(":")[0]
    stored = provenance.read_entries(run / provenance.PROVENANCE)[-1]["code"]["user_code"]
    assert stored[module]["path"] == str(path.resolve())
    assert main(_bench(method, run, "0,1")) == 0  # unchanged: resumed, no new entry
    assert len(provenance.read_entries(run / provenance.PROVENANCE)) == 1
    records = (run / "records.jsonl").read_bytes()
    path.write_text(path.read_text().replace("(no LLM)", "(no LLM, edited)"))
    assert main(_bench(method, run, "0,1,2")) == 2
    err = capsys.readouterr().err
    assert f"user code {module} ({path.resolve()}): source changed" in err and "--allow-code-change" in err
    assert (run / "records.jsonl").read_bytes() == records
    assert main(_bench(method, run, "0,1,2", "--allow-code-change")) == 0
    last = provenance.read_entries(run / provenance.PROVENANCE)[-1]
    assert any(line.startswith(f"user code {module}") for line in last["allowed_code_change"])


def test_an_edited_helper_of_the_users_package_refuses_the_resume(tmp_path, user_module, capsys):
    method, helpers = user_module(package=True)
    run = tmp_path / "run"
    assert main(_bench(method, run, "0")) == 0
    helpers.write_text("LIKE_PROB = 0.9\n")  # the builder's own file is unchanged
    assert main(_bench(method, run, "0,1")) == 2
    package = helpers.parent.name
    assert f"files changed: {package}/helpers.py" in capsys.readouterr().err


def test_a_user_method_without_a_source_file_cannot_be_shown_unchanged(tmp_path, monkeypatch, capsys):
    import types

    from ctrlsim.agents import methods

    name = f"user_method_{uuid.uuid4().hex[:8]}"
    module = types.ModuleType(name)  # made in memory, as a notebook's __main__ is: no file to hash
    exec(METHOD.format(imports=""), module.__dict__)  # noqa: S102 - the test's own text
    monkeypatch.setitem(sys.modules, name, module)
    run = tmp_path / "run"
    try:
        assert main(_bench(f"{name}:METHOD", run, "0")) == 0
        assert main(_bench(f"{name}:METHOD", run, "0,1")) == 2
        assert f"user code {name}: its source cannot be hashed" in capsys.readouterr().err
        assert main(_bench(f"{name}:METHOD", run, "0,1", "--allow-code-change")) == 0
    finally:
        methods.METHODS.pop(f"{name}:METHOD", None)
