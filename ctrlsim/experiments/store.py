"""Incremental, resumable result files (JSON lines).

The first line holds the run's config; every later line is one finished unit of
work (a scenario, a user) under a unique key. A run that is interrupted and
started again with the same config skips the keys already written, so nothing
computed is lost and nothing is paid for twice. A different config on the same
file is an error (rather than silently mixing results).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from ctrlsim.errors import ConfigError, DataFileError


class ResultStore:
    def __init__(self, path: str | Path, config: dict, *, overwrite: bool = False):
        self.path = Path(path)
        self.config = json.loads(json.dumps(config, default=str))  # normalise (tuples -> lists)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._records: dict[str, dict] = {}
        if self.path.exists() and not overwrite:
            self._load()
        else:
            with open(self.path, "w") as fh:
                fh.write(json.dumps({"config": self.config}) + "\n")

    def _load(self) -> None:
        with open(self.path) as fh:
            lines = fh.read().splitlines()
        if not lines:
            raise DataFileError(self.path, "result file is empty (no config line)")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as exc:
            raise DataFileError(self.path, "first line is not JSON") from exc
        if header.get("config") != self.config:
            raise ConfigError(f"{self.path} holds results of another config; use another path or overwrite=True.\n"
                              f"stored: {header.get('config')}\nnow:    {self.config}")
        for n, line in enumerate(lines[1:], 2):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):  # a line cut short by an interruption: drop it, recompute that unit
                    break
                raise DataFileError(self.path, f"line {n} is not JSON")
            self._records[row["key"]] = row["record"]
        self._rewrite_if_truncated(len(self._records) + 1, lines)

    def _rewrite_if_truncated(self, good_lines: int, lines: list[str]) -> None:
        if good_lines < len(lines):
            with open(self.path, "w") as fh:
                fh.write("\n".join(lines[:good_lines]) + "\n")

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def add(self, key: str, record: dict[str, Any]) -> None:
        """Append one finished unit (flushed at once)."""
        if key in self._records:
            raise ConfigError(f"result key {key!r} already recorded in {self.path}")
        record = json.loads(json.dumps(record, default=_jsonable))
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"key": key, "record": record}) + "\n")
            fh.flush()
        self._records[key] = record

    def records(self) -> Iterator[tuple[str, dict]]:
        return iter(self._records.items())


def _jsonable(value):
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
