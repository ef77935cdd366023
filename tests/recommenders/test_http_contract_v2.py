"""HTTP contract version 2 (issue 48, "Do the buttons work?"): negative feedback, settings and
`GET /controls` travel between the client box and `ctrlsim serve`, and version 1 keeps working on
both sides.

- Through a real `ctrlsim serve embedding` process, states with not-interested items, dislikes and
  blocked tags are ranked exactly as the in-process box ranks them (stateless and stateful, and a
  whole episode of an env with `negative_feedback=True`).
- A service that speaks only version 1 (`make_app(..., contract="1")`) still answers version-1
  requests, refuses version-2 fields, and has no `/controls`. A version-2 client against it sends
  version-1 requests, and its `negative_feedback` says the buttons are ignored.
- `/controls` round-trips a box's declared controls, its settings reach the box, and a malformed
  answer is a typed error.
- The exchange log records the new fields and the version asked; a recorded run replays offline, and a
  log from before the negotiation replays as version 1.
"""
from __future__ import annotations

import numpy as np
import pytest
from http_servers import ServedBox

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from fastapi.testclient import TestClient  # noqa: E402

from ctrlsim.errors import ConfigError  # noqa: E402
from ctrlsim.recommenders import Recommender, UserState, make_recommender  # noqa: E402
from ctrlsim.recommenders.base import IGNORES_NEGATIVE_FEEDBACK  # noqa: E402
from ctrlsim.recommenders.controls import NO_CONTROLS, Control, Controls  # noqa: E402
from ctrlsim.recommenders.http.client import RecommenderResponseError, read_exchanges  # noqa: E402
from ctrlsim.recommenders.http.contract import CONTRACT_VERSION, ControlsResponse  # noqa: E402
from ctrlsim.recommenders.http.negotiation import IGNORED_BY_V1  # noqa: E402
from ctrlsim.recommenders.http.serve import make_app  # noqa: E402
from ctrlsim.recommenders.http.serve_process import ServedApp  # noqa: E402


@pytest.fixture(scope="module")
def embedding(ml100k):
    return make_recommender("embedding", ml100k)


@pytest.fixture(scope="module")
def served_embedding():
    box = ServedBox("embedding")
    yield box
    assert box.stop() == 0


@pytest.fixture(scope="module")
def v1_service(ml100k, embedding):
    """The embedding box behind a service that speaks contract version 1 only."""
    with ServedApp(make_app(embedding, dataset=ml100k, contract="1")) as served:
        yield served


