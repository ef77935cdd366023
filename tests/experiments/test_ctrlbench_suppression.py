"""`ctrlsim ctrlbench --task suppression`: steering away from a tag the box already shows, from
histories rich in it, against steering toward it; effects and asymmetry recomputed by hand from the
stored slates."""
import numpy as np
import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig, episode_key, parse_key
from ctrlsim.experiments.ctrlbench.suppression import asymmetry_table, paired_directions


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


def suppression(**kw):
    """The oracle on the dial box that follows every liked item (lambda = 1): no model runs."""
    base = dict(task="suppression", methods=("oracle",), recommenders=("dial:1",), targets=("Sci-Fi",),
                agents=(3, 3), rounds=4, baseline_rounds=2, release_rounds=3, seeds=(0, 1, 2))
    return CtrlBenchConfig(**{**base, **kw})


def test_every_episode_runs_toward_and_away_under_its_own_key():
    config = suppression()
    assert config.keys()[:2] == ["oracle|dial:1|Sci-Fi|seed=0|toward", "oracle|dial:1|Sci-Fi|seed=0|away"]
    assert len(config.keys()) == 2 * len(config.seeds)
    assert parse_key("oracle|dial:1|Sci-Fi|seed=0|away") == ("oracle", "dial:1", "Sci-Fi", 0)
    with pytest.raises(ConfigError, match="toward or |away"):
        parse_key("oracle|dial:1|Sci-Fi|seed=0|sideways")
    assert config.phase_plan("away").to_dict()["direction"] == "away"
    assert "direction" not in config.phase_plan().to_dict()  # toward plans are stored as before
    with pytest.raises(ConfigError, match="belong to --task persistence or suppression"):
        CtrlBenchConfig(task="target-discovery", baseline_rounds=3)


def _share(record, n):
    """Round n's target share, by hand from the stored slates (mean over the probes)."""
    target = set(record["_target"])
    shares = [sum(i in target for i in p["rounds"][n]["slate"]) / len(p["rounds"][n]["slate"])
              for p in record["probes"]]
    return sum(shares) / len(shares)


def test_away_starts_rich_in_the_target_never_likes_it_and_the_asymmetry_is_what_the_slates_say(
        ml100k, tmp_path):
    config = suppression()
    run = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "run"), figures=True),
                      show_progress=False)
    assert not run.failed and len(run.records_by_key) == 6
    scifi = set(ml100k.items_with_tag("Sci-Fi"))
    effects = {}
    for seed in config.seeds:
        for direction in ("toward", "away"):
            record = run.records_by_key[episode_key("oracle", "dial:1", "Sci-Fi", seed, direction)]
            assert record["direction"] == direction
            rich = [sum(i in scifi for i in p["behaviour"]) / len(p["behaviour"]) for p in record["personas"]]
            if direction == "away":  # at least half of each seed history carries the tag
                assert min(rich) >= 0.5
                steer_likes = [i for p in record["probes"] for r in p["rounds"] if r["phase"] == "steer"
                               for i in r["liked"]]
                assert steer_likes and not set(steer_likes) & scifi
            record["_target"] = scifi
            shares = [_share(record, n) for n in range(9)]
            assert np.allclose(shares, record["persistence"]["target_share"])
            s0, s_star = np.mean(shares[:2]), np.mean(shares[2:6][-3:])
            effects[(seed, direction)] = (s0 - s_star) if direction == "away" else (s_star - s0)
    # The dial follows the likes: the oracle moves it both ways on every seed.
    assert all(effects[(s, d)] > 0 for s in config.seeds for d in ("toward", "away"))
    pairs = paired_directions(run.records_by_key)[("dial:1", "oracle", "Sci-Fi")]
    for side, direction in ((0, "toward"), (1, "away")):
        assert [round(pair[side]["effect"], 9) for pair in pairs] == \
            [round(effects[(s, direction)], 9) for s in config.seeds]
    table = asymmetry_table(config, run.records_by_key, {"Sci-Fi": frozenset(scifi)})
    diffs = [effects[(s, "toward")] - effects[(s, "away")] for s in config.seeds]
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * np.std(diffs, ddof=1) / np.sqrt(3)
    assert table.rows[0][8] == f"{100 * np.mean(diffs):.2f} ± {100 * half:.2f}"
    away = [r for r in run.records_by_key.values() if r["direction"] == "away"]
    steering = [x for r in away for p in r["probes"] for x in p["rounds"] if x["phase"] == "steer"]
    shown, liked = [i for x in steering for i in x["slate"]], [i for x in steering for i in x["liked"]]
    others = [i for i in shown if i not in scifi]
    assert table.rows[0][13] == f"0 (0/{len(shown) - len(others)})"
    assert table.rows[0][14] == f"{100 * len(liked) / len(others):.0f} ({len(liked)}/{len(others)})"
    text = (tmp_path / "run" / "tables.md").read_text()
    assert "Toward or away: the asymmetry of steering" in text
    assert "Steering away: does the suppression last?" in text
    assert (tmp_path / "run" / "figures" / "share_by_round.png").is_file()
    assert (tmp_path / "run" / "figures" / "effort_curves.png").is_file()
