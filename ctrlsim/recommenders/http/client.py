"""A recommender behind an HTTP API as a black box: `make_recommender("http://host:port/path", ds)`.

The contract is `ctrlsim.recommenders.http.contract` (docs/http-recommenders.md). Options go in
the URL's fragment, which is never sent (`http://host:8000#mode=stateful&batch_size=32`), or as
keyword options:

    mode          stateless (default: every request carries the whole user state) or stateful (each
                  probe is an account on the service, likes are sent as feedback events)
    batch_size    states or accounts per request (64)
    concurrency   requests in flight at once (4)
    rate          requests per second at most (none)
    timeout       seconds for a whole request, connect to last byte (30)
    retries       attempts after a connection error, timeout or 5xx (5); 429s are waited out,
                  honouring Retry-After, for up to `throttle_wait` seconds in all (600)
    token_env     the environment variable holding a bearer token (CTRLSIM_RECOMMENDER_TOKEN); the
                  token is sent as `Authorization: Bearer ...` and never stored or printed
    on_invalid    error (default) or skip: an unknown, duplicate, excluded or extra item in a
                  response is a `RecommenderResponseError` naming the field and the request, or is
                  dropped and counted (`stats`)
    verify        TLS certificate verification (true)

Every exchange (request, response, status, time; no headers) is appended to the exchange log: the
run's `<out>/exchanges.jsonl` (the driver lends it to every unit, `ctrlsim.run_settings`) or the
`exchanges` option. A request whose logical content was seen before with another answer is counted in
`stats["changed"]` and warned about (`ExchangeChangedWarning`): the service answered the same user
state differently. With `--replay RUN` (or the `replay` option) pointing at a
recorded log, no request leaves the machine: each answer comes from the log, and a request the log
does not hold is a `ReplayMissError`. The log is checked first: an answer edited since it was
recorded, or lines without digests, are a `ReplayLogError` unless `--replay-unverified` (or the
`replay_unverified` option) allows it (`ctrlsim.recommenders.http.exchanges`).

Stateful accounts are keyed by the whole logical state (user id, profile, attributes, flags, history,
shown items: `ctrlsim.recommenders.http.lineage`): a state continues an account only when events (new
likes; items shown elsewhere, such as search results) turn the account's state into exactly this one;
otherwise (a new episode, another beam node of the ceiling, another user) a fresh account is created.
An account the service no longer has (evicted, deleted) is created again from the state, once.

Negative feedback (not interested, dislikes, blocked tags) and the settings of the box's controls
travel only when the service speaks contract version 2; the box asks its version the first time it
needs to know (`ctrlsim.recommenders.http.negotiation`). Against a version-1 service they are never
sent, `controls` declares none and `negative_feedback` says they are ignored.
"""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from typing import Any, Sequence

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import Candidates, Recommender, Slate, UserState
from ctrlsim.recommenders.http.answers import checked_slates
from ctrlsim.recommenders.http.contract import ENDPOINTS
from ctrlsim.recommenders.http.exchanges import (
    MISSING,
    ExchangeChangedWarning,
    ExchangeLog,
    ReplayMissError,
    exchange_key,
    log_for,
    read_exchanges,
)
from ctrlsim.recommenders.http.lineage import AccountIndex, ServiceAccount, negative_fields, plain_attributes
from ctrlsim.recommenders.http.negotiation import (
    UNRECORDED_HEALTH,
    ServiceTerms,
    as_sent,
    needs_negotiation,
    spoken_version,
    terms_from_controls,
    v1_terms,
)
from ctrlsim.recommenders.http.options import DEFAULTS, checked_options, is_http, parse_http_spec
from ctrlsim.recommenders.http.transport import RecommenderResponseError, Transport
from ctrlsim.redact import redact_secrets as _shown
from ctrlsim.run_settings import current_exchange_settings

__all__ = ["DEFAULTS", "ExchangeChangedWarning", "ExchangeLog", "HttpRecommender", "RecommenderResponseError",
           "ReplayMissError", "is_http", "parse_http_spec", "read_exchanges"]


