"""Learned probes: a probe policy trained with reinforcement learning (Stable-Baselines3), saved, and
evaluated as a ctrlbench method (`--methods rl:PATH`) beside `random`, `oracle` and the LLM methods.

`train_probe(TrainProbeConfig(...), out)` trains against one black box and target on the RL-ready
probe env (`ctrlsim.envs.wrappers.rl_env`: likes-only actions, or likes plus a search menu; slate
features as observations; reward = the task's step reward, new target items liked on recommender
slates) and writes into `out`:

    policy.zip            the Stable-Baselines3 model
    policy.json           what it was trained on: the config, the feature settings, versions, time
    learning_curve.csv    per finished training episode: timesteps so far, return, Coverage

`LearnedProbe` acts with a saved policy on a raw observation (it computes the same features), so
the policy runs in the population env the ctrlbench runner uses. Needs the `rl` extra
(`pip install "ctrlsim[rl]"`).

A saved policy is loaded without unpickling anything (`policy_file`): its weights as tensors only,
its network rebuilt from `policy.json`, and a zip whose pickled entries would import anything
Stable-Baselines3 does not write there is refused naming the entry.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ctrlsim.errors import ConfigError, MissingDependencyError

POLICY_FILE, META_FILE, CURVE_FILE = "policy.zip", "policy.json", "learning_curve.csv"
ALGORITHMS = ("PPO", "A2C")
METHOD_PREFIX = "rl:"


def import_sb3():
    try:
        import stable_baselines3
    except ImportError as exc:
        raise MissingDependencyError("stable-baselines3", "rl", "learned probes") from exc
    return stable_baselines3


@dataclass(frozen=True)
class TrainProbeConfig:
    """What a learned probe is trained on, and how (stored in `policy.json`)."""

    recommender: str = field(
        default="dial:1", metadata={"help": "black box to train against (any make_recommender name)"}
    )
    target: tuple[str, ...] = field(default=("War",), metadata={"help": "target tag(s)"})
    dataset: str = field(default="ml-100k", metadata={"help": "dataset name or path"})
    timesteps: int = field(
        default=20_000, metadata={"help": "environment steps of training (at most 10,000,000)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the training run (policy init, episodes)"})
    slate_size: int = field(
        default=3, metadata={"help": "items per slate (the evaluation must use the same; at most 100)"}
    )
    budget: int = field(default=20, metadata={"help": "rounds per training episode (at most 10,000)"})
    l_init: tuple[int, ...] = field(default=(4, 6), metadata={"help": "seed history length range"})
    search_menu: str | None = field(
        default=None,
        metadata={"help": "'tags': the probe may also search one of the catalogue's tags (off: likes only)"},
    )
    embedding: str | None = field(
        default=None,
        metadata={
            "help": "add each item's text embedding from this encoder to the observation (e.g. minilm)"
        },
    )
    algorithm: str = field(
        default="PPO", metadata={"help": "Stable-Baselines3 algorithm", "choices": list(ALGORITHMS)}
    )
    n_steps: int = field(default=512, metadata={"help": "rollout length per update (at most 100,000)"})
    learning_rate: float = field(default=3e-4, metadata={"help": "optimiser step size"})

    def __post_init__(self):
        def whole(name: str, low: int, high: int) -> None:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or not low <= value <= high
            ):
                raise ConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
            object.__setattr__(self, name, int(value))

        whole("timesteps", 1, 10_000_000)
        whole("seed", 0, 2**32 - 1)
        whole("slate_size", 1, 100)
        whole("budget", 1, 10_000)
        whole("n_steps", 2, 100_000)
        if isinstance(self.target, str):
            object.__setattr__(self, "target", (self.target,))
        object.__setattr__(self, "target", tuple(self.target))
        object.__setattr__(self, "l_init", tuple(self.l_init))
        if not self.target or not all(isinstance(t, str) and t for t in self.target):
            raise ConfigError(f"target must name at least one tag, got {self.target!r}")
        repeated = sorted({t for t in self.target if self.target.count(t) > 1})
        if repeated:
            raise ConfigError(f"target names a tag more than once: {', '.join(map(repr, repeated))}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.search_menu not in (None, "tags"):
            raise ConfigError(f"search_menu must be 'tags' or none, got {self.search_menu!r}")
        rate = self.learning_rate
        if isinstance(rate, bool) or not (isinstance(rate, (int, float)) and 0 < rate <= 1):
            raise ConfigError(f"learning_rate must be in (0, 1], got {self.learning_rate!r}")


# ----------------------------------------------------------------------------- the env


def make_training_env(config: TrainProbeConfig, dataset=None, recommender=None):
    """The RL-ready probe env of `config` (`recommender`/`dataset`: live objects to reuse)."""
    from ctrlsim.envs import ProbeEnv
    from ctrlsim.envs.wrappers import rl_env

    env = ProbeEnv(
        recommender if recommender is not None else config.recommender,
        dataset=dataset if dataset is not None else config.dataset,
        task="target-discovery",
        target=list(config.target),
        slate_size=config.slate_size,
        budget=config.budget,
        l_init=config.l_init,
        allow_search=config.search_menu is not None,
    )
    return rl_env(env, search_menu=config.search_menu, embedding=config.embedding)


# ----------------------------------------------------------------------------- training


class _Progress:
    """A Stable-Baselines3 callback: a progress bar and the learning curve (one row per episode)."""

    def __init__(self, total: int, show: bool):
        from stable_baselines3.common.callbacks import BaseCallback
        from tqdm import tqdm

        rows: list[dict[str, float]] = []
        bar = tqdm(total=total, desc="training", unit="step", disable=not show, mininterval=0.5)

        class Callback(BaseCallback):
            def _on_step(self) -> bool:
                bar.update(self.training_env.num_envs)
                for info in self.locals.get("infos", ()):
                    episode = info.get("episode")
                    if episode is not None:
                        rows.append(
                            {
                                "timesteps": float(self.num_timesteps),
                                "return": float(episode["r"]),
                                "coverage": float(info.get("metric/coverage", float("nan"))),
                            }
                        )
                        bar.set_postfix(coverage=f"{np.mean([r['coverage'] for r in rows[-20:]]):.3f}")
                return True

        self.rows, self.bar, self.callback = rows, bar, Callback()


def train_probe(
    config: TrainProbeConfig, out: str | Path, *, show_progress: bool = True, threads: int | None = 1
) -> dict[str, Any]:
    """Train a learned probe (see the module docstring); returns what `policy.json` holds.

    `threads`: torch threads while training (1 is fastest for the small MLP on a CPU)."""
    sb3 = import_sb3()
    from stable_baselines3.common.monitor import Monitor

    from ctrlsim.atomic import atomic_write_text
    from ctrlsim.backends._torch import torch_threads

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = Monitor(make_training_env(config))
    algorithm = getattr(sb3, config.algorithm)
    options: dict[str, Any] = {"n_steps": config.n_steps, "learning_rate": config.learning_rate}
    if config.algorithm == "PPO":
        options["batch_size"] = min(128, config.n_steps)
    progress = _Progress(config.timesteps, show_progress)
    started, cpu_started = time.perf_counter(), time.process_time()
    with torch_threads(threads):
        model = algorithm("MlpPolicy", env, seed=config.seed, device="cpu", verbose=0, **options)
        try:
            model.learn(config.timesteps, callback=progress.callback)
        finally:
            progress.bar.close()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    model.save(out / POLICY_FILE)
    wrapper = _feature_wrapper(env)
    import ctrlsim

    from .policy_file import describe

    meta = {
        "config": _plain(asdict(config)),
        "features": wrapper.features.settings(),
        "search_menu": list(_actions_wrapper(env).search_menu),
        "algorithm": config.algorithm,
        "policy": describe(model.policy),  # what the loader rebuilds the network from (no pickle)
        "versions": {"ctrlsim": ctrlsim.__version__, "stable_baselines3": sb3.__version__},
        "timesteps": int(model.num_timesteps),
        "episodes": len(progress.rows),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
        "final_coverage": _tail_mean(progress.rows, "coverage"),
    }
    _write_curve(out / CURVE_FILE, progress.rows)
    atomic_write_text(out / META_FILE, json.dumps(meta, indent=2) + "\n")
    return meta


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


def _tail_mean(rows: list[dict[str, float]], key: str, n: int = 50) -> float | None:
    values = [r[key] for r in rows[-n:]]
    return round(float(np.mean(values)), 4) if values else None


def _find(env, cls):
    while env is not None:
        if isinstance(env, cls):
            return env
        env = getattr(env, "env", None)
    raise ConfigError(f"no {cls.__name__} around this env")


def _feature_wrapper(env):
    from ctrlsim.envs.wrappers import ItemFeatures

    return _find(env, ItemFeatures)


def _actions_wrapper(env):
    from ctrlsim.envs.wrappers import LikesActions

    return _find(env, LikesActions)


def _write_curve(path: Path, rows: list[dict[str, float]]) -> None:
    import io

    from ctrlsim.atomic import atomic_write_text

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["episode", "timesteps", "return", "coverage"])
    writer.writeheader()
    for n, row in enumerate(rows, 1):
        writer.writerow({"episode": n, **row})
    atomic_write_text(path, buffer.getvalue())


def read_curve(path: str | Path) -> list[dict[str, float]]:
    """The rows `train_probe` wrote to `learning_curve.csv`."""
    with open(path, encoding="utf-8", newline="") as fh:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]


# ----------------------------------------------------------------------------- a saved policy


def policy_paths(path: str | Path) -> tuple[Path, Path]:
    """(model zip, metadata json) of a saved policy given as its folder or its `policy.zip`."""
    path = Path(path).expanduser()
    folder = path if path.is_dir() else path.parent
    model = path if path.is_file() else folder / POLICY_FILE
    meta = folder / META_FILE
    for needed in (model, meta):
        if not needed.is_file():
            raise ConfigError(
                f"no saved learned probe at {path}: {needed} is missing (train one with "
                "`ctrlsim train-probe --out FOLDER`)"
            )
    return model, meta


def read_meta(path: str | Path) -> dict[str, Any]:
    """A saved policy's `policy.json` (checked for the fields `LearnedProbe` needs)."""
    from ctrlsim.errors import DataFileError

    _, meta_path = policy_paths(path)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataFileError(meta_path, f"is not valid JSON ({exc})") from None
    if (
        not isinstance(meta, dict)
        or not isinstance(meta.get("features"), dict)
        or not isinstance(meta.get("search_menu"), list)
        or meta.get("algorithm") not in ALGORITHMS
    ):
        raise DataFileError(
            meta_path, "is not a learned probe's policy.json (features, search_menu, algorithm)"
        )
    return meta


