"""`ctrlsim ctrlbench --task persistence`: steer-then-release episodes, recorded phase by phase, and
their retention tables computed by hand from the stored rounds."""
import numpy as np
import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig, episode_key


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def persistence(**kw):
    """The oracle on a dial box at lambda = 1 that follows every liked item: it never forgets
    (no window), or forgets after two likes (window=2). No model runs."""
    base = dict(task="persistence", methods=("oracle",), recommenders=("dial:1", "dial:1:window=2"),
                targets=("Sci-Fi",), agents=(3, 3), rounds=4, baseline_rounds=2, release_rounds=5,
                seeds=(0, 1, 2))
    return CtrlBenchConfig(**{**base, **kw})


@pytest.mark.parametrize("kw, message", [
    ({"task": "target-discovery"}, "belong to --task persistence"),
    ({"release": "forget"}, "release"),
    ({"baseline_rounds": 0}, "baseline_rounds"),
    ({"release_rounds": 0}, "release_rounds"),
    ({"recommenders": ("dial:1:window=0",)}, "window"),
])
def test_bad_phase_settings_are_config_errors_before_anything_runs(kw, message):
    with pytest.raises(ConfigError, match=message):
        persistence(**kw)


def _retention(share, b, s, r, last_k=3, min_gain=0.05):
    """R(tau) by hand: (s(tau) - s0) / (s* - s0), s0 the baseline mean, s* the last steering rounds."""
    s0 = sum(share[:b]) / b
    steer = share[b:b + s][-last_k:]
    s_star = sum(steer) / len(steer)
    if s_star - s0 <= min_gain:
        return None
    return [(x - s0) / (s_star - s0) for x in share[b + s:b + s + r]]


def test_phases_are_recorded_and_retention_is_what_the_rounds_say(ml100k, tmp_path):
    config = persistence()
    run = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "run"), figures=True),
                      show_progress=False)
    assert not run.failed and len(run.records_by_key) == 6
    scifi = set(ml100k.items_with_tag("Sci-Fi"))
    curves = {}
    for box in config.recommenders:
        for seed in config.seeds:
            record = run.records_by_key[episode_key("oracle", box, "Sci-Fi", seed)]
            assert record["phases"] == {"baseline": 2, "steer": 4, "release": 5, "release_mode": "baseline"}
            for probe in record["probes"]:
                phases = ["baseline"] * 2 + ["steer"] * 4 + ["release"] * 5
                assert [r["phase"] for r in probe["rounds"]] == phases
                # the oracle likes Sci-Fi films only while steering
                steer_likes = [i for r in probe["rounds"] if r["phase"] == "steer" for i in r["liked"]]
                assert set(steer_likes) <= scifi
            # the recorded share: per round, the mean over probes of Sci-Fi films on the slate
            slates = [[p["rounds"][t]["slate"] for p in record["probes"]] for t in range(11)]
            share = [float(np.mean([sum(i in scifi for i in s) / len(s) for s in round_slates]))
                     for round_slates in slates]
            assert record["persistence"]["target_share"] == pytest.approx(share)
            curves[(box, seed)] = _retention(share, 2, 4, 5)
    # The known answers: without a window the box keeps following the steering likes (never back to
    # half), with a window of two likes it is back to baseline within the release.
    never = [c for (box, _), c in curves.items() if box == "dial:1" and c is not None]
    assert never and all(min(c) > 0.5 for c in never)
    forgets = [c for (box, _), c in curves.items() if box == "dial:1:window=2" and c is not None]
    assert forgets and all(min(c) <= 0.5 for c in forgets)
    table = run.tables["Does control last? Retention after steering stops"]
    rows = {row["Black-Box"]: row for _, row in table.iterrows()}
    assert rows["dial:1"]["half-life KM [95% CI] (events/n)"] == \
        f"censored [censored, censored] (0/{len(never)})"
    windowed = rows["dial:1:window=2"]["half-life KM [95% CI] (events/n)"]
    assert windowed.endswith(f"({len(forgets)}/{len(forgets)})")
    assert rows["dial:1"]["steered"] == f"{len(never)}/3"
    area = np.mean([np.mean(c) for c in never])
    assert rows["dial:1"]["area"].startswith(f"{area:.2f}")
    assert (tmp_path / "run" / "figures" / "retention_by_round.png").stat().st_size > 0


def test_a_persistence_run_resumes_to_the_same_records(tmp_path):
    config = persistence(recommenders=("dial:1:window=2",), seeds=(0, 1))
    whole = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "whole")),
                        show_progress=False)
    ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "part")),
                show_progress=False, max_units=1, raise_on_failure=False)
    resumed = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "part")),
                          show_progress=False)

    def without_timing(records):
        return {k: {f: v for f, v in r.items() if f != "timing"} for k, r in records.items()}

    assert without_timing(resumed.records_by_key) == without_timing(whole.records_by_key)


def test_away_episodes_are_read_on_the_complement_and_searches_are_effort_of_their_own(tmp_path):
    from ctrlsim.experiments.ctrlbench.persistence import episode_persistence

    share = [0.6, 0.6, 0.5, 0.3, 0.2, 0.2, 0.3, 0.5]  # baseline 2, steering 4, release 2
    record = {"phases": {"baseline": 2, "steer": 4, "release": 2, "release_mode": "baseline",
                         "direction": "away"},
              "allow_search": True,
              "persistence": {"target_share": share, "likes": [1, 1, 2, 2, 1, 1, 0, 0],
                              "searches": [0, 0, 1, 0, 1, 1, 0, 0]}}
    got = episode_persistence(record)
    s0, s_star = 0.6, (0.3 + 0.2 + 0.2) / 3  # target shares, as stored
    assert got["s0"] == pytest.approx(s0) and got["s_star"] == pytest.approx(s_star)
    # R(tau) = (s0 - s(tau)) / (s0 - s*): the share of the reduction kept
    assert got["curve"] == pytest.approx([(s0 - 0.3) / (s0 - s_star), (s0 - 0.5) / (s0 - s_star)])
    assert (got["half_life"], got["observed"]) == (2, True)
    # likes until the share fell to s0 / 2 = 0.3: rounds with 2 and 2 likes; searches: 1 then 0
    assert (got["effort"], got["effort_reached"]) == (4, True)
    assert (got["search_effort"], got["search_reached"]) == (1, True)
    toward = {**record, "phases": {k: v for k, v in record["phases"].items() if k != "direction"},
              "allow_search": False}
    assert episode_persistence(toward)["curve"] is None  # toward, the share fell: not steered
    assert "search_effort" not in episode_persistence(toward)
