"""`ctrlsim serve` left running on a laptop, and stateful HTTP boxes keyed by the whole logical state
(issue 45, items 5 and 6).

The server: a client without a token is refused from the headers, before its body is read; bodies,
batches and lists are bounded (413 naming the limit and its flag); the account table is bounded in
accounts and in the entries they hold (least recently used evicted) and has a delete endpoint; a
`Host` the service does not answer is refused; a non-loopback address without a token is refused
before the port is bound.

The client: two logical states never share a service account (two users without an id and with the
same history; the beam states of the ceiling, which share their probe's id), and an account the
service evicted is created again. Each is checked against the in-process box: same lists.
"""
from __future__ import annotations

import json
import socket
import time

import pytest
from http_servers import ServedBox

from ctrlsim.errors import ExposedServiceError
from ctrlsim.experiments.cli import main
from ctrlsim.recommenders import UserState, make_recommender

pytest.importorskip("fastapi", reason='ctrlsim serve needs FastAPI: pip install "ctrlsim[serve]"')
pytest.importorskip("uvicorn")

from fastapi.testclient import TestClient  # noqa: E402

from ctrlsim.recommenders.http.guard import ServeLimits, allowed_hosts_for, check_exposure  # noqa: E402
from ctrlsim.recommenders.http.serve import make_app  # noqa: E402

TOKEN = "laptop-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def guarded():
    """A real `ctrlsim serve` with a token and a 1 MiB body limit."""
    with ServedBox("popularity", "--max-body-mb", "1", env={"CTRLSIM_SERVE_TOKEN": TOKEN}) as served:
        yield served


@pytest.fixture(scope="module")
def served_dial():
    """`dial:1` (it follows likes, so every beam node of the ceiling gets its own slate), keeping at
    most 6 accounts: the ceiling and the eviction test below overflow it on purpose."""
    with ServedBox("dial:1", "--max-accounts", "6") as served:
        yield served


