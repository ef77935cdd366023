"""Values from outside the process are validated (issue 20, point 3): rosters, cached personas and
hand-edited or damaged records, with the issue's reproductions."""
from __future__ import annotations

import json
import sqlite3

import pytest
from ctrlsim.agents.persona import Persona
from ctrlsim.agents.profiles import ProfileStore

from ctrlsim.errors import CacheCorruptionWarning, DamagedRecordWarning, DataFileError
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.ctrlbench.inputs import load_roster

GOOD = {"probe_id": "p1", "name": "Ann", "bio": "likes noir", "interests": ["noir"], "behaviour": ["12", 50]}


@pytest.mark.parametrize("field, value, named", [
    ("behaviour", "12", "behaviour"),          # would have become items "1" and "2"
    ("interests", "noir films", "interests"),  # would have become single characters
    ("behaviour", [True], "behaviour.0"),
    ("name", 3, "name"),
    ("attributes", ["age", 30], "attributes"),
    ("probe_id", "", "probe_id"),
])
def test_a_roster_entry_of_the_wrong_type_is_refused_naming_the_field(tmp_path, field, value, named):
    path = tmp_path / "roster.json"
    path.write_text(json.dumps([GOOD, {**GOOD, "probe_id": "p2", field: value}]), encoding="utf-8")
    with pytest.raises(DataFileError, match=rf"entry 1: {named}"):
        load_roster(path)


def test_a_good_roster_round_trips_and_keeps_integer_ids_as_strings(tmp_path):
    path = tmp_path / "roster.json"
    path.write_text(json.dumps([GOOD]), encoding="utf-8")
    (persona,) = load_roster(path)
    assert persona.behaviour == ("12", "50") and persona.interests == ("noir",)
    assert Persona.from_dict(persona.to_dict()) == persona


@pytest.mark.parametrize("stored", [
    '"a string"', '{"persona": {"probe_id": "p", "name": "n", "bio": "b"}}',
    '{"persona": {"probe_id": "p", "name": "n", "bio": "b", "behaviour": "12"}, "tokens": 5}',
    '{"persona": {"probe_id": "p", "name": "n", "bio": "b"}, "tokens": -1}',
])
def test_a_malformed_cached_persona_is_deleted_and_recomputed(tmp_path, stored):
    path = tmp_path / "profiles.sqlite"
    store = ProfileStore(path)
    store.put_many({"good": {"persona": {**GOOD}, "tokens": 7}})
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT OR REPLACE INTO profiles VALUES (?, ?)", ("bad", stored))
    store = ProfileStore(path)
    with pytest.warns(CacheCorruptionWarning, match="could not be read"):
        found = store.get_many(["good", "bad"])
    assert set(found) == {"good"}  # the bad one is missing, so its persona is written again
    assert len(store) == 1  # ... and it is gone from the file
    store.close()


@pytest.mark.parametrize("damage", ["a list", "no curves"])
def test_a_damaged_record_is_reported_by_line_and_recomputed(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    command = ["ctrlbench", "--methods", "random", "--recommenders", "popularity", "--targets", "War",
               "--agents", "1,1", "--rounds", "1", "--seeds", "0,1", "--out", str(out), "--figures", "false"]
    assert main(command) == 0
    lines = (out / "records.jsonl").read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[1])
    kept = dict(row["record"])
    row["record"] = [1, 2] if damage == "a list" else {k: v for k, v in kept.items() if k != "curves"}
    lines[1] = json.dumps(row)
    (out / "records.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.warns(DamagedRecordWarning, match=rf"line 2 \(key '{row['key']}'\)"):
        assert main(command) == 0
    from ctrlsim.experiments.ctrlbench.runner import RUNNER
    from ctrlsim.experiments.store import read_run_records

    records = read_run_records(out / "records.jsonl", RUNNER.record_fields)[1]
    assert records[row["key"]]["curves"] == kept["curves"]  # recomputed, equal to the first run's
