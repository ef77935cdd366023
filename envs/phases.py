"""`PhasePlan`: a steer-then-release episode's three phases of rounds (issue 47).

Baseline rounds show how probes act without a goal, steering rounds how far they move the box
towards the target, release rounds how much of that stays once they stop: they return to their
baseline policy ("baseline") or skip every item ("skip").
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from ctrlsim.errors import ConfigError

BASELINE, STEER, RELEASE = "baseline", "steer", "release"
PHASES = (BASELINE, STEER, RELEASE)
RELEASE_BASELINE, RELEASE_SKIP = "baseline", "skip"
RELEASE_MODES = (RELEASE_BASELINE, RELEASE_SKIP)
# Which way the steering phase pushes: towards more of the goal's tags, or away from them (see fewer).
TOWARD, AWAY = "toward", "away"
DIRECTIONS = (TOWARD, AWAY)


@dataclass(frozen=True)
class PhasePlan:
    """`baseline`, `steer` and `release` rounds (each >= 1), in that order; `release_mode` says what
    probes do in release rounds: "baseline" (their no-goal policy) or "skip" (like nothing: the
    player sends empty likes without asking the policy). `direction` says which way steering
    pushes: "toward" the goal's tags (see more of them) or "away" from them (see fewer)."""

    baseline: int
    steer: int
    release: int
    release_mode: str = RELEASE_BASELINE
    direction: str = TOWARD

    def __post_init__(self):
        for name in ("baseline", "steer", "release"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"PhasePlan.{name} must be an integer >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.release_mode not in RELEASE_MODES:
            raise ConfigError(f"PhasePlan.release_mode must be one of {RELEASE_MODES}, "
                              f"got {self.release_mode!r}")
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"PhasePlan.direction must be one of {DIRECTIONS}, got {self.direction!r}")

    @property
    def total(self) -> int:
        return self.baseline + self.steer + self.release

    def phase_of(self, round_no: int) -> str:
        """The phase of round `round_no` (1-based, 1..total)."""
        if isinstance(round_no, bool) or not isinstance(round_no, numbers.Integral) \
                or not 1 <= round_no <= self.total:
            raise ConfigError(f"round_no must be an integer in 1..{self.total}, got {round_no!r}")
        if round_no <= self.baseline:
            return BASELINE
        return STEER if round_no <= self.baseline + self.steer else RELEASE

    def skips(self, round_no: int) -> bool:
        """Whether probes skip round `round_no` (a release round under release_mode "skip")."""
        return self.release_mode == RELEASE_SKIP and self.phase_of(round_no) == RELEASE

    def to_dict(self) -> dict[str, Any]:
        """The plan as data; `direction` only when it is "away" (plans written before it existed
        steered toward, and their records stay as they were)."""
        data = asdict(self)
        if self.direction == TOWARD:
            del data["direction"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PhasePlan":
        unknown = sorted(str(k) for k in data if k not in cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"PhasePlan has no field(s) {unknown}; "
                              f"fields: {list(cls.__dataclass_fields__)}")
        return cls(**data)


def as_phase_plan(value: PhasePlan | Mapping[str, Any] | None) -> PhasePlan | None:
    """A `PhasePlan` from itself or its dict (`gymnasium.make` takes plain data), None for None."""
    if value is None or isinstance(value, PhasePlan):
        return value
    if isinstance(value, Mapping):
        return PhasePlan.from_dict(value)
    raise ConfigError(f"phases must be a PhasePlan, its dict or None, got {value!r}")


def plan_budget(budget: int | None, phases: PhasePlan | None, default: int) -> int:
    """The episode's round budget: `phases.total` with a plan (a given `budget` must agree),
    else `budget`, or `default` when none is given."""
    if phases is None:
        return default if budget is None else budget
    if budget is not None and budget != phases.total:
        raise ConfigError(f"budget={budget!r} differs from the phase plan's {phases.total} rounds "
                          f"({phases.baseline} baseline + {phases.steer} steer + {phases.release} release); "
                          "give one or the other")
    return phases.total


def steers_away(info: Mapping[str, Any] | None) -> bool:
    """Whether the round an env info describes steers away from its goal (see fewer of its tags)."""
    return info is not None and info.get("direction") == AWAY and is_steering(info)


def is_steering(info: Mapping[str, Any] | None) -> bool:
    """Whether the round an env info describes pursues the goal: a steer round, or any round of an
    episode without phases (its infos have no "phase")."""
    return info is None or info.get("phase", STEER) == STEER