def raw(port: int, request: bytes, timeout: float = 20) -> tuple[int, dict, float]:
    """Send `request` as is (headers only: no body follows) and read the answer: (status, body, seconds)."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):  # the refusal closes the connection
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body), time.monotonic() - began


# ------------------------------------------------------------------------ refused from the headers
def test_a_client_without_a_token_is_refused_before_its_body_is_read(guarded):
    """The issue's reproduction: a 74 MB body made the server parse it before its 401. Here the body
    never comes: only the headers are sent, and the 401 arrives at once."""
    head = (f"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 77594624\r\n\r\n").encode()
    status, body, seconds = raw(guarded.port, head)
    assert status == 401 and body["detail"] == "missing or invalid bearer token" and seconds < 10
    wrong = head.replace(b"Content-Type", b"Authorization: Bearer not-the-token\r\nContent-Type")
    status, body, _ = raw(guarded.port, wrong)
    assert status == 401 and "not-the-token" not in body["detail"]


def test_a_declared_body_above_the_limit_is_413_before_it_is_read(guarded):
    head = (f"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 77594624\r\n\r\n").encode()
    status, body, seconds = raw(guarded.port, head)
    assert status == 413 and seconds < 10
    assert "77594624" in body["detail"] and "1048576" in body["detail"] and "--max-body-mb" in body["detail"]


def test_a_streamed_body_is_cut_off_at_the_limit(guarded):
    """A chunked body declares no length: it is read up to the limit (1 MiB here) and refused there
    with 413, while the client is still streaming (the last chunk is never sent)."""
    head = (f"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    piece = b" " * 65536
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    status, body, seconds = raw(guarded.port, head + chunk * 17)  # 1 MiB + 64 KiB, and no end
    assert status == 413 and seconds < 10
    assert "streamed" in body["detail"] and "1048576" in body["detail"] and "--max-body-mb" in body["detail"]


def test_a_host_the_service_does_not_answer_is_refused(guarded):
    """DNS rebinding: a web page makes the browser send requests to 127.0.0.1 under its own name."""
    head = f"GET /health HTTP/1.1\r\nHost: evil.example:{guarded.port}\r\nConnection: close\r\n\r\n".encode()
    status, body, _ = raw(guarded.port, head)
    assert status == 400 and "'evil.example:" in body["detail"] and "--allowed-hosts" in body["detail"]
    for host in ("127.0.0.1", "localhost"):
        status, body, _ = raw(guarded.port, head.replace(b"evil.example", host.encode()))
        assert status == 200 and body["status"] == "ok"
    assert allowed_hosts_for("::1", ["recs.internal"]) == ["[::1]", "localhost", "127.0.0.1", "recs.internal"]


# ------------------------------------------------------------------------ bounded lists and accounts
@pytest.fixture(scope="module")
def small(ml100k):
    """An in-process app with small limits: 3 entries per request, 5 per list, 4 accounts."""
    limits = ServeLimits(max_batch=3, max_list=5, max_accounts=4)
    return TestClient(make_app(make_recommender("popularity", ml100k), dataset=ml100k, limits=limits))


@pytest.mark.parametrize("path, body, named", [
    ("/recommend", {"states": [{}] * 4, "k": 2}, "states holds 4 entries"),
    ("/recommend", {"states": [{}, {"history": ["1", "2", "3", "4", "5", "6"]}], "k": 2},
     "states[1].history holds 6 entries"),
    ("/recommend", {"states": [{"shown": [str(i) for i in range(1, 8)]}], "k": 2}, "states[0].shown holds 7"),
    ("/recommend", {"states": [{"candidates": [str(i) for i in range(1, 7)]}], "k": 2},
     "states[0].candidates holds 6"),
    ("/recommend", {"states": [{"attributes": {f"a{i}": i for i in range(6)}}], "k": 2},
     "states[0].attributes holds 6"),
    ("/accounts", {"accounts": [{"account": "x", "history": [str(i) for i in range(1, 7)]}]},
     "accounts[0].history holds 6"),
    ("/feedback", {"events": [{"account": "x", "item": "1", "type": "like"}] * 4}, "events holds 4"),
    ("/accounts/recommend", {"accounts": ["a", "b", "c", "d"], "k": 2}, "accounts holds 4"),
], ids=["batch", "history", "shown", "candidates", "attributes", "account-history", "events",
        "account-batch"])
def test_batches_and_lists_above_the_limits_are_413_naming_them(small, path, body, named):
    r = small.post(path, json=body)
    assert r.status_code == 413, r.text
    detail = r.json()["detail"]
    assert named in detail and ("--max-batch" in detail or "--max-list" in detail)


def test_the_account_table_is_bounded_and_accounts_can_be_deleted(small):
    accounts = small.app.state.accounts
    for n in range(6):
        assert small.post("/accounts", json={"accounts": [{"account": f"acct-{n}"}]}).status_code == 200
    assert len(accounts) == 4 and accounts.evicted >= 2 and "acct-0" not in accounts
    r = small.post("/accounts/recommend", json={"accounts": ["acct-0"], "k": 2})
    assert r.status_code == 404 and "'acct-0'" in r.json()["detail"] and "evicted" in r.json()["detail"]
    # Using an account makes it recent: the next creation evicts another one.
    assert small.post("/accounts/recommend", json={"accounts": ["acct-2"], "k": 2}).status_code == 200
    small.post("/accounts", json={"accounts": [{"account": "acct-6"}]})
    assert "acct-2" in accounts and "acct-3" not in accounts
    # One request creating more accounts than the table keeps is refused whole.
    too_many = ServeLimits(max_accounts=2)
    app = make_app(small.app.state.recommender, dataset=small.app.state.recommender.dataset, limits=too_many)
    r = TestClient(app).post("/accounts", json={"accounts": [{"account": f"m{n}"} for n in range(3)]})
    detail = r.json()["detail"]
    assert r.status_code == 413 and "3 accounts" in detail and "--max-accounts" in detail
    # Delete: gone afterwards; deleting what is not there is not an error.
    r = small.post("/accounts/delete", json={"accounts": ["acct-2", "never-there"]})
    assert r.status_code == 200 and r.json() == {"deleted": ["acct-2"]}
    assert "acct-2" not in accounts
    assert small.post("/accounts/recommend", json={"accounts": ["acct-2"], "k": 2}).status_code == 404


def test_the_entries_all_accounts_hold_are_bounded_too(ml100k):
    """A history may repeat items, so a count of accounts alone bounds no memory."""
    limits = ServeLimits(max_accounts=100, max_account_items=20)
    client = TestClient(make_app(make_recommender("popularity", ml100k), dataset=ml100k, limits=limits))
    accounts = client.app.state.accounts
    for n in range(3):
        r = client.post("/accounts", json={"accounts": [{"account": f"big-{n}", "history": ["1"] * 8}]})
        assert r.status_code == 200
    assert accounts.items <= 20 and "big-0" not in accounts and "big-2" in accounts
    # Ranking adds shown entries: the least recently used account makes room.
    assert client.post("/accounts/recommend", json={"accounts": ["big-2"], "k": 8}).status_code == 200
    assert accounts.items <= 20 and "big-1" not in accounts and "big-2" in accounts
    r = client.post("/accounts", json={"accounts": [{"account": "huge", "history": ["1"] * 21}]})
    detail = r.json()["detail"]
    assert r.status_code == 413 and "21 history entries" in detail and "--max-account-items" in detail


# ------------------------------------------------------------------------ where it listens
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_a_non_loopback_address_without_a_token_is_refused_before_binding(host, monkeypatch, capsys):
    import ctrlsim.recommenders.http.serve as serve

    bound = []
    monkeypatch.setattr(serve, "listen", lambda *a: bound.append(a))
    monkeypatch.delenv("CTRLSIM_SERVE_TOKEN", raising=False)
    assert main(["serve", "popularity", "--host", host]) == 2
    err = capsys.readouterr().err
    assert repr(host) in err and "$CTRLSIM_SERVE_TOKEN" in err and not bound
    with pytest.raises(ExposedServiceError, match="without a token"):
        check_exposure(host, "CTRLSIM_SERVE_TOKEN", has_token=False)
    check_exposure(host, "CTRLSIM_SERVE_TOKEN", has_token=True)  # with a token it may listen there
    for loopback in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_exposure(loopback, "CTRLSIM_SERVE_TOKEN", has_token=False)


@pytest.mark.parametrize("flag, value, named", [("--max-body-mb", "0", "--max-body-mb"),
                                                ("--max-batch", "20000", "--max-batch"),
                                                ("--max-list", "-1", "--max-list"),
                                                ("--max-accounts", "0", "--max-accounts"),
                                                ("--max-account-items", "0", "--max-account-items"),
                                                ("--allowed-hosts", "evil*.example", "evil*.example")])
def test_bad_limits_exit_2_before_binding(flag, value, named, monkeypatch, capsys):
    import ctrlsim.recommenders.http.serve as serve

    bound = []
    monkeypatch.setattr(serve, "listen", lambda *a: bound.append(a))
    assert main(["serve", "popularity", flag, value]) == 2
    assert named in capsys.readouterr().err and not bound


# ------------------------------------------------------------------------ stateful: the whole logical state
def _lists(slates) -> list[list[str]]:
    return [list(s.item_ids) for s in slates]


def test_two_users_without_an_id_and_the_same_history_never_share_an_account(served_dial, ml100k):
    remote = make_recommender(f"{served_dial.url}#mode=stateful", ml100k, mask_shown=True)
    local = make_recommender("dial:1", ml100k, mask_shown=True)
    history = tuple(ml100k.items_with_tag("War")[:3])
    top = local.recommend([UserState(history=history)], 4)[0].item_ids
    # Same history, each saw other items elsewhere: with one account, each was masked the other's.
    twins = [UserState(history=history, shown=tuple(top[:2])),
             UserState(history=history, shown=tuple(top[2:]))]
    first = remote.recommend(twins, 4)
    assert _lists(first) == _lists(local.recommend(twins, 4)) and first[0].item_ids != first[1].item_ids
    # Each twin goes on alone: neither is masked what the other was shown.
    for n, (twin, slate) in enumerate(zip(twins, first)):
        later = UserState(history=(*history, slate.item_ids[0]), shown=(*twin.shown, *slate.item_ids))
        assert _lists(remote.recommend([later], 4)) == _lists(local.recommend([later], 4)), n
    # Same id, same history, another profile: another logical state, another account.
    pair = [UserState(history=history, user_id="u", profile="likes war films"),
            UserState(history=history, user_id="u", profile=None)]
    assert _lists(remote.recommend(pair, 4)) == _lists(local.recommend(pair, 4))
    # A like the service already has (the history repeats an item) cannot continue an account.
    again = UserState(history=(*history, history[0]), shown=(*twins[0].shown, *first[0].item_ids))
    assert _lists(remote.recommend([again], 4)) == _lists(local.recommend([again], 4))


def test_the_ceiling_runs_in_stateful_mode(served_dial, ml100k):
    """The issue's reproduction: the beam's states share their probe's id, and the stateful box
    failed with a bare StopIteration. Now every beam node is its own logical state, ranked as the
    in-process box ranks it, and the accounts overflow the service's table of 6 on purpose."""
    from ctrlsim.envs import ProbeSpec
    from ctrlsim.envs.ceiling import controllability_ceiling

    war = ml100k.items_with_tag("War")
    probes = [ProbeSpec(history=tuple(war[:2]), name="probe-a"),
              ProbeSpec(history=tuple(war[5:8]), name="probe-b")]
    target = set(war)

    def ceiling(box):
        result = controllability_ceiling(box, probes, target, slate_size=3, budget=3, max_states_per_probe=9)
        return result.reachable, result.first_round, result.states_expanded, result.exhaustive

    remote = make_recommender(f"{served_dial.url}#mode=stateful", ml100k, mask_shown=True, batch_size=4)
    assert ceiling(remote) == ceiling(make_recommender("dial:1", ml100k, mask_shown=True))


def test_an_account_the_service_evicted_is_created_again(served_dial, ml100k, tmp_path):
    import httpx2

    log = tmp_path / "exchanges.jsonl"
    remote = make_recommender(f"{served_dial.url}#mode=stateful", ml100k, mask_shown=True, exchanges=str(log))
    local = make_recommender("dial:1", ml100k, mask_shown=True)
    war = ml100k.items_with_tag("War")
    state = UserState(history=tuple(war[:2]), user_id="kept")
    first = remote.recommend([state], 3)[0]
    created = [e for e in map(json.loads, log.read_text().splitlines()) if e["endpoint"] == "/accounts"]
    account = created[-1]["request"]["accounts"][0]["account"]
    for n in range(8):  # other users fill the service's table of 6: the first account is evicted
        remote.recommend([UserState(history=(war[10 + n],), user_id=f"other-{n}")], 3)
    gone = httpx2.post(f"{served_dial.url}/accounts/recommend", json={"accounts": [account], "k": 3})
    assert gone.status_code == 404 and account in gone.json()["detail"]
    later = UserState(history=(*state.history, first.item_ids[0]), shown=tuple(first.item_ids),
                      user_id="kept")
    assert _lists(remote.recommend([later], 3)) == _lists(local.recommend([later], 3))
