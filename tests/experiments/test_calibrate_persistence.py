"""`ctrlsim calibrate --task persistence`: the oracle's half-life against the dial's memory window,
its known answer (no window: censored), and the report's numbers recomputed by hand from the stored
records and from the protocol's own episodes."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.calibrate.config import CalibrateConfig
from ctrlsim.experiments.config import RunOptions, config_to_dict

WINDOWS = (4, 8, 16)
RELEASE = 6


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One persistence calibration at the defaults (oracle, K = 1, slates of 3, 2 + 4 + 6 rounds,
    seeds 0-2) on Sci-Fi, and the same episodes run by `ctrlsim ctrlbench --task persistence`."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CTRLSIM_CACHE", str(tmp_path_factory.mktemp("cache")))
    config = CalibrateConfig(task="persistence", targets=("Sci-Fi",))
    out = tmp_path_factory.mktemp("calibration")
    result = ctrlsim.run("calibrate", config=config, options=RunOptions(out=str(out)), show_progress=False)
    from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig

    episodes = ctrlsim.run("ctrlbench", config=CtrlBenchConfig(
        task="persistence", methods=("oracle",), recommenders=tuple(config.boxes()), targets=("Sci-Fi",),
        agents=(4, 1), rounds=4, baseline_rounds=2, release_rounds=RELEASE, seeds=(0, 1, 2), slate_size=3),
        options=RunOptions(out=str(tmp_path_factory.mktemp("ctrlbench")), figures=False), show_progress=False)
    yield config, result, episodes, out
    mp.undo()


def by_box(result) -> dict[str, dict[str, dict]]:
    """box -> observation id -> {half_life, observed, area, ...} from the stored unit records."""
    out: dict[str, dict[str, dict]] = {}
    for record in result.records_by_key.values():
        cell = out.setdefault(record["box"], {})
        for metric, values in record["values"].items():
            for obs_id, value in values.items():
                cell.setdefault(obs_id, {})[metric] = value
        for obs_id, flag in record["observed"]["half_life"].items():
            cell[obs_id]["observed"] = flag
    return out


def km_median(times, observed):
    """The Kaplan-Meier median by hand: the first time with S(t) = prod(1 - d/n) <= 1/2."""
    s = 1.0
    for t in sorted(set(times)):
        at_risk = sum(x >= t for x in times)
        deaths = sum(x == t and o for x, o in zip(times, observed))
        s *= 1 - deaths / at_risk
        if s <= 0.5:
            return t
    return None


def log_rank_p(a, b):
    """Two-sided log-rank p by hand: z = (O_a - E_a) / sqrt(V) over the distinct event times."""
    o = e = v = 0.0
    both = a + b
    for t in sorted({x for x, seen in both if seen}):
        n_a = sum(x >= t for x, _ in a)
        n = sum(x >= t for x, _ in both)
        d = sum(x == t and seen for x, seen in both)
        o += sum(x == t and seen for x, seen in a)
        e += d * n_a / n
        v += d * (n_a / n) * (1 - n_a / n) * (n - d) / max(n - 1, 1)
    return math.erfc(abs(o - e) / math.sqrt(v) / math.sqrt(2))


def test_the_half_life_rises_with_the_window_and_no_window_is_censored(calibrated):
    config, result, _, out = calibrated
    assert not result.failed and len(result.records_by_key) == (len(WINDOWS) + 1) * 3
    boxes = [f"dial:1:window={w}:base=random" for w in WINDOWS] + ["dial:1:base=random"]
    assert config.boxes() == boxes
    cells = by_box(result)
    assert all(len(cells[box]) == 3 for box in boxes)  # one episode per seed, each steered
    medians = [km_median([e["half_life"] for e in cells[box].values()],
                         [e["observed"] for e in cells[box].values()]) for box in boxes]
    # W = 4 and 8 halve within the release, 8 later; W = 16 keeps the steering through it, as does the
    # box without a window (the known answer): censored at the last release round in every episode
    assert medians[0] < medians[1] <= RELEASE and medians[2] is None and medians[3] is None
    for box in boxes[2:]:
        assert all(not e["observed"] and e["half_life"] == RELEASE for e in cells[box].values())
    # The table, recomputed: KM medians and events, the mean area, the known answer.
    table = result.tables["Half-life against the dial's memory window"]
    rows = {row["Box"]: row for _, row in table.iterrows()}
    for box, median in zip(boxes, medians):
        cell = rows[box]["half-life KM [95% CI] (events/n)"]
        assert cell.startswith("censored [censored, censored]" if median is None else f"{median:g} [")
        events = sum(e["observed"] for e in cells[box].values())
        assert cell.endswith(f"({events}/3)")
        area = np.mean([e["area"] for e in cells[box].values()])
        assert rows[box]["area"].startswith(f"{area:.2f}")
    known = result.tables["Known answer: no window"]
    assert known["Holds"].tolist() == ["yes"]
    assert known["Observed"].tolist() == ["0 of 3 steered episodes fell to half"]
    assert (out / "figures" / "calibration.png").stat().st_size > 0


def test_rho_and_the_resolution_by_hand(calibrated):
    from scipy.stats import spearmanr

    config, result, _, _ = calibrated
    cells = by_box(result)
    xs, ys = [], []
    for w in WINDOWS:
        for e in cells[config.window_box(w)].values():
            xs.append(w)
            ys.append(e["half_life"] if e["observed"] else RELEASE + 1)  # censored: ranked above all
    rho = spearmanr(xs, ys).statistic
    summary = result.summary
    assert rho > 0 and summary["rho"]["oracle"]["value"] == pytest.approx(rho)
    # each pair of windows by a log-rank test written out here; every pair is told apart at p < 0.05,
    # so the resolution is the grid's smallest step, 4
    windows = [test for test in summary["log_rank"]["oracle"] if test["b"] is not None]
    assert len(windows) == 3
    for test in windows:
        a, b = ([(e["half_life"], e["observed"]) for e in cells[config.window_box(w)].values()]
                for w in (test["a"], test["b"]))
        p = log_rank_p(a, b)
        assert test["p"] == pytest.approx(p) and p < 0.05
    # W = 16 and no window are both censored throughout: no test between them
    assert [t["p"] for t in summary["log_rank"]["oracle"] if (t["a"], t["b"]) == (16, None)] == [None]
    assert summary["resolution"]["oracle"]["value"] == 4
    table = result.tables["Resolution: the smallest window step told apart"]
    assert table["Resolution (W step)"].tolist() == ["4"]


def test_each_stored_half_life_is_what_the_episodes_rounds_say(calibrated):
    """The calibration's values against the same episodes run by ctrlbench, computed here from each
    round's stored target share: R(tau) = (s(tau) - s0) / (s* - s0), s* over the last 3 steering rounds."""
    config, result, episodes, _ = calibrated
    cells = by_box(result)
    for record in episodes.records_by_key.values():
        share = record["persistence"]["target_share"]
        s0, s_star = np.mean(share[:2]), np.mean(share[2:6][-3:])
        curve = [(x - s0) / (s_star - s0) for x in share[6:6 + RELEASE]]
        below = [tau for tau, r in enumerate(curve, 1) if r <= 0.5 + 1e-9]
        stored = cells[record["recommender"]][f"seed={record['seed']}/Sci-Fi"]
        assert stored["s0"] == pytest.approx(s0) and stored["s_star"] == pytest.approx(s_star)
        assert s_star - s0 > 0.05
        assert stored["half_life"] == (below[0] if below else RELEASE)
        assert stored["observed"] == bool(below)
        assert stored["area"] == pytest.approx(np.mean(curve))


