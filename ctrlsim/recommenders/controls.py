"""Controls a box declares (issue 48): user-settable knobs, the property each claims to move, and
a non-profiled mode.

Under the EU Digital Services Act a very large platform must offer a recommender option "not
based on profiling" (Art. 38) and let users modify the main parameters of its recommender
systems (Art. 27). A box declares what it offers as a `Controls`; a user's chosen values travel in
`UserState.settings` (name -> value) with every request, so one box serves users with different
settings, and a box that declares nothing ignores them. `ctrlsim audit` sweeps each declared
control and checks the claimed property against the slates.

Properties a claim may name (`PROPERTIES`), each measured on a slate from the catalogue alone:

  diversity    the distinct tags of the slate's items per item (more = more diverse)
  popularity   the mean number of users who rated the slate's items
  novelty      the share of slate items sharing no tag with the user's liked items
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ctrlsim.errors import ConfigError

if TYPE_CHECKING:
    from ctrlsim.data import Dataset

PROPERTIES = ("diversity", "popularity", "novelty")
DIRECTIONS = ("increases", "decreases")


@dataclass(frozen=True)
class Control:
    """One user-settable control: `name`, its values (a numeric range `low`..`high`, or `choices`),
    the `default` a user who never touches it gets, and the claim: setting it higher (or later in
    `choices`) `direction` the `property`, in the box's own words `claim`."""

    name: str
    claim: str
    property: str
    direction: str = "increases"
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()
    default: Any = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"a control needs a name, got {self.name!r}")
        if self.property not in PROPERTIES:
            raise ConfigError(f"control {self.name!r}: property {self.property!r} is not one of {PROPERTIES}")
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"control {self.name!r}: direction {self.direction!r} is not one of "
                              f"{DIRECTIONS}")
        object.__setattr__(self, "choices", tuple(self.choices))
        ranged = self.low is not None and self.high is not None
        if ranged == bool(self.choices):
            raise ConfigError(f"control {self.name!r} needs either low and high (a range) or choices")
        if ranged and not (_number(self.low) and _number(self.high) and float(self.low) < float(self.high)):
            raise ConfigError(f"control {self.name!r}: low {self.low!r} must be a number below high "
                              f"{self.high!r}")
        if self.default is None:
            object.__setattr__(self, "default", self.low if ranged else self.choices[0])
        self.check(self.default)

    def check(self, value: Any) -> Any:
        """`value` if the control takes it, else a `ConfigError` naming the control and its values."""
        if self.choices:
            if value not in self.choices:
                raise ConfigError(f"control {self.name!r} takes one of {list(self.choices)}, got {value!r}")
            return value
        if not _number(value) or not float(self.low) <= float(value) <= float(self.high):  # type: ignore[arg-type]
            raise ConfigError(f"control {self.name!r} takes a number in [{self.low}, {self.high}], "
                              f"got {value!r}")
        return value

    def sweep(self, points: int = 5) -> list[Any]:
        """The values an audit tries: every choice, or `points` evenly spaced numbers over the range."""
        if self.choices:
            return list(self.choices)
        low, high = float(self.low), float(self.high)  # type: ignore[arg-type]
        return [low + (high - low) * k / (points - 1) for k in range(points)]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["choices"] = list(self.choices)
        return data


@dataclass(frozen=True)
class Controls:
    """What a box declares: its controls, and the settings that give a feed not based on profiling
    (`non_profiled`, e.g. {"profiling": "off"}; empty when it offers none)."""

    controls: tuple[Control, ...] = ()
    non_profiled: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "controls", tuple(self.controls))
        names = [c.name for c in self.controls]
        if len(set(names)) != len(names):
            raise ConfigError(f"controls are named more than once: {names}")

    def by_name(self) -> dict[str, Control]:
        return {c.name: c for c in self.controls}

    def to_dict(self) -> dict[str, Any]:
        return {"controls": [c.to_dict() for c in self.controls], "non_profiled": dict(self.non_profiled)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Controls":
        """From `to_dict`'s form (what `GET /controls` answers); a `ConfigError` names what is wrong."""
        if not isinstance(data, Mapping) or not isinstance(data.get("controls", []), list):
            raise ConfigError(f"declared controls must be {{'controls': [...], 'non_profiled': {{...}}}}, "
                              f"got {data!r}")
        controls = []
        for entry in data.get("controls", []):
            if not isinstance(entry, Mapping):
                raise ConfigError(f"a declared control must be an object, got {entry!r}")
            unknown = sorted(set(entry) - set(Control.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"declared control has unknown field(s) {unknown}")
            controls.append(Control(**{**entry, "choices": tuple(entry.get("choices") or ())}))
        non_profiled = data.get("non_profiled") or {}
        if not isinstance(non_profiled, Mapping):
            raise ConfigError(f"non_profiled must be an object of settings, got {non_profiled!r}")
        return cls(tuple(controls), dict(non_profiled))


NO_CONTROLS = Controls()


def slate_property(name: str, dataset: Dataset, slate: Sequence[str], history: Sequence[str]) -> float:
    """A claimed property of one slate (`ctrlsim.recommenders.controls.PROPERTIES`)."""
    tags = dataset.items["tags"]
    item_tags = [set(tags.iat[dataset.item_index[i]]) for i in slate]
    if not slate:
        raise ConfigError("a slate property needs a non-empty slate")
    if name == "diversity":
        return len(set().union(*item_tags)) / len(slate)
    if name == "popularity":
        pop = dataset.items["popularity"].to_numpy(dtype=float)
        return float(np.mean(pop[dataset.indices(slate)]))
    if name == "novelty":
        liked: set[str] = set().union(*(set(tags.iat[dataset.item_index[i]]) for i in history)) if history \
            else set()
        return float(np.mean([not (t & liked) for t in item_tags]))
    raise ConfigError(f"unknown slate property {name!r}")


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