class LearnedProbe:
    """A saved policy acting as a probe: `act(observation, info)` on the raw env's observation."""

    def __init__(self, model, features, search_menu: tuple[str, ...] = ()):
        """`model`: anything with Stable-Baselines3's `predict` (a loaded policy network, a model)."""
        self.model, self.features, self.search_menu = model, features, tuple(search_menu)

    @classmethod
    def load(cls, path: str | Path, dataset) -> "LearnedProbe":
        """The policy saved at `path` (its folder or its policy.zip), never unpickled (`policy_file`)."""
        import_sb3()
        from ctrlsim.envs.wrappers import SlateFeatures, likes_action_space

        from .policy_file import architecture, load_policy

        model_path, meta_path = policy_paths(path)
        meta = read_meta(path)
        features = SlateFeatures.from_settings(dataset, meta["features"])
        menu = tuple(meta["search_menu"])
        policy = load_policy(model_path, features.space(), likes_action_space(features.slate_size, menu),
                             architecture(meta, meta_path))
        return cls(policy, features, menu)

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        action, _ = self.model.predict(self.features.encode(observation), deterministic=True)
        values = np.asarray(action).ravel()
        size = self.features.slate_size
        query = ""
        if self.search_menu and int(values[size]):
            query = self.search_menu[int(values[size]) - 1]
        return {"likes": values[:size].astype(np.int64), "query": query}


