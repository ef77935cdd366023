"""The audit's "Does control last?" section: a real audit of two dial boxes with the scripted probes
only (no LLM), its persistence numbers recomputed by hand from the sub-run's stored slates (numpy and
scipy here, never the code under test), the section in report.html, and the words on what each box
remembers."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from audit_checks import read_records, share_interval, t_interval
from markupsafe import escape

from ctrlsim.experiments.audit.config import PERSISTENCE_TARGETS, REPORT, SUMMARY, AuditConfig, plan_subruns
from ctrlsim.experiments.audit.persistence import box_memory, persistence_caveats
from ctrlsim.experiments.audit.runner import audit_main

STEERED = ("dial:0.5", "dial:1:window=2")  # the oracle moves the Crime share on both
BOXES = (*STEERED, "popularity")  # which ignores the user: nothing to retain
# ctrlbench and its calibration as small as they go: this file is about the persistence sub-run,
# which keeps the small size's own settings (the scripted probes, Crime, 2 + 8 + 8 rounds, six seeds)
CHEAP = {"ctrlbench": {"methods": ["oracle"], "rounds": 1, "seeds": [0, 1]},
         "calibrate-ctrlbench": {"dials": [0, 1]}}
Z = 1.959963984540054  # the normal quantile of a two-sided 95% interval


@pytest.fixture(scope="module")
def audited(tmp_path_factory, ml100k):
    out = tmp_path_factory.mktemp("audit-persistence") / "dials"
    config = out.parent / "audit-config.json"
    config.write_text(json.dumps(CHEAP))
    assert audit_main([BOXES[0], "--compare", *BOXES[1:], "--out", str(out), "--config", str(config)]) == 0
    return out


def _shares(record: dict, target: set[str]) -> list[float]:
    """Per round, the mean over the probes of the target share of the recommender slate shown."""
    rounds = len(record["probes"][0]["rounds"])
    out = []
    for t in range(rounds):
        played = [p["rounds"][t] for p in record["probes"]
                  if p["rounds"][t]["source"] == "recommender" and p["rounds"][t]["slate"]]
        out.append(float(np.mean([sum(i in target for i in r["slate"]) / len(r["slate"]) for r in played])))
    return out


def _episode(share: list[float], b: int, s: int, r: int) -> dict:
    """s0, s*, and where steering gained more than 5 points: R(tau), half-life, relapse and area."""
    s0, s_star = np.mean(share[:b]), np.mean(share[b:b + s][-3:])
    out = {"s0": s0, "s_star": s_star}
    if s_star - s0 > 0.05:
        curve = (np.asarray(share[b + s:b + s + r]) - s0) / (s_star - s0)
        below = np.flatnonzero(curve <= 0.5 + 1e-9)
        out.update(curve=curve, half_life=int(below[0]) + 1 if below.size else r, observed=bool(below.size),
                   relapse=1 - curve[-3:].mean(), area=curve.mean())
    return out


def _km(times, observed):
    """Kaplan-Meier median of the half-lives and its log-log 95% interval (Greenwood), by hand: the
    first time the curve, its lower band and its upper band reach 1/2 (the band is taken as S and 1
    where it is undefined, S = 1 or S = 0)."""
    t, seen = np.asarray(times, dtype=float), np.asarray(observed, dtype=bool)
    s, greenwood, found = 1.0, 0.0, [None, None, None]
    for u in sorted(set(t[seen])):
        n, d = int(np.sum(t >= u)), int(np.sum((t == u) & seen))
        s *= 1 - d / n
        greenwood = greenwood + d / (n * (n - d)) if n > d else np.inf
        if 0 < s < 1 and np.isfinite(greenwood):
            se = np.sqrt(greenwood) / abs(np.log(s))
            low, high = s ** np.exp(Z * se), s ** np.exp(-Z * se)
        else:
            low, high = s, 1.0
        for i, value in enumerate((s, low, high)):
            if found[i] is None and value <= 0.5:
                found[i] = u
    return found


def _log_rank(ta, sa, tb, sb) -> tuple[float, float]:
    """The two-sided log-rank test by hand: z = (O_a - E_a) / sqrt(V) over the event times."""
    from scipy.stats import norm

    t, seen = np.r_[ta, tb].astype(float), np.r_[sa, sb].astype(bool)
    group_a = np.r_[np.ones(len(ta)), np.zeros(len(tb))].astype(bool)
    o = e = v = 0.0
    for u in sorted(set(t[seen])):
        at_risk = t >= u
        n, na = at_risk.sum(), (at_risk & group_a).sum()
        d, da = ((t == u) & seen).sum(), ((t == u) & seen & group_a).sum()
        o, e = o + da, e + d * na / n
        v += d * (na / n) * (1 - na / n) * (n - d) / (n - 1) if n > 1 else 0.0
    z = (o - e) / np.sqrt(v)
    return float(z), float(2 * norm.sf(abs(z)))


def _by_hand(audited, ml100k) -> dict:
    records = read_records(audited / "persistence")
    [target] = PERSISTENCE_TARGETS
    items = set(ml100k.items_with_tag(target))
    cells: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        plan = record["phases"]
        share = _shares(record, items)
        assert record["persistence"]["target_share"] == pytest.approx(share)
        episode = _episode(share, plan["baseline"], plan["steer"], plan["release"])
        release = range(plan["baseline"] + plan["steer"], len(share))
        episode["release_likes"] = np.mean([sum(len(p["rounds"][t]["liked"]) for t in release)
                                            for p in record["probes"]])
        cells.setdefault((record["recommender"], record["method"]), []).append(episode)
    return cells


def test_every_box_gets_a_persistence_subrun_at_its_size():
    for size, methods in (("small", ["oracle", "random"]), ("medium", ["base-small", "oracle", "random"]),
                          ("paper", ["base-small", "oracle", "random"])):
        plan = {s.name: s for s in plan_subruns(AuditConfig(boxes=("narm", "embedding"), size=size))}
        fields = plan["persistence"].fields
        assert plan["persistence"].protocol == "ctrlbench" and fields["task"] == "persistence"
        assert list(fields["methods"]) == methods and fields["recommenders"] == ("narm", "embedding")
        assert fields["targets"] == PERSISTENCE_TARGETS and fields["slate_size"] == 3
    assert "persistence" not in {s.name for s in plan_subruns(AuditConfig(boxes=("llm:qwen2.5-0.5b",)))}


def test_the_section_holds_the_runners_numbers_as_computed_by_hand(audited, ml100k):
    summary = json.loads((audited / SUMMARY).read_text())
    ps = summary["subruns"]["persistence"]["numbers"]
    assert ps["task"] == "persistence" and ps["boxes"] == list(BOXES) and ps["targets"] == ["Crime"]
    assert ps["phases"] == {"baseline": 2, "steer": 8, "release": 8, "release_mode": "baseline"}
    cells = _by_hand(audited, ml100k)
    assert set(cells) == {(b, m) for b in BOXES for m in ("oracle", "random")}
    for (box, method), episodes in cells.items():
        cell = ps["cells"][box][method]
        steered = [e for e in episodes if "curve" in e]
        assert (cell["episodes"], cell["steered"]) == (len(episodes), len(steered)) == (6, len(steered))
        for name in ("s0", "s_star"):  # shares: the bounded bootstrap interval
            mean, low, high = share_interval([e[name] for e in episodes])
            assert [cell[name][k] for k in ("value", "low", "high")] == pytest.approx([mean, low, high])
        mean, low, high = t_interval([e["release_likes"] for e in episodes])
        assert cell["release_likes"]["value"] == pytest.approx(mean)
        if not steered:
            assert cell["half_life"]["n"] == 0 and cell["retention"]["mean"] == []
            continue
        for name in ("relapse", "area"):
            mean, low, high = t_interval([e[name] for e in steered])
            assert cell[name]["value"] == pytest.approx(mean) and cell[name]["n"] == len(steered)
            if len(steered) > 1:
                assert [cell[name]["low"], cell[name]["high"]] == pytest.approx([low, high])
        band = cell["retention"]
        assert band["tau"] == list(range(1, 9)) and band["n"] == len(steered)
        for tau in range(8):
            mean, low, high = t_interval([e["curve"][tau] for e in steered])
            assert band["mean"][tau] == pytest.approx(mean)
            if len(steered) > 1:
                assert [band["low"][tau], band["high"][tau]] == pytest.approx([low, high])
        median, low, high = _km([e["half_life"] for e in steered], [e["observed"] for e in steered])
        h = cell["half_life"]
        assert (h["median"], h["low"], h["high"]) == (median, low, high)
        assert (h["events"], h["n"]) == (sum(e["observed"] for e in steered), len(steered))
    # the oracle steered both dial boxes in most episodes (the reason Crime is the audit's target)
    assert all(ps["cells"][box]["oracle"]["steered"] >= 4 for box in STEERED)
    assert all(ps["cells"]["popularity"][m]["steered"] == 0 for m in ("oracle", "random"))
    [row] = [r for r in ps["log_rank"] if r["method"] == "oracle"]
    a = [e for e in cells[(row["box_a"], "oracle")] if "curve" in e]
    b = [e for e in cells[(row["box_b"], "oracle")] if "curve" in e]
    z, p = _log_rank([e["half_life"] for e in a], [e["observed"] for e in a],
                     [e["half_life"] for e in b], [e["observed"] for e in b])
    assert (row["box_a"], row["box_b"]) == STEERED and (row["n_a"], row["n_b"]) == (len(a), len(b))
    assert row["z"] == pytest.approx(z) and row["p"] == pytest.approx(p)


def test_the_report_has_the_section_its_words_and_its_figure(audited):
    summary = json.loads((audited / SUMMARY).read_text())
    html = (audited / REPORT).read_text()
    ps = summary["subruns"]["persistence"]["numbers"]
    assert '<section id="persistence">' in html and "Does control last? Steer, then release" in html
    assert 'alt="Retention after release with 95% bands"' in html
    for line in ps["reading"] + ps["log_rank_reading"] + ps["limits"]:
        assert str(escape(line)) in html  # as the autoescaping template writes text
    for box in BOXES:
        assert f"Does control last on {box}?" in " ".join(summary["headline_text"])
        assert str(escape(ps["memory"][box]["text"])) in html
    for box in STEERED:
        assert f"in {ps['cells'][box]['oracle']['steered']} of 6 episodes" in " ".join(ps["reading"])
        h = ps["cells"][box]["oracle"]["half_life"]  # the table's cell: an undefined upper bound says why
        high = f"{h['high']:g}" if h["high"] is not None else "open" if h["events"] == h["n"] else "censored"
        assert f'<td class="n">{h["median"]:g} [{h["low"]:g}, {high}] ({h["events"]}/{h["n"]})</td>' in html
    assert "popularity, the oracle probe (upper bound): the share of Crime items" in " ".join(ps["reading"])
    assert "in none of the 6 episodes did steering raise it by more than 5 points" in " ".join(ps["reading"])
    assert ps["memory"]["dial:1:window=2"]["window"] == 2 and ps["memory"]["dial:0.5"]["window"] is None
    # the window caveat uses the likes the probes gave in release (each gave more than the window of 2)
    assert any("dial:1:window=2: the oracle probe (upper bound) gave" in c and "had left its window" in c
               for c in summary["caveats"])
    entries = [e for e in summary["headline"] if e["metric"] == "half_life"]
    assert {(e["box"], e["method"]) for e in entries} == {(b, m) for b in BOXES for m in ("oracle", "random")}


def test_what_each_box_remembers():
    assert box_memory("embedding")["window"] is None and "never" in box_memory("embedding")["text"]
    assert box_memory("narm")["window"] == 20 and "last 20 liked items" in box_memory("narm")["text"]
    assert box_memory("recbole:GRU4Rec")["window"] == 20
    assert box_memory("popularity")["window"] == 0 and box_memory("dial:0")["window"] == 0
    assert box_memory("dial:1:window=5")["window"] == 5
    assert "starting history" in box_memory("dial:1:follow=history")["text"]
    assert "not known" in box_memory("http://localhost:8000")["text"]


def test_a_release_shorter_than_the_window_is_a_caveat():
    cell = {"label": "oracle", "episodes": 6, "steered": 4, "release_likes": {"value": 12.0}}
    numbers = {"boxes": ["narm"], "min_gain": 0.05, "cells": {"narm": {"oracle": cell}},
               "memory": {"narm": box_memory("narm")}}
    [line] = persistence_caveats({"subruns": {"persistence": {"numbers": numbers}}})
    assert "gave 12.0 likes each in release, fewer than the 20 liked items narm reads" in line


def test_other_tasks_have_no_persistence_summary():
    from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig
    from ctrlsim.experiments.ctrlbench.persistence import run_summary

    for task in ("target-discovery", "profile-shaping"):
        config = CtrlBenchConfig(methods=("oracle",), recommenders=("popularity",), task=task)
        assert run_summary(SimpleNamespace(config=config), {}) == {}


@pytest.mark.parametrize("fields, message", [
    ({"task": "target-discovery"}, "task is the audit's own"),
    ({"recommenders": ["narm"]}, "recommenders is the audit's own"),
    ({"release_rounds": 0}, "release_rounds must be in"),
])
def test_persistence_settings_the_audit_owns_or_refuses(fields, message, tmp_path, capsys):
    from ctrlsim.experiments.cli import main

    config = tmp_path / "audit-config.json"
    config.write_text(json.dumps({"persistence": fields}))
    assert main(["audit", "popularity", "--config", str(config), "--out", str(tmp_path / "a")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
