"""`ctrlsim serve`: a black box over the HTTP contract answers exactly what the box answers in-process.

Most tests use FastAPI's in-process TestClient; one starts a real `ctrlsim serve` process on
127.0.0.1. The property tests check every endpoint against the app's own OpenAPI document.
"""
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi", reason='ctrlsim serve needs FastAPI: pip install "ctrlsim[serve]"')

from fastapi.testclient import TestClient  # noqa: E402

from ctrlsim.experiments.cli import main  # noqa: E402
from ctrlsim.recommenders import Recommender, UserState, make_recommender  # noqa: E402
from ctrlsim.recommenders.http import contract  # noqa: E402
from ctrlsim.recommenders.http.serve import encode_scores, make_app  # noqa: E402

BOXES = ["popularity", "dial:1"]
TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def apps(ml100k):
    """One served app per box name, shared by the module (each test uses fresh account ids)."""
    return {name: make_app(make_recommender(name, ml100k), dataset=ml100k) for name in BOXES}


@pytest.fixture(scope="module")
def clients(apps):
    return {name: TestClient(app) for name, app in apps.items()}


@pytest.fixture(scope="module")
def horror(ml100k):
    return ml100k.items_with_tag("Horror")


@pytest.fixture(scope="module")
def popular(ml100k):
    items = ml100k.items
    return [str(i) for i in items.sort_values("popularity", ascending=False, kind="stable")["item_id"][:10]]


def expected(ml100k, name, states, k, candidates=None, **flags):
    """What a box of that name, built here with the given flags, answers in-process."""
    box = make_recommender(name, ml100k, **flags)
    return [{"items": s.item_ids, "scores": [float(x) for x in s.scores]}
            for s in box.recommend(states, k, candidates=candidates)]


def as_lists(response):
    assert response.status_code == 200, response.text
    return response.json()["lists"]


# --------------------------------------------------------------------------- stateless
@pytest.mark.parametrize("name", BOXES)
@pytest.mark.parametrize("flags", [{}, {"mask_shown": True}, {"exclude_history": False},
                                   {"mask_shown": True, "exclude_history": False}], ids=str)
def test_stateless_equals_the_in_process_box(ml100k, clients, horror, popular, name, flags):
    states = [UserState(history=tuple(horror[:4]), shown=(popular[0], popular[1], horror[0], horror[1])),
              UserState(history=(popular[2],), shown=(popular[2], popular[3])),
              UserState(profile="likes films noirs", attributes={"age": 30})]
    body = {"states": [{"history": list(s.history), "shown": list(s.shown), "profile": s.profile,
                        "attributes": dict(s.attributes)} for s in states], "k": 12, **flags}
    got = as_lists(clients[name].post("/recommend", json=body))
    assert got == expected(ml100k, name, states, 12, **flags)
    if flags.get("mask_shown"):
        assert not {popular[0], popular[1]} & set(got[0]["items"])
    if flags == {"exclude_history": False} and name == "popularity":
        assert popular[2] in got[1]["items"]


@pytest.mark.parametrize("name", BOXES)
def test_stateless_candidates_one_pool_per_state(ml100k, clients, horror, popular, name):
    pools = [horror[:30], popular + horror[:5]]
    states = [UserState(history=tuple(horror[:3]), shown=tuple(horror[:2])), UserState(history=(popular[0],))]
    body = {"states": [{"history": list(s.history), "shown": list(s.shown), "candidates": pool}
                       for s, pool in zip(states, pools)], "k": 8, "mask_shown": True}
    got = as_lists(clients[name].post("/recommend", json=body))
    assert got == expected(ml100k, name, states, 8, candidates=pools, mask_shown=True)
    assert set(got[0]["items"]) <= set(pools[0]) and set(got[1]["items"]) <= set(pools[1])
    # A batch mixing states with and without a pool: each list is the one it gets alone.
    mixed = {"states": [body["states"][0], {"history": [popular[0]]}], "k": 8}
    got = as_lists(clients[name].post("/recommend", json=mixed))
    assert got[0] == expected(ml100k, name, states[:1], 8, candidates=pools[:1])[0]
    assert got[1] == expected(ml100k, name, states[1:], 8)[0]


