"""Calibrate's pass^k table: values by hand from the records, and its known answers (the oracle at
lambda = 1 always succeeds; at lambda = 0 the fixed ranking decides which tries can succeed)."""
from __future__ import annotations

from math import comb

import pytest

import ctrlsim

FIELDS = dict(methods=("oracle", "random"), dials=(0.0, 1.0), seeds=(0, 1, 2, 3),
              targets=("War+Film-Noir", "Crime"), agents=(1, 1), rounds=4)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal-passk") / "run"
    return ctrlsim.run("calibrate", out=out, show_progress=False, **FIELDS)


def _table(result):
    return next(t for name, t in result.tables.items() if name.startswith("pass^k of control"))


def test_pass_k_cells_are_c_choose_k_over_n_choose_k_averaged_over_targets(calibrated):
    for row in _table(calibrated).to_dict("records"):
        box = {"lambda = 0": "dial:0", "lambda = 1": "dial:1"}[row["Box"]]
        per_target: dict[str, list[bool]] = {}
        for r in calibrated.records:
            if r["method"] == row["Method"].split()[0] and r["box"] == box:
                for obs, value in r["values"]["coverage"].items():
                    per_target.setdefault(obs.split("/", 1)[1], []).append(value >= 5.0)
        assert len(per_target) == 2 and all(len(f) == 4 for f in per_target.values())
        for k in (1, 2, 3, 4):
            by_hand = sum(comb(sum(f), k) / comb(len(f), k) for f in per_target.values()) / len(per_target)
            # cells show 2 decimals
            assert float(row[f"pass^{k}"].split()[0]) == pytest.approx(by_hand, abs=0.0051)


def test_known_answers_hold_for_the_oracle_at_both_ends(calibrated):
    table = _table(calibrated)
    rows = {(r["Method"].split()[0], r["Box"]): (r["Known answer"], r["Holds"])
            for r in table.to_dict("records")}
    known, holds = rows[("oracle", "lambda = 1")]
    assert known.startswith("1 for every k") and holds == "yes"
    known, holds = rows[("oracle", "lambda = 0")]
    assert known.startswith("= the fixed ranking") and holds == "yes"
    assert rows[("random", "lambda = 0")][0].startswith("<= the fixed ranking")
    assert rows[("random", "lambda = 1")] == ("none known", "-")


def test_a_threshold_the_oracle_cannot_reach_fails_the_known_answer(tmp_path, calibrated):
    """At a bar of 90% Coverage the oracle at lambda = 1 no longer always succeeds: 'NO', not hidden."""
    from dataclasses import replace

    from ctrlsim.experiments.calibrate.reliability import pass_k_table
    from ctrlsim.experiments.calibrate.report import observations

    config = replace(calibrated.context.config, success_threshold=0.9)
    table = pass_k_table(config, observations(calibrated.records_by_key), calibrated.records_by_key)
    rows = {(r[0], r[1]): r[-1] for r in table.frame.itertuples(index=False)}
    assert rows[("oracle", "lambda = 1")] == "NO"
