"""`Persona`: who an LLM probe is (CtrlBench-Rec §3.2, Appendix B).

A persona is written by the profile generator from a user's demographics and first
liked items, evolved by the debate-and-merge loop, and turned into a `ProbeSpec`
for the environments. It is plain data that round-trips through JSON, so rosters
can be stored in run folders and evaluated later on any black box.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ctrlsim.envs import ProbeSpec

MAX_INTERESTS = 5


def _persona_schema():
    """The pydantic model of a persona's fields (built on first use: pydantic loads lazily)."""
    global _SCHEMA
    if _SCHEMA is None:
        from pydantic import BaseModel, ConfigDict, Field

        class PersonaFields(BaseModel):
            model_config = ConfigDict(extra="forbid", strict=True)
            probe_id: str = Field(min_length=1)
            name: str
            bio: str
            interests: list[str] = Field(default_factory=list)
            behaviour: list[str | int] = Field(default_factory=list)
            attributes: dict[str, Any] = Field(default_factory=dict)
            source: str = "llm"
            flags: list[str] = Field(default_factory=list)

        _SCHEMA = _Checked(PersonaFields)
    return _SCHEMA


class _Checked:
    """A pydantic model whose validation errors read as one short `ValueError` naming each field."""

    def __init__(self, model):
        self.model = model

    def validate_python(self, data, *, strict: bool = True):
        from pydantic import ValidationError

        try:
            return self.model.model_validate(data, strict=strict)
        except ValidationError as exc:
            # loc parts "str" / "int" name the member of a union, not a field
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p not in ('str', 'int'))}: "
                                 f"{e['msg']} (got {e.get('input')!r:.60})" for e in exc.errors())
            raise ValueError(problems) from None


_SCHEMA: _Checked | None = None


@dataclass(frozen=True)
class Persona:
    """One probe's static identity.

    probe_id:  stable key of the probe (token accounting, records); unique in a roster.
    name, bio, interests: the persona the LLM wrote (at most five interests).
    behaviour: seed item ids, oldest first (the probe's starting history).
    attributes: demographics it came from (age, gender, occupation), if any.
    source:    how it was made: "llm", "template" (LLM output unusable), "merge", ...
    flags:     problems met while making it (e.g. "invalid_json_fallback").
    """

    probe_id: str
    name: str
    bio: str
    interests: tuple[str, ...] = ()
    behaviour: tuple[str, ...] = ()
    attributes: Mapping[str, Any] = field(default_factory=dict)
    source: str = "llm"
    flags: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "interests", tuple(self.interests)[:MAX_INTERESTS])
        object.__setattr__(self, "behaviour", tuple(str(i) for i in self.behaviour))
        object.__setattr__(self, "flags", tuple(self.flags))
        object.__setattr__(self, "attributes", dict(self.attributes))

    def to_probe_spec(self) -> ProbeSpec:
        """The env-side view: history = behaviour, profile = bio (the embedding boxes mix it in)."""
        return ProbeSpec(history=self.behaviour, profile=self.bio or None, attributes=dict(self.attributes),
                         name=self.probe_id)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("interests", "behaviour", "flags"):
            d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Persona":
        """A persona from its dict (a roster file, a cache, an artefact), checked field by field.

        A value of the wrong type is a `ValueError` naming the field: `"behaviour": "12"` is not
        taken for the items "1" and "2", nor a string `interests` for single characters."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a persona is an object, got {type(data).__name__}")
        known = {k: list(data[k]) if isinstance(data[k], tuple) else data[k]
                 for k in cls.__dataclass_fields__ if k in data}
        return cls(**_persona_schema().validate_python(known, strict=True).model_dump(exclude_unset=True))