def test_concurrent_requests_with_different_flags_do_not_mix(ml100k, clients, horror, popular):
    """The flags are set on the box per call under a lock: concurrent calls each get their own."""
    state = UserState(history=tuple(popular[:3]), shown=tuple(popular[3:6]))
    variants = [{}, {"mask_shown": True}, {"exclude_history": False}]
    want = [expected(ml100k, "popularity", [state], 10, **f) for f in variants]
    body = {"states": [{"history": list(state.history), "shown": list(state.shown)}], "k": 10}
    errors = []

    def worker(n):
        for i in range(6):
            v = (n + i) % len(variants)
            got = clients["popularity"].post("/recommend", json={**body, **variants[v]}).json()["lists"]
            if got != want[v]:
                errors.append((variants[v], got))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_non_finite_scores_are_sent_as_null(ml100k):
    class InfBox(Recommender):
        name = "inf"

        def score_all(self, states):
            scores = np.tile(np.arange(len(self.dataset.items), dtype=float), (len(states), 1))
            scores[:, 0] = np.inf
            return scores

    client = TestClient(make_app(InfBox(ml100k), dataset=ml100k))
    got = as_lists(client.post("/recommend", json={"states": [{}], "k": 3}))[0]
    assert got["items"][0] == str(ml100k.item_ids[0]) and len(got["items"]) == 3
    assert got["scores"] is None  # JSON has no infinity: no made-up number either
    assert encode_scores(np.array([1.0, 2.0])) == [1.0, 2.0]
    assert encode_scores(np.array([1.0, np.nan])) is None


# --------------------------------------------------------------------------- stateful
@pytest.mark.parametrize("name", BOXES)
def test_stateful_account_follows_its_events(ml100k, clients, horror, popular, name):
    client = clients[name]
    acct = f"probe-{name}"
    start = list(horror[:3])
    assert client.post("/accounts", json={"accounts": [{"account": acct, "history": start,
                                                        "mask_shown": True}]}).json() == {"accounts": [acct]}
    events = [{"account": acct, "item": horror[5], "type": "shown"},  # e.g. a search result
              {"account": acct, "item": horror[5], "type": "like"},
              {"account": acct, "item": start[0], "type": "like"},  # already liked: changes nothing
              {"account": acct, "item": horror[1], "type": "shown"}]
    assert client.post("/feedback", json={"events": events}).json() == {"accepted": 4}
    history, shown = (*start, horror[5]), (horror[5], horror[1])
    first = as_lists(client.post("/accounts/recommend", json={"accounts": [acct], "k": 7}))
    assert first == expected(ml100k, name, [UserState(history=history, shown=shown)], 7, mask_shown=True)
    # What the service returned is now shown: with mask_shown the next list avoids it.
    second = as_lists(client.post("/accounts/recommend", json={"accounts": [acct], "k": 7}))
    shown = (*shown, *first[0]["items"])
    assert second == expected(ml100k, name, [UserState(history=history, shown=shown)], 7, mask_shown=True)
    assert not set(first[0]["items"]) & set(second[0]["items"])
    # A reset starts fresh: the first list comes back.
    client.post("/accounts", json={"accounts": [{"account": acct, "history": start, "mask_shown": True}]})
    client.post("/feedback", json={"events": events})
    assert as_lists(client.post("/accounts/recommend", json={"accounts": [acct], "k": 7})) == first


def test_stateful_accounts_keep_their_own_state_and_flags(ml100k, clients, horror, popular):
    client = clients["popularity"]
    client.post("/accounts", json={"accounts": [
        {"account": "a", "history": [popular[0]], "profile": "noir", "attributes": {"age": 30}},
        {"account": "b", "history": [popular[0]], "exclude_history": False, "mask_shown": True}]})
    client.post("/feedback", json={"events": [{"account": "b", "item": popular[1], "type": "shown"}]})
    got = as_lists(client.post("/accounts/recommend", json={"accounts": ["a", "b"], "k": 5}))
    assert got[0] == expected(ml100k, "popularity", [UserState(history=(popular[0],))], 5)[0]
    assert got[1] == expected(ml100k, "popularity", [UserState(history=(popular[0],), shown=(popular[1],))],
                              5, exclude_history=False, mask_shown=True)[0]
    assert popular[0] in got[1]["items"] and popular[1] not in got[1]["items"]


