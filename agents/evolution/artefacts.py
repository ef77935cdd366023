"""The evolution loop's artefact folder: atomic JSON/NumPy files plus a ledger of finished phases.

A phase writes its artefacts first and its ledger entry last, so a killed run finds either a
finished phase (entry present: load its artefacts) or an unfinished one (entry absent: run it
again; its LLM calls come back from the response cache). The ledger (`phases.json`) also holds
each phase's wall time and token use. Rosters (`roster_g{g}.json`, `final_roster.json`) are stored
as `roster_to_json` writes them.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ctrlsim.atomic import atomic_write_bytes
from ctrlsim.errors import DataFileError

from ..persona import Persona

LEDGER = "phases.json"
FINAL_ROSTER = "final_roster.json"


def roster_to_json(personas: Sequence[Persona], **extra) -> dict:
    return {**extra, "personas": [p.to_dict() for p in personas]}


def roster_from_json(data: dict) -> list[Persona]:
    return [Persona.from_dict(d) for d in data["personas"]]


class ArtefactFolder:
    """Phase artefacts under one folder (the run folder of `ctrlsim evolve`, or a method's work dir)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._ledger: dict[str, dict] = self.read_json(LEDGER, {"phases": {}})["phases"]

    def write_json(self, name: str, obj: Any) -> Path:
        return atomic_write_bytes(
            self.path / name, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()
        )

    def read_json(self, name: str, default: Any = None) -> Any:
        path = self.path / name
        if not path.exists():
            if default is None:
                raise DataFileError(path, "is missing (the phase that writes it has not finished)")
            return default
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataFileError(path, f"is not valid JSON ({exc})") from None

    def write_array(self, name: str, array: np.ndarray) -> Path:
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(array), allow_pickle=False)
        return atomic_write_bytes(self.path / name, buffer.getvalue())

    def read_array(self, name: str) -> np.ndarray:
        return np.load(self.path / name, allow_pickle=False)

    # ------------------------------------------------------------------ ledger
    def done(self, phase: str) -> bool:
        return phase in self._ledger

    def entry(self, phase: str) -> dict:
        return dict(self._ledger[phase])

    def finish(self, phase: str, entry: dict) -> None:
        """Record `phase` as finished (call after its artefacts are written)."""
        self._ledger[phase] = dict(entry)
        self.write_json(LEDGER, {"phases": self._ledger})

    def ledger(self) -> dict[str, dict]:
        return {k: dict(v) for k, v in self._ledger.items()}
