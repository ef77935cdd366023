"""`ctrlsim controls`: declared controls checked against the box's own slates; the reference box's
honest control passes, its dead control fails, and its non-profiled mode passes (fails when fake),
each verdict recomputed by hand from the stored slates."""
import numpy as np
import pytest
from scipy.stats import spearmanr

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.recommenders import UserState, make_recommender
from ctrlsim.recommenders.controls import Control, Controls


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def _run(box, tmp_path):
    run = ctrlsim.run("controls", boxes=(box,), users=8, points=3, seeds=(0, 1),
                      options=RunOptions(out=str(tmp_path / box)), show_progress=False)
    assert not run.failed
    return run


def test_the_honest_control_passes_the_dead_one_fails_and_the_numbers_are_the_slates(ml100k, tmp_path):
    run = _run("reference-controls", tmp_path)
    tags = {str(i): set(t) for i, t in zip(ml100k.item_ids, ml100k.items["tags"])}
    summary = run.summary["boxes"]["reference-controls"]
    verdicts = {c["control"]: c for c in summary["controls"]}
    assert verdicts["diversity"]["verdict"] == "PASS" and verdicts["freshness"]["verdict"] == "FAIL"
    xs, ys = [], []
    for record in run.records_by_key.values():
        if record.get("control") != "diversity":
            continue
        for slate, value in zip(record["slates"], record["values"]):
            assert value == pytest.approx(len(set().union(*(tags[i] for i in slate))) / len(slate))
            xs.append(record["value"])
            ys.append(value)
    assert verdicts["diversity"]["rho"]["value"] == pytest.approx(spearmanr(xs, ys).statistic)
    assert verdicts["diversity"]["rho"]["low"] > 0
    assert verdicts["freshness"]["rho"]["value"] is None or np.isnan(verdicts["freshness"]["rho"]["value"])
    assert summary["non_profiled"]["verdict"] == "PASS"
    assert "Art. 27" in verdicts["diversity"]["article"]
    assert "Art. 38" in summary["non_profiled"]["article"]


def test_a_non_profiled_mode_that_still_profiles_fails(ml100k, tmp_path):
    run = _run("reference-controls-fake", tmp_path)
    assert run.summary["boxes"]["reference-controls-fake"]["non_profiled"]["verdict"] == "FAIL"
    record = next(r for r in run.records_by_key.values() if r["kind"] == "non_profiled")
    slates = record["non_profiled"]["slates"]
    for n, partner in enumerate(record["extreme_partner"]):
        a, b = set(slates[n]), set(slates[partner])
        assert record["non_profiled"]["extreme"][n] == pytest.approx(1 - len(a & b) / len(a | b))


def test_declared_controls_are_checked(ml100k):
    with pytest.raises(ConfigError, match="property 'speed'"):
        Control("x", "faster", "speed", low=0.0, high=1.0)
    with pytest.raises(ConfigError, match="either low and high"):
        Control("x", "more diverse", "diversity")
    control = Control("mix", "more popular", "popularity", choices=("off", "some", "lots"))
    assert control.default == "off" and control.sweep() == ["off", "some", "lots"]
    assert Control("d", "more diverse", "diversity", low=0.0, high=1.0).sweep(3) == [0.0, 0.5, 1.0]
    declared = Controls((control,), {"profiling": "off"})
    assert Controls.from_dict(declared.to_dict()) == declared
    with pytest.raises(ConfigError, match="unknown field"):
        Controls.from_dict({"controls": [{**control.to_dict(), "color": "red"}]})
    box = make_recommender("reference-controls", ml100k)
    with pytest.raises(ConfigError, match="declares no control 'volume'"):
        box.recommend([UserState(history=("1",), settings={"volume": 3})], 5)
    with pytest.raises(ConfigError, match=r"takes a number in \[0.0, 1.0\]"):
        box.recommend([UserState(history=("1",), settings={"diversity": 2})], 5)
    assert make_recommender("popularity", ml100k).controls == Controls()


def test_through_ctrlsim_serve_the_honest_control_passes_and_the_dead_one_fails(tmp_path):
    """The known answers hold for boxes behind HTTP: `GET /controls` declares them, settings travel
    with every state (contract version 2)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from http_servers import ServedBox

    honest, fake = ServedBox("reference-controls"), ServedBox("reference-controls-fake")
    try:
        run = ctrlsim.run("controls", boxes=(honest.url, fake.url), users=8, points=3, seeds=(0,),
                          options=RunOptions(out=str(tmp_path / "served")), show_progress=False)
    finally:
        honest.stop()
        fake.stop()
    assert not run.failed
    served = run.summary["boxes"][honest.url]
    verdicts = {c["control"]: c["verdict"] for c in served["controls"]}
    assert verdicts == {"diversity": "PASS", "freshness": "FAIL"}
    assert served["non_profiled"]["verdict"] == "PASS"
    assert run.summary["boxes"][fake.url]["non_profiled"]["verdict"] == "FAIL"
