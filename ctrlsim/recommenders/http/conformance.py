"""`ctrlsim check-box SPEC`: does a box behind HTTP keep its contract? (docs/prc.md#check-box)

SPEC is a service of ctrlsim's contract (`http(s)://host:port`) or a PRC ranker
(`prc+http(s)://host:port/rank`). The checks, each with the first request that failed it:

    health         GET /health answers 200 (ctrlsim: a `Health` body; a PRC ranker need not have one)
    schema         every representative request is answered 200 with a body of the schema
    no duplicates  no list holds an id twice
    known ids      every id is an item of the catalogue (ctrlsim) or of the request (PRC), inside the
                   candidate pool when one was sent, and never an item the request excluded
    k honoured     ctrlsim: k items (fewer only when fewer were eligible); PRC: every item ranked
    deterministic  the same request, sent again, gets the same answer
    openapi        requests generated from the service's own /openapi.json (hypothesis, through
                   schemathesis: the `dev` extra) get documented statuses, no 5xx, and bodies of the
                   documented schemas; skipped when the service publishes no document
    latency        p50, p95 and p99 of `latency_requests` sequential requests; passes when p95 is
                   within the objective (500 ms, the PRC's)

The representative requests are fixed and built from the catalogue (ctrlsim: users with no history,
a short and a longer history with shown items, masking on, a candidate pool; PRC: the same users as
`/rank` requests over pools chosen by the PRC box's rule). A bearer token is read from
`token_env` (CTRLSIM_RECOMMENDER_TOKEN) and never printed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError, MissingDependencyError
from ctrlsim.recommenders.base import UserState

LATENCY_OBJECTIVE_MS = 500.0  # the PRC's p95 objective, the default for every box
CHECKS = (
    "health",
    "schema",
    "no duplicates",
    "known ids",
    "k honoured",
    "deterministic",
    "openapi",
    "latency",
)


@dataclass
class Check:
    """One check's outcome: passed (True), failed (False) or skipped (None), why, and the request."""

    name: str
    passed: bool | None = True
    detail: str = ""
    request: str = ""

    def fail(self, detail: str, request: Any = "") -> None:
        if self.passed is not False:  # the first failure is the one reported
            self.passed, self.detail, self.request = False, detail, _short(request)


@dataclass
class Report:
    spec: str
    checks: dict[str, Check] = field(default_factory=lambda: {n: Check(n) for n in CHECKS})
    latency_ms: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.passed is not False for c in self.checks.values())

    def table(self) -> str:
        from tabulate import tabulate

        rows = [
            [c.name, {True: "pass", False: "FAIL", None: "skip"}[c.passed], c.detail, c.request]
            for c in self.checks.values()
        ]
        return tabulate(rows, headers=["check", "result", "detail", "failing request"])