# ----------------------------------------------------------------------------- the ctrlbench method


def is_rl_method(name: str) -> bool:
    return isinstance(name, str) and name.startswith(METHOD_PREFIX)


def check_rl_method(name: str, *, slate_size: int | None = None, allow_search: bool | None = None) -> dict:
    """The saved policy `rl:PATH` names exists, carries no code and fits the run (slate size, search);
    returns its meta."""
    from .policy_file import audit_policy_zip

    meta = read_meta(name[len(METHOD_PREFIX) :])
    audit_policy_zip(policy_paths(name[len(METHOD_PREFIX) :])[0])
    trained = meta["features"].get("slate_size")
    if slate_size is not None and trained != slate_size:
        raise ConfigError(
            f"method {name!r} was trained on slates of {trained}; this run shows "
            f"{slate_size} (give --slate-size {trained}, or retrain)"
        )
    if allow_search is False and meta["search_menu"]:
        raise ConfigError(f"method {name!r} was trained with a search menu; run it with --allow-search")
    return meta


def rl_method(name: str):
    """The `MethodSpec` of `rl:PATH`: Base-Small's users (template bios, no LLM), each acting with the
    saved policy. Its label names the policy's folder."""
    from ..methods import CustomPolicy, MethodSpec, Population

    path = name[len(METHOD_PREFIX) :]
    meta = check_rl_method(name)  # a zip carrying code is refused when the method is named, up front

    def build(context) -> Population:
        probe = LearnedProbe.load(path, context.dataset)

        def make(agents: Mapping[str, Any], rngs: Mapping[str, Any]):
            from ..methods import _PerProbe

            return _PerProbe({agent: probe for agent in agents})

        policy = CustomPolicy(name, make)
        return Population(tuple(context.template_personas(context.k_small, context.small_sample)), policy)

    trained_on = meta.get("config", {}).get("recommender", "?")
    label = f"RL ({Path(path).expanduser().resolve().name}, trained on {trained_on})"
    return MethodSpec(
        name,
        label,
        build,
        uses_llm=False,
        description=f"a learned probe ({meta['algorithm']}, {meta.get('timesteps')} steps on "
        f"{trained_on}) on Base-Small's users; no LLM",
    )


__all__ = [
    "LearnedProbe",
    "TrainProbeConfig",
    "check_rl_method",
    "is_rl_method",
    "make_training_env",
    "read_curve",
    "read_meta",
    "rl_method",
    "train_probe",
]
