"""`ctrlsim ctrlbench --task responsiveness`: counterfactual arms, counts recomputed by hand from
both arms' stored slates, and the known answers (dial strengths, a box that ignores the buttons)."""
import pytest

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig, episode_key
from ctrlsim.experiments.ctrlbench.responsiveness import feedback_counts, responsiveness_table
from ctrlsim.metrics.responsiveness import implied_strength, responsiveness


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


BOXES = ("dial:0", "dial:0:neg=0.5", "dial:0:neg=1", "popularity", "embedding")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = CtrlBenchConfig(task="responsiveness", methods=("random",), recommenders=BOXES, targets=("War",),
                             agents=(3, 3), rounds=4, seeds=(0, 1, 2, 3, 4, 5))
    out = tmp_path_factory.mktemp("responsiveness")
    result = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(out / "run")),
                         show_progress=False)
    assert not result.failed
    return config, result.records_by_key


def test_fields_belong_to_the_task():
    with pytest.raises(ConfigError, match="belong to --task responsiveness"):
        CtrlBenchConfig(fork_round=3)
    with pytest.raises(ConfigError, match="unknown value"):
        CtrlBenchConfig(task="responsiveness", feedback_actions=("shout",))
    assert CtrlBenchConfig(task="responsiveness", rounds=4, fork_round=3).episode_rounds == 7


def test_counts_are_what_both_arms_showed(run, ml100k):
    config, records = run
    tags = {str(i): set(t) for i, t in zip(ml100k.item_ids, ml100k.items["tags"])}
    checked = 0
    for record in records.values():
        fork = record["responsiveness"]["fork_round"]
        for probe in record["responsiveness"]["probes"]:
            n = next(k for k, p in enumerate(record["probes"]) if p["probe_id"] == probe["probe_id"])
            skip = [r["slate"] for r in record["probes"][n]["rounds"][fork:fork + 4]]
            assert probe["slates_after"]["skip"] == skip  # the skip arm is the stored episode
            # the dismissed item: the first one not liked on the fork round's slate
            fork_round = record["probes"][n]["rounds"][fork - 1]
            assert probe["item"] == next(i for i in fork_round["slate"] if i not in fork_round["liked"])
            for action, slates in probe["slates_after"].items():
                similar = sum(bool(tags[j] & tags[probe["item"]]) for s in slates for j in s)
                assert probe["counts"][action]["similar"] == similar
                blocked = sum(probe["block"] in tags[j] for s in slates for j in s)
                assert probe["counts"][action]["block_similar"] == blocked
            checked += 1
    assert checked >= 30


def _pooled(records, box, action="not_interested"):
    recs = [r for r in records.values() if r["recommender"] == box]
    fb, skip, shown = feedback_counts(recs, action)
    return fb, skip, shown, responsiveness(fb, skip)


def test_known_answers_of_the_dial_strength_and_of_a_box_that_ignores_the_buttons(run):
    config, records = run
    for box in ("dial:0", "popularity"):  # no-ops: both arms show the same slates
        for action in config.feedback_actions:
            fb, skip, _, est = _pooled(records, box, action)
            assert fb == skip and sum(skip) > 0 and est.value == 0.0
    for action in config.feedback_actions:
        fb, skip, _, est = _pooled(records, "dial:0:neg=1", action)
        assert sum(fb) == 0 and sum(skip) > 0 and est.value == 1.0
    fb, skip, shown, est = _pooled(records, "dial:0:neg=0.5")
    density = sum(skip) / sum(shown)
    low, value, high = (implied_strength(x, density) for x in (est.low, est.value, est.high))
    assert 0 < value < 1 and low <= 0.5 <= high  # the dial's strength is recovered within the interval
    fb, skip, _, est = _pooled(records, "embedding")
    assert est.value > 0  # the embedding box moves away from what was dismissed
    table = responsiveness_table(config, records)
    row = next(r for r in table.rows if r[0] == "dial:0:neg=1" and r[2] == "dislike")
    assert row[7] == "100.0 [100.0, 100.0]%" and "neg=1" in row[9]
    ignored = next(r for r in table.rows if r[0] == "popularity" and r[2] == "block")
    assert ignored[7] == "0.0 [0.0, 0.0]%" and ignored[9].startswith("ignored")
    assert records[episode_key("random", "popularity", "War", 0)]["negative_feedback"].startswith("ignored")
