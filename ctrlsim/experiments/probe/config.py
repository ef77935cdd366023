"""`ctrlsim probe`: a population of random probes (CtrlBench-Rec's Base) against one black box.

Prints Coverage and Exploration Efficiency at the checkpoints in the layout of CtrlBench-Rec's
Table 1, plus the controllability ceiling (the share of the target any probe could reach at
all, see `ctrlsim.envs.ceiling`). Two units of work, each a pure function of (config, key):

  episode   the population episode: metrics at each checkpoint, dropped probes, the roster
  ceiling   the beam-search ceiling from the same roster (rebuilt from the seed)

Both go to the run folder (`config.json`, `records.jsonl`, `tables.md`) as soon as each is
done, so an interrupted or failed run keeps what it finished and a rerun resumes (the default
folder is `results/probe`). Every flag is checked, and the output folder created, before any
model loads. Totals printed (tokens, failures) are read
back from the stored records, so a resumed run reports the whole run, not the last process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctrlsim.envs.registration import check_plain_data
from ctrlsim.envs.tasks import TASKS
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    MAX_AGENTS,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SLATE,
    MAX_STATES,
    check_fields,
    config_to_dict,
    option,
)

# Slate sizes of the CtrlBench-Rec reference runs: 20 for NARM, 3 for the others.
PAPER_SLATE_SIZE = {"narm": 20}
PAPER_CHECKPOINTS = (5, 10, 15, 20)
UNITS = ("episode", "ceiling")


@dataclass(frozen=True)
class ProbeRunConfig:
    """What identifies a `ctrlsim probe` run (validated on construction, before any model loads)."""

    recommender: str = option("narm", "black box: narm, sasrec, embedding, bge, twhin-bert, popularity, ... "
                              "or recbole:<Model>")
    task: str = option("target-discovery", "controllability task", choices=TASKS)
    target: str = option("Film-Noir", "target tag (a genre on MovieLens)")
    agents: int = option(26, "probes in the population (K)", low=1, high=MAX_AGENTS)
    rounds: int = option(20, "interaction rounds per probe (t)", low=1, high=MAX_ROUNDS)
    slate_size: int | None = option(None, "items per slate; none = 20 for narm, 3 otherwise (the paper's "
                                    "runs)", low=1, high=MAX_SLATE)
    like_prob: float = option(0.3, "chance a random probe likes a slate item", low=0.0, high=1.0)
    seed: int = option(0, "seed of the episode (roster, probe coins)", low=0, high=MAX_SEED)
    checkpoints: tuple[int, ...] | None = option(None, "rounds at which metrics are reported; none = "
                                                 "5,10,15,20 up to --rounds", low=1)
    ceiling_states: int = option(300, "ceiling exploration bound per probe (states; at least --rounds)",
                                 low=1, high=MAX_STATES)
    dataset: str = option("ml-100k", "built-in dataset name or path")
    recommender_options: dict[str, Any] = field(default_factory=dict)  # API only (no flag)

    def __post_init__(self):
        from ctrlsim.recommenders.registry import check_recommender_name

        try:
            check_recommender_name(self.recommender)
        except ConfigError as exc:
            raise ConfigError(f"recommender: {exc}") from None
        check_fields(self)
        if not isinstance(self.target, str) or not self.target.strip():
            raise ConfigError(f"target must be a tag name, got {self.target!r}")
        if self.ceiling_states < self.rounds:
            raise ConfigError(f"ceiling_states must be at least rounds ({self.rounds}): the ceiling's beam "
                              f"keeps ceiling_states // rounds nodes per round; got {self.ceiling_states}")
        if self.checkpoints is not None:
            if not self.checkpoints:
                raise ConfigError("checkpoints needs at least one round")
            for t in self.checkpoints:
                if t > self.rounds:
                    raise ConfigError(f"checkpoints: round {t} is beyond --rounds {self.rounds}")
            if list(self.checkpoints) != sorted(set(self.checkpoints)):
                raise ConfigError(f"checkpoints must be increasing and distinct, got {self.checkpoints!r}")
        if not isinstance(self.dataset, str) or not self.dataset:
            raise ConfigError(f"dataset must be a name or path, got {self.dataset!r}")
        if not isinstance(self.recommender_options, dict):
            raise ConfigError(f"recommender_options must be a dict, got {self.recommender_options!r}")
        # Stored in config.json and keyed into the model cache: plain JSON data only.
        check_plain_data(self.recommender_options, "recommender_options")

    @property
    def resolved_slate_size(self) -> int:
        return self.slate_size or PAPER_SLATE_SIZE.get(self.recommender, 3)

    @property
    def resolved_checkpoints(self) -> tuple[int, ...]:
        if self.checkpoints is not None:
            return tuple(self.checkpoints)
        return tuple(t for t in PAPER_CHECKPOINTS if t <= self.rounds) or (self.rounds,)

    def to_dict(self) -> dict:
        """The run's identity, with defaults resolved (stored as the run folder's config)."""
        d = config_to_dict(self)
        d["slate_size"], d["checkpoints"] = self.resolved_slate_size, list(self.resolved_checkpoints)
        return d


def identity(ctx) -> dict:
    return ctx.config.to_dict()


def from_identity(identity) -> ProbeRunConfig:
    from ctrlsim.experiments.config import config_from_dict

    return config_from_dict(ProbeRunConfig, identity)


# `--preset smoke`: the smallest real run of this runner (the smallest bundled LLM, a handful of
# units): what the runner contract test and a first try use.
SMOKE_PRESET: dict = {"recommender": "popularity", "agents": 3, "rounds": 5, "target": "War"}
PRESETS = {"smoke": SMOKE_PRESET}