def play(ml100k, rank, rounds: int = 4) -> list[tuple[list[UserState], list]]:
    """(states, slates) of rounds of two users whose likes, shown items (what `rank` showed them, and
    items seen elsewhere) and negative feedback grow as an episode's do, so the stateful client
    continues their accounts with like, shown and negative events. User b's blocked tags shrink in the
    last round: a state no account can reach, so b gets a fresh account there."""
    war, comedy = ml100k.items_with_tag("War"), ml100k.items_with_tag("Comedy")
    served: dict[str, list[str]] = {"a": [], "b": []}
    played = []
    for r in range(rounds):
        a = UserState(history=tuple(war[: 2 + r]), shown=tuple(dict.fromkeys(served["a"] + comedy[:r])),
                      not_interested=tuple(comedy[:r]), disliked=tuple(comedy[10:10 + r // 2]),
                      blocked_tags=("Musical",) if r >= 2 else (), user_id="a")
        b = UserState(history=tuple(comedy[20:22]), shown=tuple(served["b"]), disliked=tuple(war[30:30 + r]),
                      blocked_tags=("Horror", "Drama")[: r % 3], user_id="b")
        slates = rank([a, b])
        played.append(([a, b], slates))
        for user, slate in zip("ab", slates):
            served[user] += [i for i in slate.item_ids if i not in served[user]]
    return played


def plain(state: UserState) -> UserState:
    """The state without what only contract version 2 carries."""
    return UserState(history=state.history, profile=state.profile, attributes=state.attributes,
                     shown=state.shown, user_id=state.user_id)


def same_slates(got, want) -> None:
    assert [s.item_ids for s in got] == [s.item_ids for s in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.scores, w.scores)


# --------------------------------------------------------------------------- version 2 round trips
@pytest.mark.parametrize("mode", ["stateless", "stateful"])
def test_negative_feedback_through_ctrlsim_serve_equals_the_in_process_box(ml100k, embedding,
                                                                           served_embedding, mode, tmp_path):
    log = tmp_path / "exchanges.jsonl"
    client = make_recommender(f"{served_embedding.url}#mode={mode}", ml100k, mask_shown=True,
                              exchanges=str(log))
    local = make_recommender("embedding", ml100k, mask_shown=True)
    for states, slates in play(ml100k, lambda states: client.recommend(states, 10)):
        same_slates(slates, local.recommend(states, 10))
    assert client.negative_feedback == embedding.negative_feedback and client.reads_negative_feedback
    assert client.controls == NO_CONTROLS
    entries = read_exchanges(log)
    endpoints = [e["endpoint"] for e in entries]
    assert endpoints[0] in ("/recommend", "/accounts") and "/health" in endpoints and "/controls" in endpoints
    assert endpoints.count("/health") == 1  # asked once, when a state first carried negative feedback
    health = entries[endpoints.index("/health")]
    assert health["response"]["contract"] == CONTRACT_VERSION and health["request"] is None
    sent = [e["request"] for e in entries if e["endpoint"] in ("/recommend", "/accounts", "/feedback")]
    text = str(sent)
    assert "not_interested" in text and "'Musical'" in text and ("disliked" in text or "dislike" in text)
    if mode == "stateful":  # continued accounts hear of new dismissals as events
        events = [ev for e in entries if e["endpoint"] == "/feedback" for ev in e["request"]["events"]]
        assert {"not_interested", "dislike", "block", "like", "shown"} <= {ev["type"] for ev in events}
        assert {"account": events[0]["account"], "tag": "Musical", "type": "block"} in events


def test_an_episode_with_the_buttons_through_the_served_box(ml100k, served_embedding):
    from ctrlsim.envs import ProbeEnv

    remote = ProbeEnv(f"{served_embedding.url}#mode=stateful", dataset=ml100k, target="War", budget=4,
                      negative_feedback=True)
    local = ProbeEnv("embedding", dataset=ml100k, target="War", budget=4, negative_feedback=True)
    actions = [{"likes": [1, 0, 0], "feedback": [0, 1, 0], "block": "Comedy"},
               {"likes": [0, 0, 0], "feedback": [2, 0, 1], "block": 0},
               {"likes": [0, 1, 0], "feedback": [0, 0, 2], "block": "Drama"},
               {"likes": [1, 0, 0], "feedback": [0, 0, 0], "block": 0}]
    for env in (remote, local):
        env.reset(seed=3)
    for action in actions:
        a = remote.step(dict(action))
        b = local.step(dict(action))
        assert a[0]["slate"].tolist() == b[0]["slate"].tolist() and a[1] == b[1]


def test_a_v1_style_client_gets_the_same_answers_from_a_v2_service(ml100k, served_embedding):
    httpx = pytest.importorskip("httpx2")
    body = {"states": [{"history": ["1", "50"], "shown": ["7"], "profile": None, "attributes": {}}],
            "k": 5, "mask_shown": True}
    with httpx.Client(base_url=served_embedding.url, timeout=30) as http:
        assert http.get("/health").json()["contract"] == CONTRACT_VERSION
        lists = http.post("/recommend", json=body).json()["lists"]
        http.post("/accounts", json={"accounts": [{"account": "v1", "history": ["1"], "mask_shown": True}]})
        http.post("/feedback", json={"events": [{"account": "v1", "item": "50", "type": "like"},
                                                {"account": "v1", "item": "7", "type": "shown"}]})
        stateful = http.post("/accounts/recommend", json={"accounts": ["v1"], "k": 5}).json()["lists"]
    local = make_recommender("embedding", ml100k, mask_shown=True).recommend(
        [UserState(history=("1", "50"), shown=("7",))], 5)[0]
    assert lists[0]["items"] == stateful[0]["items"] == local.item_ids


# --------------------------------------------------------------------------- a version-1 service
def test_a_v1_service_speaks_version_1_only(ml100k, embedding, v1_service):
    httpx = pytest.importorskip("httpx2")
    with httpx.Client(base_url=v1_service.url, timeout=30) as http:
        assert http.get("/health").json()["contract"] == "1"
        assert http.get("/controls").status_code == 404
        plain = http.post("/recommend", json={"states": [{"history": ["1", "50"]}], "k": 5})
        assert plain.status_code == 200
        assert plain.json()["lists"][0]["items"] == embedding.recommend([UserState(history=("1", "50"))],
                                                                        5)[0].item_ids
        refused = http.post("/recommend", json={"states": [{"history": ["1"], "disliked": ["2"]}], "k": 5})
        assert refused.status_code == 422 and "disliked" in refused.json()["detail"]
        http.post("/accounts", json={"accounts": [{"account": "p", "history": ["1"]}]}).raise_for_status()
        block = http.post("/feedback", json={"events": [{"account": "p", "type": "block", "tag": "War"}]})
        assert block.status_code == 422
        document = http.get("/openapi.json").json()
        assert "/controls" not in document["paths"] and document["info"]["version"] == "1"


@pytest.mark.parametrize("mode", ["stateless", "stateful"])
def test_a_v2_client_against_a_v1_service_sends_no_negatives_and_says_so(ml100k, embedding, v1_service,
                                                                        mode, tmp_path):
    log = tmp_path / "exchanges.jsonl"
    client = make_recommender(f"{v1_service.url}#mode={mode}", ml100k, exchanges=str(log))
    client.recommend([UserState(history=("1", "50"))], 5)  # nothing of version 2 to send: nothing asked
    assert [e["endpoint"] for e in read_exchanges(log)] == (["/recommend"] if mode == "stateless" else
                                                            ["/accounts", "/accounts/recommend"])
    for states, slates in play(ml100k, lambda states: client.recommend(states, 10)):
        same_slates(slates, embedding.recommend([plain(s) for s in states], 10))
    assert client.negative_feedback == IGNORED_BY_V1
    assert client.negative_feedback.startswith(IGNORES_NEGATIVE_FEEDBACK)
    assert not client.reads_negative_feedback and client.controls == NO_CONTROLS
    entries = read_exchanges(log)
    assert [e["endpoint"] for e in entries].count("/health") == 1 and "/controls" not in str(entries)
    sent = str([e["request"] for e in entries])
    for field in ("not_interested", "disliked", "blocked_tags", "settings", "dislike", "block"):
        assert field not in sent
    with pytest.raises(ConfigError, match="service's own statement"):
        client.negative_feedback = "reads everything"


# --------------------------------------------------------------------------- controls and settings
class KnobBox(Recommender):
    """Popularity order, or its reverse when the user turns `popular` off: a box that declares controls."""

    name = "knob"

    @property
    def controls(self) -> Controls:
        return Controls((Control("popular", "on shows popular films first", "popularity", "decreases",
                                 choices=("on", "off")),
                         Control("spread", "higher spreads the feed over more genres", "diversity",
                                 low=0, high=1, default=0.5)),
                        non_profiled={"popular": "on"})

    def score_all(self, states):
        popularity = self.dataset.items["popularity"].to_numpy(dtype=np.float64)
        return np.stack([-popularity if s.settings.get("popular") == "off" else popularity for s in states])


def test_controls_round_trip_and_settings_reach_the_box(ml100k):
    box = KnobBox(ml100k)
    app = make_app(box, dataset=ml100k)
    answer = TestClient(app).get("/controls").json()
    assert ControlsResponse.model_validate(answer).reads_negative_feedback is False
    assert Controls.from_dict(answer) == box.controls
    assert answer["negative_feedback"] == IGNORES_NEGATIVE_FEEDBACK
    with ServedApp(app) as served:
        for mode in ("stateless", "stateful"):
            client = make_recommender(f"{served.url}#mode={mode}", ml100k)
            assert client.controls == box.controls
            assert client.negative_feedback == IGNORES_NEGATIVE_FEEDBACK
            assert not client.reads_negative_feedback
            states = [UserState(history=("1",), settings={"popular": "off", "spread": 0.25}),
                      UserState(history=("1",), settings={"popular": "on"}), UserState(history=("1",))]
            got = client.recommend(states, 5)
            same_slates(got, box.recommend(states, 5))
            assert got[0].item_ids != got[1].item_ids == got[2].item_ids


def stub_service(health: dict, controls):
    """A service that answers /health and /controls only, as told."""
    import fastapi

    app = fastapi.FastAPI()
    app.get("/health")(lambda: health)
    if controls is not None:
        app.get("/controls")(lambda: controls)
    return app


GOOD = {"negative_feedback": IGNORES_NEGATIVE_FEEDBACK, "reads_negative_feedback": False}


@pytest.mark.parametrize("health, controls, named", [
    ({"status": "ok", "contract": "2"}, {"controls": [{"name": "x"}], **GOOD}, "controls.0.claim"),
    ({"status": "ok", "contract": "2"}, {"controls": [], "negative_feedback": "reads them"},
     "reads_negative_feedback"),
    ({"status": "ok", "contract": "2"}, {"controls": [{"name": "x", "claim": "c", "property": "colour",
                                                       "choices": ["a"]}], **GOOD}, "property 'colour'"),
    ({"status": "ok", "contract": "2"}, {"controls": [{"name": "x", "claim": "c", "property": "novelty"}],
                                         **GOOD}, "either low and high"),
    ({"status": "ok", "contract": "2"}, ["not", "an", "object"], "breaks the contract"),
    ({"status": "ok", "contract": "2"}, None, "HTTP 404"),
    ({"status": "ok", "contract": "two"}, GOOD, "not a version number"),
], ids=["schema", "missing-field", "bad-property", "no-values", "not-an-object", "no-endpoint",
        "bad-version"])
def test_a_malformed_controls_answer_is_a_typed_error(ml100k, health, controls, named):
    with ServedApp(stub_service(health, controls)) as served:
        client = make_recommender(served.url, ml100k)
        with pytest.raises(RecommenderResponseError, match=named):
            client.controls  # noqa: B018 - the property asks the service
        with pytest.raises(RecommenderResponseError):
            client.negative_feedback  # noqa: B018


def test_a_newer_service_is_spoken_to_in_the_newest_version_both_know(ml100k):
    health = {"status": "ok", "contract": "7"}
    with ServedApp(stub_service(health, {"controls": [], **GOOD})) as served:
        assert make_recommender(served.url, ml100k).terms().contract == CONTRACT_VERSION


# --------------------------------------------------------------------------- the exchange log
def test_a_v2_recording_replays_offline_and_an_old_log_replays_as_v1(ml100k, embedding, tmp_path):
    live_log = tmp_path / "live.jsonl"
    with ServedApp(make_app(embedding, dataset=ml100k)) as served:
        url = served.url
        live = make_recommender(f"{url}#mode=stateful", ml100k, exchanges=str(live_log))
        recorded = play(ml100k, lambda states: live.recommend(states, 10))
    replayed = make_recommender(f"{url}#mode=stateful", ml100k, replay=str(live_log))  # the service is gone
    for states, slates in recorded:
        same_slates(replayed.recommend(states, 10), slates)
    assert replayed.negative_feedback == embedding.negative_feedback

    # A log recorded without negotiation (no /health in it: what a version-1 client wrote) answers a
    # replay as version 1: negative feedback is left out, so the requests are those it recorded.
    old_log = tmp_path / "old.jsonl"
    with ServedApp(make_app(embedding, dataset=ml100k, contract="1")) as served:
        url = served.url
        old = make_recommender(url, ml100k, exchanges=str(old_log))
        recorded = play(ml100k, lambda states: old.recommend([plain(s) for s in states], 10))
    assert "/health" not in {e["endpoint"] for e in read_exchanges(old_log)}
    replayed = make_recommender(url, ml100k, replay=str(old_log))
    for states, slates in recorded:
        assert any(s.has_negative_feedback for s in states) or states is recorded[0][0]
        same_slates(replayed.recommend(states, 10), slates)
    assert replayed.negative_feedback == IGNORED_BY_V1


def test_ctrlsim_serve_offers_every_contract_version_and_serves_the_newest_by_default():
    from ctrlsim.experiments.cli import build_parser
    from ctrlsim.recommenders.http.contract import CONTRACT_VERSIONS

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    flag = next(a for a in serve._actions if a.dest == "contract_version")  # noqa: SLF001
    assert tuple(flag.choices) == CONTRACT_VERSIONS and flag.default == CONTRACT_VERSION
