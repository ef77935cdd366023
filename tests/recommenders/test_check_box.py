"""`ctrlsim check-box SPEC` (issue 49, part 2): a healthy server passes every check (ctrlsim's contract
and the PRC's), and each kind of broken server fails, exit 1, with the failing check named in the table.
No timing is asserted of a healthy server beyond passing a generous objective."""

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from ctrlsim.experiments.cli import main  # noqa: E402
from ctrlsim.recommenders import make_recommender  # noqa: E402
from ctrlsim.recommenders.http.contract import Health, RecommendRequest, RecommendResponse  # noqa: E402
from ctrlsim.recommenders.http.prc.serve import make_prc_app  # noqa: E402
from ctrlsim.recommenders.http.serve import make_app  # noqa: E402
from ctrlsim.recommenders.http.serve_process import ServedApp  # noqa: E402

FAST = ["--requests", "5", "--examples", "0"]


def rows(output: str) -> dict[str, str]:
    """check name -> result (pass, FAIL, skip) from the printed table."""
    found = {}
    for line in output.splitlines():
        for result in ("pass", "FAIL", "skip"):
            name, sep, _ = line.partition(f"  {result}")
            if sep and name.strip():
                found[name.strip()] = result
                break
    return found


@pytest.mark.parametrize("contract", ["ctrlsim", "prc"])
def test_a_healthy_server_passes_every_check(ml100k, capsys, contract):
    box = make_recommender("popularity", ml100k)
    app = make_app(box, dataset=ml100k) if contract == "ctrlsim" else make_prc_app(box, dataset=ml100k)
    with ServedApp(app) as served:
        spec = served.url if contract == "ctrlsim" else f"prc+{served.url}/rank"
        status = main(
            ["check-box", spec, "--requests", "5", "--examples", "3", "--latency-objective-ms", "10000"]
        )
    out = capsys.readouterr().out
    assert status == 0, out
    assert set(rows(out).values()) == {"pass"} and "every check passed" in out and "p95" in out


def broken_app(ml100k, kind: str):
    """A service of ctrlsim's contract that breaks it one way (`kind`)."""
    popular = (
        ml100k.items.sort_values("popularity", ascending=False, kind="stable")["item_id"].astype(str).tolist()
    )
    app = FastAPI()
    calls = {"n": 0}

    @app.get("/health")
    def health() -> dict:
        return Health(status="ok", modes=["stateless"], items=len(popular)).model_dump()

    @app.post("/recommend", responses={200: {"model": RecommendResponse}})
    def recommend(request: RecommendRequest):
        calls["n"] += 1
        lists = []
        for state in request.states:
            pool = state.candidates or popular
            banned = set(state.history) | (set(state.shown) if request.mask_shown else set())
            items = [i for i in pool if i not in banned][: request.k]
            if kind == "duplicates":
                items = items[:1] + items[:-1]
            elif kind == "unknown ids":
                items = ["no-such-film"] + items[1:]
            elif kind == "wrong k":
                items = items[:-1]
            elif kind == "changing":
                items = items[calls["n"] % 2 :] + items[: calls["n"] % 2]
            lists.append({"items": items})
        if kind == "slow":
            time.sleep(0.15)
        if kind == "schema":
            return JSONResponse({"lists": [{"items": [int(i) for i in ls["items"]]} for ls in lists]})
        return JSONResponse({"lists": lists})

    return app


@pytest.mark.parametrize(
    "kind, failing, extra",
    [
        ("duplicates", "no duplicates", []),
        ("unknown ids", "known ids", []),
        ("wrong k", "k honoured", []),
        ("changing", "deterministic", []),
        ("slow", "latency", ["--latency-objective-ms", "50"]),
        ("schema", "schema", []),
        ("schema", "openapi", ["--examples", "3"]),
    ],
)
def test_each_broken_server_fails_naming_the_check(ml100k, capsys, kind, failing, extra):
    with ServedApp(broken_app(ml100k, kind)) as served:
        status = main(["check-box", served.url, *FAST, *extra])
    out = capsys.readouterr().out
    assert status == 1, out
    assert rows(out)[failing] == "FAIL", out
    assert "FAILED" in out
    if failing != "latency":
        line = next(line for line in out.splitlines() if line.startswith(failing))
        assert "/recommend" in line  # the failing request is named


def test_a_broken_prc_ranker_fails(ml100k, capsys):
    from fastapi import Request

    app = FastAPI()

    @app.post("/rank")
    async def rank(request: Request) -> dict:
        ids = [item["id"] for item in (await request.json())["items"]]
        return {"ranked_ids": ids[:1] + ids[:-2]}  # a duplicate, and not every item

    with ServedApp(app) as served:
        status = main(["check-box", f"prc+{served.url}/rank", *FAST])
    found = rows(capsys.readouterr().out)
    assert status == 1
    assert found["no duplicates"] == "FAIL" and found["k honoured"] == "FAIL" and found["health"] == "skip"


def test_bad_values_exit_2(capsys):
    assert main(["check-box", "ftp://example.org", *FAST]) == 2
    assert "check-box takes" in capsys.readouterr().err
