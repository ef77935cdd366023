"""Prosocial Ranking Challenge rankers as black boxes (issue 49, part 1).

- Through a real `ctrlsim serve --contract prc` process, a `prc+http://` box ranks exactly what the
  in-process box ranks over the same pools, for both pool rules and with masking; its exchanges are
  recorded and replay offline to the same slates.
- A ctrlbench run through `prc+http://...#pool_size=<catalogue size>` (every eligible item in each
  pool) stores the same curves as the same run on the in-process box.
- The pool rule is deterministic, honours the exclusions, and the requests fit the PRC schema.
- A ranker that answers duplicates or ids outside the request is a typed error naming the field.
"""

from __future__ import annotations

import pytest
from http_servers import ctrlbench_curves

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from fastapi import FastAPI, Request  # noqa: E402

from ctrlsim.errors import ConfigError  # noqa: E402
from ctrlsim.experiments.cli import main  # noqa: E402
from ctrlsim.recommenders import UserState, make_recommender  # noqa: E402
from ctrlsim.recommenders.http.prc.adapter import choose_pool, ranking_request  # noqa: E402
from ctrlsim.recommenders.http.prc.schema import RankingRequest  # noqa: E402
from ctrlsim.recommenders.http.serve_process import ServedApp, ServedBox  # noqa: E402
from ctrlsim.recommenders.http.transport import RecommenderResponseError  # noqa: E402

STATES = [
    UserState(history=("1", "50"), shown=("1", "50", "7")),
    UserState(history=("100", "181"), user_id="u3"),
    UserState(),
]


@pytest.fixture(scope="module")
def served_dial():
    with ServedBox("dial:1", "--contract", "prc") as served:
        yield served


@pytest.mark.parametrize("fragment", ["", "#pool=head&pool_size=30", "#pool_size=40&pool_seed=7"])
@pytest.mark.parametrize("mask_shown", [False, True])
def test_prc_box_round_trips_through_ctrlsim_serve(ml100k, served_dial, fragment, mask_shown):
    remote = make_recommender(f"prc+{served_dial.url}/rank{fragment}", ml100k, mask_shown=mask_shown)
    local = make_recommender("dial:1", ml100k, mask_shown=mask_shown)
    pools = remote.pools(STATES, 5)
    assert [s.item_ids for s in remote.recommend(STATES, 5)] == [
        s.item_ids for s in local.recommend(STATES, 5, candidates=pools)
    ]
    pool = [str(i) for i in ml100k.item_ids[:25]]  # a caller's pool is sent whole, minus exclusions
    assert [s.item_ids for s in remote.recommend(STATES, 5, candidates=pool)] == [
        s.item_ids for s in local.recommend(STATES, 5, candidates=pool)
    ]


def test_ctrlbench_through_a_prc_box_gives_the_in_process_records(ml100k, served_dial, tmp_path):
    # A pool as large as the catalogue holds every eligible item, so the PRC ranker ranks what the
    # in-process box ranks and the runs' records must agree curve for curve.
    whole = f"prc+{served_dial.url}/rank#pool_size={len(ml100k.item_ids)}"
    common = "--methods random,oracle --targets War --agents 2,2 --rounds 3 --seeds 0,1 --figures false"

    def curves(box: str, name: str) -> dict:
        out = tmp_path / name
        assert main(["ctrlbench", "--recommenders", box, *common.split(), "--out", str(out)]) == 0
        by_unit = ctrlbench_curves(out)
        assert len(by_unit) == 4
        return by_unit

    assert curves(whole, "prc") == curves("dial:1", "local")


def test_prc_box_records_and_replays_its_exchanges(ml100k, tmp_path):
    from ctrlsim.recommenders.http.prc.serve import make_prc_app

    log = tmp_path / "exchanges.jsonl"
    with ServedApp(make_prc_app(make_recommender("dial:1", ml100k), dataset=ml100k)) as served:
        spec = f"prc+{served.url}/rank"
        recorded = make_recommender(spec, ml100k, exchanges=str(log)).recommend(STATES, 5)
    assert len(log.read_text().splitlines()) == len(STATES)
    offline = make_recommender(spec, ml100k, replay=str(log))  # the server is gone
    assert [s.item_ids for s in offline.recommend(STATES, 5)] == [s.item_ids for s in recorded]


def test_pool_rule_is_deterministic_and_honours_exclusions(ml100k):
    state = STATES[0]
    options = dict(rule="sample", size=50, seed=0, exclude_history=True, mask_shown=True)
    pool = choose_pool(ml100k, state, 5, **options)
    assert pool == choose_pool(ml100k, state, 5, **options) and len(pool) == 50
    assert not set(pool) & set(state.shown)
    assert pool != choose_pool(ml100k, state, 5, **{**options, "seed": 1})
    assert len(choose_pool(ml100k, state, 80, **options)) == 80  # never fewer than k
    head = choose_pool(ml100k, UserState(), 5, **{**options, "rule": "head", "size": 10})
    popular = ml100k.items.sort_values("popularity", ascending=False, kind="stable")["item_id"][:10]
    assert set(head) == set(popular.astype(str))


def test_requests_fit_the_prc_schema(ml100k):
    for platform in ("reddit", "twitter", "facebook"):
        body = ranking_request(ml100k, STATES[1], ["1", "2", "3"], platform=platform, send_state=True)
        request = RankingRequest.model_validate(body)
        assert [i.id for i in request.items] == ["1", "2", "3"] and request.session.user_id == "u3"
        assert body["ctrlsim"]["history"] == ["100", "181"]
    assert "ctrlsim" not in ranking_request(ml100k, STATES[1], ["1"], platform="reddit", send_state=False)


def test_bad_specs_and_options_are_config_errors(ml100k):
    with pytest.raises(ConfigError, match="pool"):
        make_recommender("prc+http://127.0.0.1:9/rank#pool=everything", ml100k)
    with pytest.raises(ConfigError, match="stateless"):
        make_recommender("prc+http://127.0.0.1:9/rank#mode=stateful", ml100k)
    with pytest.raises(ConfigError, match="unknown HTTP box option"):
        make_recommender("prc+http://127.0.0.1:9/rank#colour=red", ml100k)
    box = make_recommender("prc+http://127.0.0.1:9#pool_size=12", ml100k)
    assert box.rank_path == "/rank" and box.identity["pool_size"] == 12


@pytest.mark.parametrize(
    "broken, message",
    [
        (lambda ids: ids[:1] + ids, r"ranked_ids\[1\]: duplicate item"),
        (lambda ids: ["99999"] + ids, r"ranked_ids\[0\]: '99999' is not an item of the request"),
        (lambda ids: ids[:2], r"fewer than k=5"),
    ],
)
def test_broken_rankers_are_typed_errors_naming_the_field(ml100k, broken, message):
    app = FastAPI()

    @app.post("/rank")
    async def rank(request: Request) -> dict:
        return {"ranked_ids": broken([item["id"] for item in (await request.json())["items"]])}

    with ServedApp(app) as served:
        box = make_recommender(f"prc+{served.url}/rank", ml100k, retries=0)
        with pytest.raises(RecommenderResponseError, match=message):
            box.recommend(STATES[:1], 5)