def _short(request: Any, limit: int = 160) -> str:
    text = request if isinstance(request, str) else json.dumps(request, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50, p95 and p99 of request durations, in milliseconds."""
    values = np.asarray(seconds, dtype=float) * 1000.0
    return {f"p{q}": float(np.percentile(values, q)) for q in (50, 95, 99)}


def _users(dataset: Dataset) -> list[UserState]:
    items = (
        dataset.items.sort_values("popularity", ascending=False, kind="stable")["item_id"]
        .astype(str)
        .tolist()
    )
    return [
        UserState(user_id="check-0"),
        UserState(history=tuple(items[:2]), user_id="check-1"),
        UserState(history=tuple(items[10:15]), shown=tuple(items[10:15] + items[:3]), user_id="check-2"),
    ]


@dataclass
class Probe:
    """One representative request and how to read its answer: the lists it holds, and for each list
    the ids allowed, the ids excluded and the length expected."""

    path: str
    body: dict
    lists: Callable[[Any], list[list[str]]]
    allowed: list[set[str] | None]
    banned: list[set[str]]
    expected: list[int]


def _ctrlsim_probes(dataset: Dataset, k: int) -> list[Probe]:
    from ctrlsim.recommenders.http.contract import RecommendResponse

    def lists(answer: Any) -> list[list[str]]:
        return [r.items for r in RecommendResponse.model_validate(answer).lists]

    n_items, probes = len(dataset.items), []
    pool = [str(i) for i in dataset.item_ids[: max(2 * k, 20)]]
    for mask in (False, True):
        states = _users(dataset)
        body = {
            "states": [{"history": list(s.history), "shown": list(s.shown)} for s in states],
            "k": k,
            "exclude_history": True,
            "mask_shown": mask,
        }
        banned = [set(s.history) | (set(s.shown) if mask else set()) for s in states]
        probes.append(
            Probe(
                "/recommend",
                body,
                lists,
                [None] * len(states),
                banned,
                [min(k, n_items - len(b)) for b in banned],
            )
        )
    state = _users(dataset)[1]
    body = {"states": [{"history": list(state.history), "candidates": pool}], "k": k}
    eligible = set(pool) - set(state.history)
    probes.append(
        Probe("/recommend", body, lists, [set(pool)], [set(state.history)], [min(k, len(eligible))])
    )
    return probes


def _prc_probes(dataset: Dataset, k: int, path: str) -> list[Probe]:
    from ctrlsim.recommenders.http.prc.adapter import choose_pool, ranking_request
    from ctrlsim.recommenders.http.prc.schema import RankingResponse

    def lists(answer: Any) -> list[list[str]]:
        return [RankingResponse.model_validate(answer).ranked_ids]

    probes = []
    for state in _users(dataset):
        pool = choose_pool(
            dataset, state, k, rule="sample", size=max(k, 20), seed=0, exclude_history=True, mask_shown=True
        )
        body = ranking_request(dataset, state, pool, platform="reddit", send_state=True)
        probes.append(Probe(path, body, lists, [set(pool)], [set()], [len(pool)]))
    return probes


class _Client:
    def __init__(self, root: str, token_env: str, timeout: float):
        try:
            import httpx2
        except ImportError as exc:
            raise MissingDependencyError("httpx2", "serve", "ctrlsim check-box") from exc
        token = os.environ.get(token_env)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.root = root
        self.http = httpx2.Client(timeout=timeout)
        self.errors = (httpx2.TransportError, OSError)

    def send(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
        """(status, JSON body or the text when not JSON, seconds); a connection failure is status 0."""
        began = time.perf_counter()
        try:
            response = self.http.request(method, self.root + path, json=body, headers=self.headers)
        except self.errors as exc:
            return 0, f"{type(exc).__name__}: {exc}", time.perf_counter() - began
        seconds = time.perf_counter() - began
        try:
            return response.status_code, response.json(), seconds
        except ValueError:
            return response.status_code, response.text[:200], seconds


def check_box(
    spec: str,
    dataset: Dataset,
    *,
    k: int = 10,
    latency_requests: int = 50,
    examples: int = 10,
    objective_ms: float = LATENCY_OBJECTIVE_MS,
    token_env: str = "CTRLSIM_RECOMMENDER_TOKEN",
    timeout: float = 30.0,
) -> Report:
    """Run every check on the service `spec` names (see the module docstring)."""
    from urllib.parse import urlsplit, urlunsplit

    from ctrlsim.recommenders.http.prc.box import is_prc, split_prc_spec

    if not isinstance(k, int) or not 1 <= k <= len(dataset.items):
        raise ConfigError(f"--k must be in 1..{len(dataset.items)}, got {k!r}")
    if latency_requests < 1 or examples < 0 or objective_ms <= 0:
        raise ConfigError("--requests must be >= 1, --examples >= 0 and --latency-objective-ms > 0")
    prc = is_prc(spec)
    if prc:
        root, path, _ = split_prc_spec(spec)
        root = urlunsplit(urlsplit(root)._replace(fragment=""))
        probes = _prc_probes(dataset, k, path)
    elif spec.startswith(("http://", "https://")):
        parts = urlsplit(spec)
        root = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        probes = _ctrlsim_probes(dataset, k)
    else:
        raise ConfigError(f"check-box takes an http(s):// service or a prc+http(s):// ranker, got {spec!r}")
    client = _Client(root, token_env, timeout)
    report = Report(spec)
    checks = report.checks
    known = dataset.item_index

    status, health, _ = client.send("GET", "/health")
    if prc and status == 404:
        checks["health"].passed, checks["health"].detail = None, "no /health (the PRC schema defines none)"
    elif status != 200:
        checks["health"].fail(f"HTTP {status}: {_short(health, 100)}", "GET /health")
    elif not prc:
        from pydantic import ValidationError

        from ctrlsim.recommenders.http.contract import Health

        try:
            Health.model_validate(health)
        except ValidationError as exc:
            checks["health"].fail(f"not a Health body: {exc.errors()[0]['msg']}", "GET /health")

    for probe in probes:
        where = {"POST": probe.path, "body": probe.body}
        status, answer, _ = client.send("POST", probe.path, probe.body)
        if status != 200:
            checks["schema"].fail(f"HTTP {status}: {_short(answer, 100)}", where)
            continue
        try:
            lists = probe.lists(answer)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            checks["schema"].fail(f"the body breaks the schema: {str(exc).splitlines()[:3]}", where)
            continue
        if len(lists) != len(probe.expected):
            checks["schema"].fail(f"{len(lists)} lists for {len(probe.expected)} states", where)
            continue
        _check_lists(checks, lists, probe, known, prc, where)
        again = client.send("POST", probe.path, probe.body)
        if again[0] != 200 or again[1] != answer:
            checks["deterministic"].fail("the same request got another answer the second time", where)

    _openapi(checks["openapi"], root, client.headers, examples)

    first = probes[0]
    seconds = [client.send("POST", first.path, first.body)[2] for _ in range(latency_requests)]
    report.latency_ms = percentiles(seconds)
    line = ", ".join(f"{q} {v:.1f} ms" for q, v in report.latency_ms.items())
    checks[
        "latency"
    ].detail = f"{line} over {latency_requests} requests (objective: p95 <= {objective_ms:g} ms)"
    if report.latency_ms["p95"] > objective_ms:
        checks["latency"].fail(checks["latency"].detail, {"POST": first.path, "body": first.body})
    client.http.close()
    return report


def _check_lists(
    checks: dict[str, Check], lists: list[list[str]], probe: Probe, known: Any, prc: bool, where: dict
) -> None:
    for n, items in enumerate(lists):
        field_name = "ranked_ids" if prc else f"lists[{n}].items"
        duplicates = sorted({i for i in items if items.count(i) > 1})
        if duplicates:
            checks["no duplicates"].fail(f"{field_name}: {duplicates[0]!r} appears twice", where)
        allowed, banned = probe.allowed[n], probe.banned[n]
        for pos, item in enumerate(items):
            if item not in known or (allowed is not None and item not in allowed):
                what = "the request's items" if prc else "the candidate pool" if allowed else "the catalogue"
                checks["known ids"].fail(f"{field_name}[{pos}]: {item!r} is not in {what}", where)
            elif item in banned:
                checks["known ids"].fail(
                    f"{field_name}[{pos}]: {item!r} was excluded (history or shown)", where
                )
        if len(items) != probe.expected[n]:
            want = f"every one of the {probe.expected[n]} items" if prc else f"{probe.expected[n]} items (k)"
            checks["k honoured"].fail(f"{field_name}: {len(items)} items, expected {want}", where)


def _openapi(check: Check, root: str, headers: dict, examples: int) -> None:
    """Generated requests from the service's own OpenAPI document (hypothesis, via schemathesis)."""
    if examples == 0:
        check.passed, check.detail = None, "--examples 0"
        return
    try:
        import schemathesis
        from hypothesis import HealthCheck, Phase, given, settings
        from schemathesis import GenerationMode
        from schemathesis.checks import positive_data_acceptance
        from schemathesis.core.failures import FailureGroup
        from schemathesis.core.result import Ok
    except ImportError:
        check.passed, check.detail = None, 'needs schemathesis: pip install "ctrlsim[dev]"'
        return
    try:
        schema = schemathesis.openapi.from_url(root + "/openapi.json", headers=headers)
    except Exception as exc:  # noqa: BLE001 (any failure to load means: no usable document)
        check.passed, check.detail = None, f"no usable /openapi.json ({type(exc).__name__})"
        return
    calls, failures = 0, 0
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            check.fail(f"the OpenAPI document has an invalid operation: {result.err()}", "GET /openapi.json")
            continue
        operation = result.ok()

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def conforms(case) -> None:
            nonlocal calls, failures
            calls += 1
            try:
                # A valid request naming items this catalogue lacks is rightly refused (404).
                case.call_and_validate(
                    base_url=root, headers=headers, excluded_checks=[positive_data_acceptance]
                )
            except (Exception, FailureGroup) as exc:  # noqa: BLE001 (schemathesis raises a failed check)
                failures += 1
                parts = exc.exceptions if isinstance(exc, FailureGroup) else [exc]
                message = "; ".join(" ".join(str(p).split("\n")[0].split()) for p in parts)[:160]
                method, path = case.operation.method.upper(), case.operation.path
                check.fail(f"{method} {path}: {message}", {method: path, "body": case.body})

        conforms()
    if check.passed:
        check.detail = f"{calls} generated requests conform"
    else:
        check.detail = f"{failures} of {calls} generated requests failed; first: {check.detail}"