# --------------------------------------------------------------------------- errors
def test_unknown_item_ids_are_404_naming_id_and_field(clients, horror):
    client = clients["popularity"]
    unknown = "no-such-item"
    cases = [("/recommend", {"states": [{"history": [horror[0], unknown]}], "k": 3}, "states[0].history"),
             ("/recommend", {"states": [{}, {"shown": [unknown]}], "k": 3}, "states[1].shown"),
             ("/recommend", {"states": [{"candidates": [unknown]}], "k": 3}, "states[0].candidates"),
             ("/accounts", {"accounts": [{"account": "x", "history": [unknown]}]}, "accounts[0].history")]
    for path, body, field in cases:
        r = client.post(path, json=body)
        assert r.status_code == 404, (path, r.text)
        assert "'no-such-item'" in r.json()["detail"] and field in r.json()["detail"]
    client.post("/accounts", json={"accounts": [{"account": "e1"}]})
    r = client.post("/feedback", json={"events": [{"account": "e1", "item": horror[0], "type": "like"},
                                                  {"account": "e1", "item": "no-such-item", "type": "like"}]})
    assert r.status_code == 404 and "events[1].item" in r.json()["detail"]
    # A refused request changes nothing: the valid first event was not applied.
    got = as_lists(client.post("/accounts/recommend", json={"accounts": ["e1"], "k": 3}))
    assert got == as_lists(client.post("/recommend", json={"states": [{}], "k": 3}))


def test_unknown_account_is_404_naming_it(clients, horror):
    client = clients["popularity"]
    r = client.post("/accounts/recommend", json={"accounts": ["never-created"], "k": 3})
    assert r.status_code == 404 and "'never-created'" in r.json()["detail"]
    event = {"account": "never-created", "item": horror[0], "type": "like"}
    r = client.post("/feedback", json={"events": [event]})
    assert r.status_code == 404 and "'never-created'" in r.json()["detail"]


