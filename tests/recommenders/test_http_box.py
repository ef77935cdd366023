"""HTTP black boxes (`make_recommender("http://...")`) against real server processes on 127.0.0.1:
results through `ctrlsim serve` equal the in-process box's (stateless and stateful), the service's
faults (down, slow, throttled, broken answers, changed answers) behave as issue 24 asks, the token is
sent and never stored, and a recorded run replays offline bit-identically."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from http_servers import FaultyService, ServedBox, ctrlbench_curves, run_folder_text

from ctrlsim.errors import BackendUnavailableError, ConfigError
from ctrlsim.experiments.cli import main
from ctrlsim.recommenders import UserState, make_recommender
from ctrlsim.recommenders.http.client import (
    ExchangeChangedWarning,
    RecommenderResponseError,
    ReplayMissError,
    read_exchanges,
)

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def served_dial():
    box = ServedBox("dial:1")
    yield box
    assert box.stop() == 0


@pytest.fixture
def faulty(ml100k):
    service = FaultyService(ml100k)
    yield service
    service.close()


def _episode(env, seed: int, likes: list[list[int]]) -> list:
    observation, info = env.reset(seed=seed)
    seen = [observation["slate"].tolist()]
    for action in likes:
        observation, reward, _, _, info = env.step({"likes": np.array(action), "query": ""})
        seen.append((observation["slate"].tolist(), reward, info["slate_item_ids"]))
    return seen


@pytest.mark.parametrize("mode", ["stateless", "stateful"])
def test_an_episode_through_the_served_box_equals_the_in_process_one(served_dial, ml100k, mode):
    from ctrlsim.envs import ProbeEnv

    likes = [[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 0]]
    remote = ProbeEnv(
        f"{served_dial.url}#mode={mode}", dataset=ml100k, target="War", budget=5, allow_search=True
    )
    local = ProbeEnv("dial:1", dataset=ml100k, target="War", budget=5, allow_search=True)
    for seed in (0, 1):  # the second episode starts fresh accounts
        assert _episode(remote, seed, likes) == _episode(local, seed, likes)
    # A search round's results are shown elsewhere: a stateful service hears of them as "shown" events.
    for env in (remote, local):
        env.reset(seed=2)
        env.step({"likes": np.zeros(3), "query": "War"})
    a = remote.step({"likes": np.array([1, 0, 0]), "query": ""})
    b = local.step({"likes": np.array([1, 0, 0]), "query": ""})
    assert a[0]["slate"].tolist() == b[0]["slate"].tolist()


def test_ctrlbench_through_the_served_box_gives_the_in_process_records(served_dial, tmp_path):
    common = [
        "--methods",
        "random,oracle",
        "--targets",
        "War",
        "--agents",
        "3,3",
        "--rounds",
        "4",
        "--seeds",
        "0,1",
        "--figures",
        "false",
    ]
    assert (
        main(["ctrlbench", "--recommenders", served_dial.url, *common, "--out", str(tmp_path / "remote")])
        == 0
    )
    assert main(["ctrlbench", "--recommenders", "dial:1", *common, "--out", str(tmp_path / "local")]) == 0

    assert ctrlbench_curves(tmp_path / "remote") == ctrlbench_curves(tmp_path / "local")
    exchanges = read_exchanges(tmp_path / "remote" / "exchanges.jsonl")
    assert exchanges and all(e["endpoint"] == "/recommend" and e["status"] == 200 for e in exchanges)


def test_a_recorded_audit_replays_offline_bit_identically(ml100k, faulty, tmp_path):
    common = [
        "ctrlbench",
        "--methods",
        "random",
        "--recommenders",
        faulty.url,
        "--targets",
        "War",
        "--agents",
        "2,2",
        "--rounds",
        "3",
        "--seeds",
        "0",
        "--figures",
        "false",
    ]
    assert main([*common, "--out", str(tmp_path / "live")]) == 0
    faulty.close()  # the service is gone: the replay must not need it
    assert main([*common, "--out", str(tmp_path / "replayed"), "--replay", str(tmp_path / "live")]) == 0
    live, replayed = (
        (tmp_path / name / "records.jsonl").read_text().splitlines()[1:] for name in ("live", "replayed")
    )

    def without_timing(line):
        record = json.loads(line)
        record["record"].pop("timing", None)
        return record

    assert [without_timing(x) for x in live] == [without_timing(x) for x in replayed]
    # A replay of a run that asks something else fails loudly, naming what is missing.
    box = make_recommender(faulty.url, ml100k, replay=str(tmp_path / "live" / "exchanges.jsonl"))
    with pytest.raises(ReplayMissError, match="never sent this /recommend request"):
        box.recommend([UserState(history=("1", "2", "3"))], 3)


def test_a_service_stopped_mid_run_fails_its_units_and_a_rerun_completes(faulty, tmp_path, capsys):
    out = tmp_path / "run"
    command = [
        "ctrlbench",
        "--methods",
        "random",
        "--recommenders",
        f"{faulty.url}#retries=1&backoff=0",
        "--targets",
        "War",
        "--agents",
        "1,1",
        "--rounds",
        "2",
        "--seeds",
        "0,1",
        "--out",
        str(out),
        "--figures",
        "false",
    ]
    faulty.down = True
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "2 of 2 ctrlbench unit(s) failed" in err and "failed after 2 attempt(s)" in err
    assert (out / "records.jsonl").read_text().count('"key"') == 0  # nothing half-done is stored
    faulty.down = False
    assert main(command) == 0
    assert (out / "records.jsonl").read_text().count('"key"') == 2


def test_a_slow_service_times_out(ml100k, faulty):
    faulty.delay = 2.0
    box = make_recommender(f"{faulty.url}#timeout=0.3&retries=1&backoff=0", ml100k)
    started = time.perf_counter()
    with pytest.raises(BackendUnavailableError, match="failed after 2 attempt"):
        box.recommend([UserState(history=("1",))], 3)
    assert time.perf_counter() - started < 1.9  # two 0.3 s deadlines, not the 2 s answer


def test_a_429_storm_slows_the_run_without_failing_it(ml100k, faulty):
    faulty.throttle, faulty.retry_after = 6, "0.1"
    box = make_recommender(f"{faulty.url}#retries=0", ml100k)  # no retries: 429s are waited out anyway
    started = time.perf_counter()
    slate = box.recommend([UserState(history=("1",))], 3)[0]
    assert time.perf_counter() - started >= 0.6  # Retry-After honoured six times
    assert faulty.throttled == 6 and box.transport.stats["throttled"] == 6
    assert (
        slate.item_ids
        == make_recommender("popularity", ml100k).recommend([UserState(history=("1",))], 3)[0].item_ids
    )


@pytest.mark.parametrize(
    "fault, named",
    [
        ("malformed", "lists.0.items.0"),
        ("unknown", "lists[0].items[0]: unknown item id 'no-such-item'"),
        ("duplicate", "lists[0].items[1]: duplicate item"),
        ("short", "fewer than k=3"),
        ("not-json", "not JSON"),
    ],
)
def test_a_broken_answer_is_a_typed_error_naming_the_field_and_the_request(ml100k, faulty, fault, named):
    faulty.break_with = fault
    box = make_recommender(faulty.url, ml100k)
    with pytest.raises(RecommenderResponseError) as exc:
        box.recommend([UserState(history=("1",))], 3)
    assert named in str(exc.value) and "/recommend" in str(exc.value)


def test_broken_items_can_be_counted_and_skipped_instead(ml100k, faulty):
    faulty.break_with = "unknown"
    box = make_recommender(f"{faulty.url}#on_invalid=skip", ml100k)
    slate = box.recommend([UserState(history=("1",))], 3)[0]
    assert "no-such-item" not in slate.item_ids and len(slate) == 2
    assert box.stats["skipped_items"] == 1 and box.stats["short_lists"] == 1


def test_a_service_that_changes_its_answers_is_detected(ml100k, faulty, tmp_path):
    log = tmp_path / "exchanges.jsonl"
    faulty.shift = True
    box = make_recommender(faulty.url, ml100k, exchanges=str(log))
    state = [UserState(history=("1",))]
    first = box.recommend(state, 3)[0].item_ids
    with pytest.warns(ExchangeChangedWarning, match="answered .* differently"):
        second = box.recommend(state, 3)[0].item_ids
    assert first != second and box.stats["changed"] == 1
    entries = read_exchanges(log)
    assert [e.get("changed", False) for e in entries] == [False, True]
    assert entries[0]["key"] == entries[1]["key"]


def test_the_token_is_sent_and_never_stored(faulty, tmp_path, monkeypatch, capsys):
    secret = "s3cr3t-token-value"
    monkeypatch.setenv("MY_TOKEN", secret)
    out = tmp_path / "run"
    assert (
        main(
            [
                "ctrlbench",
                "--methods",
                "random",
                "--recommenders",
                f"{faulty.url}#token_env=MY_TOKEN",
                "--targets",
                "War",
                "--agents",
                "1,1",
                "--rounds",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert faulty.authorization == f"Bearer {secret}"
    assert secret not in run_folder_text(out) and secret not in capsys.readouterr().err
    assert (out / "exchanges.jsonl").exists()


def test_bad_box_options_are_config_errors(ml100k):
    for spec, named in (
        ("http://127.0.0.1:9#mode=chatty", "stateless or stateful"),
        ("http://127.0.0.1:9#batch_size=0", "batch_size"),
        ("http://127.0.0.1:9#colour=red", "unknown HTTP box option 'colour'"),
        ("http://#mode=stateless", "with a host"),
    ):
        with pytest.raises(ConfigError, match=named):
            make_recommender(spec, ml100k)


def test_stateful_boxes_refuse_candidate_pools(ml100k, served_dial):
    box = make_recommender(f"{served_dial.url}#mode=stateful", ml100k)
    with pytest.raises(ConfigError, match="candidate pools need mode=stateless"):
        box.recommend([UserState(history=("1",))], 2, candidates=["2", "3", "4"])
    stateless = make_recommender(served_dial.url, ml100k)
    local = make_recommender("dial:1", ml100k)
    state = [UserState(history=("1",))]
    assert (
        stateless.recommend(state, 2, candidates=["2", "3", "4"])[0].item_ids
        == local.recommend(state, 2, candidates=["2", "3", "4"])[0].item_ids
    )