def test_new_fields_leave_a_target_discovery_identity_unchanged():
    stored = config_to_dict(CalibrateConfig())
    assert not {"task", "windows", "baseline_rounds", "release_rounds"} & set(stored)
    assert set(config_to_dict(CalibrateConfig(task="persistence"))) - set(stored) == {"task"}


@pytest.mark.parametrize("kwargs,word", [
    ({"protocol": "steereval", "task": "persistence"}, "ctrlbench's"),
    ({"task": "persistence", "windows": ()}, "no memory window"),
    ({"task": "persistence", "windows": (2, 4, 2)}, "more than once"),
    ({"task": "persistence", "windows": (0, 2)}, "windows"),
    ({"task": "persistence", "windows": (2.5,)}, "integer"),
    ({"windows": (2, 3)}, "belong to --task persistence"),
    ({"release_rounds": 3}, "belong to --task persistence"),
    ({"task": "persistence", "dials": (0.0, 1.0)}, "lambda grid"),
    ({"task": "persistence", "dial_options": ("window=3",)}, "window from --windows"),
    ({"task": "persistence", "baseline_rounds": 0}, "baseline_rounds"),
    ({"task": "suppression"}, "task"),
])
def test_bad_persistence_configs_are_config_errors_before_anything_runs(kwargs, word, monkeypatch, tmp_path):
    import ctrlsim.experiments.driver as driver

    monkeypatch.setattr(driver, "drive", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(ConfigError, match=word):
        ctrlsim.run("calibrate", out=str(tmp_path / "run"), show_progress=False, **kwargs)
    assert not (tmp_path / "run").exists()


def test_the_resolution_needs_every_larger_step_told_apart():
    from ctrlsim.experiments.calibrate.persistence import resolution

    def tests(ps):
        return [{"a": a, "b": b, "p": p} for (a, b), p in ps.items()]

    # 2-4 not told apart, 4-8 and 2-8 are: every pair 4 or more apart is, so the resolution is 4
    assert resolution(tests({(2, 4): 0.3, (4, 8): 0.01, (2, 8): 0.001}))["value"] == 4
    # 4-8 told apart but the ends 2-8 are not: nothing is resolved
    assert resolution(tests({(2, 4): 0.3, (4, 8): 0.01, (2, 8): 0.2}))["value"] is None
    # an undefined test (no half-life observed in either) counts as not told apart; the unbounded box
    # (None) takes no part in the window steps
    res = resolution(tests({(2, 4): None, (2, None): 0.01}))
    assert res["value"] is None and res["steps"] == [{"delta": 2, "told_apart": 0, "pairs": 1, "max_p": 1.0}]