def test_k_larger_than_the_catalogue_and_malformed_bodies_are_422(ml100k, clients):
    client = clients["popularity"]
    n = len(ml100k.items)
    r = client.post("/recommend", json={"states": [{}], "k": n + 1})
    assert r.status_code == 422 and f"k={n + 1}" in r.json()["detail"] and str(n) in r.json()["detail"]
    client.post("/accounts", json={"accounts": [{"account": "k"}]})
    assert client.post("/accounts/recommend", json={"accounts": ["k"], "k": n + 1}).status_code == 422
    assert len(as_lists(client.post("/recommend", json={"states": [{}], "k": n}))[0]["items"]) == n
    bad = [b"{not json", b"[]", json.dumps({"states": [], "k": 3}).encode(),
           json.dumps({"states": [{}]}).encode(), json.dumps({"states": [{}], "k": "3"}).encode(),
           json.dumps({"states": [{"history": [1]}], "k": 3}).encode(),
           json.dumps({"states": [{}], "k": 3, "surprise": 1}).encode(),
           json.dumps({"states": [{"candidates": []}], "k": 3}).encode()]
    for body in bad:
        r = client.post("/recommend", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, (body, r.text)
        assert isinstance(r.json()["detail"], str) and r.json()["detail"]  # a Problem body
    r = client.post("/feedback", json={"events": [{"account": "k", "item": "1", "type": "clicked"}]})
    assert r.status_code == 422 and "type" in r.json()["detail"]
    r = client.post("/accounts", json={"accounts": [{"account": "d"}, {"account": "d"}]})
    assert r.status_code == 422 and "'d'" in r.json()["detail"]


def test_bearer_token_required_except_for_health(ml100k):
    client = TestClient(make_app(make_recommender("popularity", ml100k), dataset=ml100k, token=TOKEN))
    body = {"states": [{}], "k": 3}
    assert client.get("/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong-guess"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": TOKEN}):
        r = client.post("/recommend", json=body, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in r.text and "wrong-guess" not in r.text
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/recommend", json=body, headers=auth).status_code == 200
    assert client.post("/accounts", json={"accounts": [{"account": "t"}]}).status_code == 401
    assert client.post("/accounts", json={"accounts": [{"account": "t"}]}, headers=auth).status_code == 200
    assert client.post("/feedback", json={"events": [{"account": "t", "item": "1", "type": "like"}]},
                       headers=auth).json() == {"accepted": 1}
    ask = {"accounts": ["t"], "k": 2}
    assert client.post("/accounts/recommend", json=ask).status_code == 401
    assert client.post("/accounts/recommend", json=ask, headers=auth).status_code == 200
    document = client.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "401" in document["paths"]["/recommend"]["post"]["responses"]
    assert "security" not in document["paths"]["/health"]["get"]


def test_health_and_openapi_document(ml100k, clients):
    health = clients["dial:1"].get("/health").json()
    assert contract.Health.model_validate(health).status == "ok"
    assert health["items"] == len(ml100k.items) and set(health["modes"]) == {"stateless", "stateful"}
    assert health["box"]["recommender"] == "dial" and health["box"]["lambda"] == 1.0
    document = clients["popularity"].get("/openapi.json").json()
    assert set(document["paths"]) == set(contract.ENDPOINTS.values())
    schemas = document["components"]["schemas"]
    models = {"State": contract.State, "RecommendRequest": contract.RecommendRequest,
              "RankedList": contract.RankedList, "RecommendResponse": contract.RecommendResponse,
              "Account": contract.Account, "AccountsRequest": contract.AccountsRequest,
              "AccountsResponse": contract.AccountsResponse, "Event": contract.Event,
              "FeedbackRequest": contract.FeedbackRequest, "FeedbackResponse": contract.FeedbackResponse,
              "AccountRecommendRequest": contract.AccountRecommendRequest, "Health": contract.Health,
              "Problem": contract.Problem}
    for name, model in models.items():
        assert set(schemas[name]["properties"]) == set(model.model_fields), name
        assert schemas[name].get("additionalProperties") is False, name
    ops = {(path, method): op for path, item in document["paths"].items() for method, op in item.items()}
    ref = "#/components/schemas/"
    bodies = {("/recommend", "post"): ("RecommendRequest", "RecommendResponse"),
              ("/accounts", "post"): ("AccountsRequest", "AccountsResponse"),
              ("/feedback", "post"): ("FeedbackRequest", "FeedbackResponse"),
              ("/accounts/recommend", "post"): ("AccountRecommendRequest", "RecommendResponse")}
    for key, (request, response) in bodies.items():
        op = ops[key]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"] == ref + request
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"] == ref + response
        for status in ("400", "404", "422", "500"):
            assert op["responses"][status]["content"]["application/json"]["schema"]["$ref"] == ref + "Problem"
    assert ops[("/health", "get")]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"] \
        == ref + "Health"


# --------------------------------------------------------------------------- property tests
def operations():
    return [(path, "GET" if key in contract.GET_ENDPOINTS else "POST")
            for key, path in contract.ENDPOINTS.items()]


@pytest.mark.parametrize("path, method", operations())
def test_every_endpoint_conforms_to_its_openapi_document(apps, path, method):
    """Generated requests (valid and, for bodies, invalid ones): no 5xx, documented status codes and
    content types, and bodies that match the documented schemas."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import positive_data_acceptance

    operation = schemathesis.openapi.from_asgi("/openapi.json", apps["popularity"])[path][method]
    # Valid requests that name items or accounts this catalogue lacks are rightly refused (404),
    # so "valid data is accepted" is not a property of this API.
    modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if method == "POST" else [])
    statuses = set()
    for mode in modes:
        @settings(max_examples=25, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def conforms(case):
            statuses.add(case.call_and_validate(excluded_checks=[positive_data_acceptance]).status_code)

        conforms()
    assert statuses and all(s < 500 for s in statuses)


# --------------------------------------------------------------------------- the command
def test_serve_refuses_bad_boxes_and_options_before_binding(monkeypatch, capsys):
    import ctrlsim.recommenders.http.serve as serve

    bound = []
    monkeypatch.setattr(serve, "listen", lambda *a: bound.append(a))
    for argv, message in [(["serve", "no-such-box"], "unknown recommender 'no-such-box'"),
                          (["serve", "dial:2"], "lambda"),
                          (["serve", "popularity", "--box-options", "{not json"], "--box-options"),
                          (["serve", "popularity", "--box-options", "[1]"], "JSON object"),
                          (["serve", "popularity", "--box-options", '{"colour": "red"}'], "colour"),
                          (["serve", "dial:0.5:mix=nope"], "mix"),
                          (["serve", "popularity", "--port", "70000"], "--port")]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    monkeypatch.setenv("EMPTY_TOKEN", "")
    assert main(["serve", "popularity", "--token-env", "EMPTY_TOKEN"]) == 2
    assert "$EMPTY_TOKEN is set but empty" in capsys.readouterr().err
    assert not bound


def test_serve_port_in_use_is_exit_2(ml100k, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "popularity", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_serve_reads_the_token_from_the_environment(ml100k, monkeypatch, capsys):
    import ctrlsim.recommenders.http.serve as serve

    served = []

    def fake_run(app, sock):  # stands in for uvicorn; Ctrl-C right away
        served.append((app, sock.getsockname()))
        raise KeyboardInterrupt

    monkeypatch.setattr(serve, "run_server", fake_run)
    monkeypatch.setenv("MY_SERVE_TOKEN", TOKEN)
    assert main(["serve", "dial:0.5", "--port", "0", "--token-env", "MY_SERVE_TOKEN",
                 "--box-options", '{"mask_shown": true}']) == 0
    out = capsys.readouterr()
    (app, (host, port)), = served
    assert f"http://127.0.0.1:{port}" in out.out and "MY_SERVE_TOKEN" in out.out
    assert TOKEN not in out.out + out.err and host == "127.0.0.1"
    client = TestClient(app, base_url="http://127.0.0.1")  # the served app answers its own host names only
    assert client.get("/health").json()["box"]["lambda"] == 0.5
    assert client.post("/recommend", json={"states": [{}], "k": 2}).status_code == 401
    r = client.post("/recommend", json={"states": [{}], "k": 2}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    assert app.state.recommender.mask_shown is True  # the box options reached the box


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)


def test_a_real_ctrlsim_serve_process(ml100k, popular, horror):
    httpx = pytest.importorskip("httpx2")
    with socket.socket() as probe:  # a free port (the server binds it again right after)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "CTRLSIM_SERVE_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "ctrlsim.experiments.cli", "serve", "popularity",
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out: queue.Queue = queue.Queue()
        threading.Thread(target=_lines, args=(proc.stdout, out), daemon=True).start()
        ready = out.get(timeout=120)
        url = f"http://127.0.0.1:{port}"
        assert url in ready and TOKEN not in ready
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not come up"
            time.sleep(0.2)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
            state = UserState(history=tuple(horror[:3]), shown=tuple(popular[:2]))
            r = http.post("/recommend", json={"states": [{"history": list(state.history),
                                                          "shown": list(state.shown)}],
                                              "k": 10, "mask_shown": True})
            assert r.status_code == 200, r.text
            assert r.json()["lists"] == expected(ml100k, "popularity", [state], 10, mask_shown=True)
            http.post("/accounts", json={"accounts": [{"account": "p1", "history": list(state.history),
                                                        "mask_shown": True}]}).raise_for_status()
            http.post("/feedback", json={"events": [{"account": "p1", "item": i, "type": "shown"}
                                                    for i in state.shown]}).raise_for_status()
            r = http.post("/accounts/recommend", json={"accounts": ["p1"], "k": 10})
            assert r.json()["lists"] == expected(ml100k, "popularity", [state], 10, mask_shown=True)
            assert httpx.post(f"{url}/recommend", json={"states": [{}], "k": 1}).status_code == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
        assert "Traceback" not in err and TOKEN not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