# ----------------------------------------------------------------------------- the black box


class HttpRecommender(Recommender):
    """A remote recommender (see the module docstring)."""

    name = "http"

    def __init__(
        self,
        dataset: Dataset,
        *,
        url: str,
        exclude_history: bool = True,
        mask_shown: bool = False,
        **options: Any,
    ):
        super().__init__(dataset, exclude_history=exclude_history, mask_shown=mask_shown)
        base, from_fragment = parse_http_spec(url)
        self.base = base
        self.options = checked_options({**from_fragment, **options})
        self.transport = Transport(base, self.options)
        self.stats: dict[str, float] = {"skipped_items": 0, "short_lists": 0, "changed": 0}
        self._accounts = AccountIndex()  # the service accounts, keyed by the whole logical state
        self._busy: set[int] = set()  # accounts a request in flight uses (ids of `ServiceAccount`s)
        self._nonce = uuid.uuid4().hex[:8]  # live account ids of this client never collide with another's
        self._account_counter = 0
        self._lock = threading.Lock()
        self._terms: ServiceTerms | None = None  # asked once, when first needed (`terms`)
        self._terms_lock = threading.Lock()

    @property
    def identity(self) -> dict:
        return {
            "recommender": "http",
            "url": _shown(self.base),
            "mode": self.options["mode"],
            "dataset": self.dataset.name,
        }

    # ------------------------------------------------------------------ what the service speaks
    def terms(self) -> ServiceTerms:
        """The contract version spoken with the service and what it declares, asked once: `GET /health`,
        then, from version 2, `GET /controls` (both recorded, and answered from the log in a replay)."""
        with self._terms_lock:
            if self._terms is None:
                where = _shown(self.base)
                health = self._exchange(ENDPOINTS["health"], None, None, method="GET",
                                        unrecorded=dict(UNRECORDED_HEALTH))
                if spoken_version(health, where) == "1":
                    self._terms = v1_terms()
                else:
                    answer = self._exchange(ENDPOINTS["controls"], None, None, method="GET")
                    self._terms = terms_from_controls(answer, where)
            return self._terms

    @property
    def controls(self):
        """The controls the service's box declares (`GET /controls`); none from a version-1 service."""
        return self.terms().controls

    @property  # type: ignore[override]
    def negative_feedback(self) -> str:
        """What the service's box does with negative feedback, in its own words (`GET /controls`); from a
        version-1 service, that it is ignored (it never reaches the service)."""
        return self.terms().negative_feedback

    @negative_feedback.setter
    def negative_feedback(self, value: str) -> None:
        raise ConfigError("an HTTP box's negative_feedback is the service's own statement (GET /controls)")

    @property
    def reads_negative_feedback(self) -> bool:
        return self.terms().reads_negative_feedback

    # ------------------------------------------------------------------ exchanges
    def _log(self) -> ExchangeLog | None:
        path = self.options["exchanges"] or current_exchange_settings().log
        return log_for(path) if path else None

    def _replay(self) -> ExchangeLog | None:
        """The recorded log this box answers from, checked before any answer of it is used."""
        if self.options["replay"]:
            path, unverified = self.options["replay"], self.options["replay_unverified"]
        else:
            settings = current_exchange_settings()
            path, unverified = settings.replay, settings.replay_unverified
        if not path:
            return None
        log = log_for(path)
        log.check_replay(unverified=unverified)
        return log

    def _exchange(self, endpoint: str, body: Any, logical: Any, *, answers: bool = True, method: str = "POST",
                  unrecorded: Any = MISSING) -> Any:
        """One request, recorded in the exchange log. `answers`: the response is an answer (a
        recommendation, the service's version or controls: looked up when replaying, compared with
        earlier answers); otherwise an acknowledgement (accounts, feedback), which a replay does not
        send at all. `unrecorded`: what a replay answers when its log lacks the request."""
        key = exchange_key(self.base, endpoint, logical)
        replay = self._replay()
        if replay is not None:
            answer = replay.answer(key) if answers else None
            if answer is MISSING and unrecorded is not MISSING:
                answer = unrecorded
            elif answer is MISSING:
                raise ReplayMissError(
                    f"replaying {replay.path}: the recorded run never sent this {endpoint} "
                    f"request (key {key[:12]}); the replayed run differs from the recorded one"
                )
            status, seconds = 200, 0.0
        else:
            status, answer, seconds = self.transport.call(method, endpoint, body)
        log = self._log()
        entry = {
            "time": time.time(),
            "url": _shown(self.base),
            "endpoint": endpoint,
            "key": key if answers else None,
            "logical": logical,
            "request": body,
            "status": status,
            "seconds": round(seconds, 4),
            "response": answer,
            "replayed": replay is not None,
        }
        if log is not None and log.append(entry):
            with self._lock:
                self.stats["changed"] += 1
            warnings.warn(
                ExchangeChangedWarning(
                    f"{_shown(self.base)}{endpoint} answered a request it answered before (key {key[:12]}) "
                    f"differently; both answers are in {log.path}"
                ),
                stacklevel=3,
            )
        return answer

    # ------------------------------------------------------------------ recommend
    def recommend(self, states: Sequence[UserState], k: int, candidates: Candidates = None) -> list[Slate]:
        states = self._check_states(states)
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        if k > len(self.dataset.items):
            raise ConfigError(f"k={k} is larger than the catalogue ({len(self.dataset.items)} items)")
        for state in states:
            self.dataset.check_items(state.history)
            self.dataset.check_items(state.shown)
            self.dataset.check_items(state.negatives)
        if needs_negotiation(states):  # a version-1 service cannot receive these: they stay here
            contract = self.terms().contract
            states = [as_sent(s, contract) for s in states]
        pools = self._pools(states, candidates)
        pool_ids = None if pools is None else [[str(i) for i in self.dataset.item_ids[p]] for p in pools]
        if self.options["mode"] == "stateful":
            if pool_ids is not None:
                raise ConfigError(
                    "a stateful HTTP box ranks the whole catalogue; candidate pools need mode=stateless"
                )
            return self._recommend_stateful(states, int(k))
        return self._recommend_stateless(states, int(k), pool_ids)

    def _state_body(self, state: UserState, pool: list[str] | None) -> dict:
        body: dict[str, Any] = {
            "history": list(state.history),
            "profile": state.profile,
            "attributes": plain_attributes(state.attributes),
            "shown": list(state.shown),
            **negative_fields(state),  # only what a state has, and only to a version-2 service
        }
        if pool is not None:
            body["candidates"] = pool
        return body

    def _recommend_stateless(
        self, states: list[UserState], k: int, pools: list[list[str]] | None
    ) -> list[Slate]:
        bodies = [self._state_body(s, None if pools is None else pools[n]) for n, s in enumerate(states)]
        size = self.options["batch_size"]
        batches = [
            list(range(start, min(start + size, len(states)))) for start in range(0, len(states), size)
        ]

        def one(batch: list[int]) -> list[Slate]:
            body = {
                "states": [bodies[i] for i in batch],
                "k": k,
                "exclude_history": self.exclude_history,
                "mask_shown": self.mask_shown,
            }
            answer = self._exchange("/recommend", body, body)
            return self._slates(
                answer,
                [states[i] for i in batch],
                k,
                "/recommend",
                [None if pools is None else pools[i] for i in batch],
                [set(states[i].shown) for i in batch],
            )

        return [slate for part in self.transport.map(one, batches) for slate in part]

    def _recommend_stateful(self, states: list[UserState], k: int) -> list[Slate]:
        try:
            return self._stateful_once(states, k)
        except RecommenderResponseError as exc:
            # The service no longer has an account (evicted from its bounded table, or deleted). The
            # accounts of the failed request left the index, so the retry creates them afresh from the
            # states, which hold everything the accounts held.
            if exc.status != 404 or "unknown account" not in str(exc):
                raise
        return self._stateful_once(states, k)

    def _stateful_once(self, states: list[UserState], k: int) -> list[Slate]:
        """One account per state (`ctrlsim.recommenders.http.lineage`): continued or created, then
        events, then one ranking request per batch."""
        creations: list[dict] = []
        events: list[dict] = []
        logical_events: list[dict] = []  # an event's logical content: the state's history, not the id
        accounts: list[ServiceAccount] = []
        with self._lock:
            taken = set(self._busy)
            for state in states:
                plan = self._accounts.assign(state, exclude_history=self.exclude_history, taken=taken,
                                             mask_shown=self.mask_shown, new_id=self._new_account_id)
                creations.extend([plan.creation] if plan.creation else [])
                events.extend(plan.events)
                logical_events.extend({**{k: v for k, v in e.items() if k != "account"},
                                       "history": list(state.history)} for e in plan.events)
                accounts.append(plan.account)
            busy = {id(a) for a in accounts}
            self._busy |= busy
        try:
            slates = self._stateful_exchanges(accounts, states, k, creations, events, logical_events)
        except BaseException:
            # What the service holds for these accounts is unknown now: never continue them.
            with self._lock:
                for account in accounts:
                    self._accounts.remove(account)
            raise
        finally:
            with self._lock:
                self._busy -= busy
        with self._lock:
            for account, slate in zip(accounts, slates):
                served = set(account.served)
                account.served.extend(i for i in slate.item_ids if i not in served)
        return slates

    def _new_account_id(self) -> str:
        self._account_counter += 1
        return f"{self.options['account_prefix']}-{self._nonce}-{self._account_counter}"

    def _stateful_exchanges(self, accounts: list[ServiceAccount], states: list[UserState], k: int,
                            creations: list[dict], events: list[dict], logical_events: list[dict]
                            ) -> list[Slate]:
        logical_state = [a.logical() for a in accounts]  # the exchange keys (live ids differ per client)
        size = self.options["batch_size"]
        if creations:
            self.transport.map(
                lambda part: self._exchange(
                    "/accounts",
                    {"accounts": part},
                    {"accounts": [_without_id(c) for c in part]},
                    answers=False,
                ),
                _chunks(creations, size),
            )
        if events:
            self.transport.map(
                lambda part: self._exchange(
                    "/feedback",
                    {"events": [events[i] for i in part]},
                    {"events": [logical_events[i] for i in part]},
                    answers=False,
                ),
                _chunks(list(range(len(events))), size),
            )
        batches = _chunks(list(range(len(accounts))), size)

        def one(batch: list[int]) -> list[Slate]:
            body = {"accounts": [accounts[i].account for i in batch], "k": k}
            logical = {"accounts": [logical_state[i] for i in batch], "k": k}
            answer = self._exchange("/accounts/recommend", body, logical)
            shown = [accounts[i].covered() for i in batch]
            return self._slates(
                answer, [states[i] for i in batch], k, "/accounts/recommend", [None] * len(batch), shown
            )

        return [slate for part in self.transport.map(one, batches) for slate in part]

    def score_all(self, states: Sequence[UserState]) -> np.ndarray:
        raise ConfigError("an HTTP black box answers ranked lists, not a score for every item: "
                          "ask it with recommend(states, k)")

    # ------------------------------------------------------------------ checks
    def _slates(self, answer: Any, states: list[UserState], k: int, endpoint: str,
                pools: list[list[str] | None], shown: list[set[str]]) -> list[Slate]:
        def count(skipped: int, short: bool) -> None:
            with self._lock:
                self.stats["skipped_items"] += skipped
                self.stats["short_lists"] += short

        return checked_slates(answer, states, k, f"{_shown(self.base)}{endpoint}", pools, shown,
                              known=self.dataset.item_index, exclude_history=self.exclude_history,
                              mask_shown=self.mask_shown, on_invalid=self.options["on_invalid"], count=count)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state.pop("_busy", None)
        state.pop("_terms_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._busy = set()
        self._terms_lock = threading.Lock()


def _without_id(creation: dict) -> dict:
    return {k: v for k, v in creation.items() if k != "account"}


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]
