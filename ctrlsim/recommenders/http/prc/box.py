"""A Prosocial Ranking Challenge ranker as a ctrlsim black box:
`make_recommender("prc+http://host:port/rank", dataset)` (docs/prc.md).

It is an `HttpRecommender` speaking another schema: the same transport (deadline, retries, 429s,
rate, bearer token), exchange log and replay. Each state becomes one `POST /rank` whose items are the
pool `adapter.choose_pool` chooses; the answer's `ranked_ids` are checked (a known id of the request,
no duplicate) and the first k are the slate, which then passes the checks of every HTTP box
(`answers.checked_slates`: exclusions, the pool, fewer than k). Options (URL fragment or keywords) are
those of the HTTP box (stateless only) plus `pool`, `pool_size`, `pool_seed`, `platform`, `send_state`.
"""

from __future__ import annotations

from typing import Any, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import Candidates, Slate, UserState
from ctrlsim.recommenders.controls import NO_CONTROLS
from ctrlsim.recommenders.http.client import HttpRecommender
from ctrlsim.recommenders.http.negotiation import ServiceTerms
from ctrlsim.recommenders.http.prc.adapter import (
    PRC_DEFAULTS,
    checked_prc_options,
    choose_pool,
    ranking_request,
)
from ctrlsim.recommenders.http.prc.schema import RANK_PATH
from ctrlsim.recommenders.http.transport import RecommenderResponseError
from ctrlsim.redact import redact_secrets as _shown

PREFIX = "prc+"


def is_prc(name: object) -> bool:
    return isinstance(name, str) and name.startswith(("prc+http://", "prc+https://"))


def split_prc_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """(the HTTP spec of the service's root with the fragment's HTTP options, the /rank path, the PRC
    options of the fragment) of `prc+http(s)://host:port/path#...`; the path defaults to /rank."""
    if not is_prc(spec):
        raise ConfigError(
            f"a PRC box spec starts with prc+http:// or prc+https://, got {_shown(str(spec))!r}"
        )
    parts = urlsplit(spec[len(PREFIX) :])
    pairs = parse_qsl(parts.fragment, keep_blank_values=True)
    prc = {k: v for k, v in pairs if k in PRC_DEFAULTS}
    http = urlencode([(k, v) for k, v in pairs if k not in PRC_DEFAULTS])
    root = urlunsplit((parts.scheme, parts.netloc, "", "", http))
    return root, parts.path.rstrip("/") or RANK_PATH, prc


def check_prc_spec(spec: str) -> None:
    from ctrlsim.recommenders.http.options import checked_options, parse_http_spec

    root, _, prc = split_prc_spec(spec)
    checked_options(parse_http_spec(root)[1])
    checked_prc_options(prc)


class PrcRecommender(HttpRecommender):
    """A PRC ranker behind `POST /rank` (see the module docstring)."""

    name = "prc"

    def __init__(
        self,
        dataset: Dataset,
        *,
        url: str,
        exclude_history: bool = True,
        mask_shown: bool = False,
        **options: Any,
    ):
        root, self.rank_path, from_fragment = split_prc_spec(url)
        prc = {k: options.pop(k) for k in list(options) if k in PRC_DEFAULTS}
        self.prc = checked_prc_options({**from_fragment, **prc})
        super().__init__(dataset, url=root, exclude_history=exclude_history, mask_shown=mask_shown, **options)
        if self.options["mode"] != "stateless":
            raise ConfigError(
                "a PRC ranker is stateless: each /rank request carries the session and its items"
            )

    @property
    def identity(self) -> dict:
        return {
            "recommender": "prc",
            "url": _shown(self.base + self.rank_path),
            "dataset": self.dataset.name,
            **{k: self.prc[k] for k in ("pool", "pool_size", "pool_seed", "platform", "send_state")},
        }

    def terms(self) -> ServiceTerms:
        """The PRC schema declares no controls; negative feedback reaches the ranker only in the
        `ctrlsim` extension field, which a PRC ranker ignores, so it is not counted as read."""
        return ServiceTerms("prc", NO_CONTROLS, "a PRC ranker's schema carries no negative feedback", False)

    def pools(self, states: Sequence[UserState], k: int, candidates: Candidates = None) -> list[list[str]]:
        """The pool each state's request ranks (`adapter.choose_pool`)."""
        given = self._pools(list(states), candidates)
        return [
            choose_pool(
                self.dataset,
                s,
                k,
                rule=self.prc["pool"],
                size=self.prc["pool_size"],
                seed=self.prc["pool_seed"],
                exclude_history=self.exclude_history,
                mask_shown=self.mask_shown,
                candidates=None if given is None else [str(self.dataset.item_ids[i]) for i in given[n]],
            )
            for n, s in enumerate(states)
        ]

    def recommend(self, states: Sequence[UserState], k: int, candidates: Candidates = None) -> list[Slate]:
        states = self._check_states(states)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        if k > len(self.dataset.items):
            raise ConfigError(f"k={k} is larger than the catalogue ({len(self.dataset.items)} items)")
        for state in states:
            for items in (state.history, state.shown, state.negatives):
                self.dataset.check_items(items)
        pools = self.pools(states, k, candidates)

        def one(n: int) -> Slate:
            body = ranking_request(
                self.dataset,
                states[n],
                pools[n],
                platform=self.prc["platform"],
                send_state=self.prc["send_state"],
            )
            answer = self._exchange(self.rank_path, body, body)
            return self._ranked(answer, states[n], pools[n], k)

        return self.transport.map(one, list(range(len(states))))

    def _ranked(self, answer: Any, state: UserState, pool: list[str], k: int) -> Slate:
        from pydantic import ValidationError

        from ctrlsim.recommenders.http.prc.schema import RankingResponse

        where = f"{_shown(self.base)}{self.rank_path}"
        try:
            ranked = RankingResponse.model_validate(answer).ranked_ids
        except ValidationError as exc:
            first = exc.errors()[0]
            raise RecommenderResponseError(
                f"{where}: the response breaks the PRC schema at "
                f"'{'.'.join(str(p) for p in first['loc'])}': {first['msg']}"
            ) from None
        allowed, seen, kept, problems = set(pool), set(), [], []
        for pos, item in enumerate(ranked):
            if item not in allowed:
                problems.append(f"ranked_ids[{pos}]: {item!r} is not an item of the request")
            elif item in seen:
                problems.append(f"ranked_ids[{pos}]: duplicate item {item!r}")
            else:
                seen.add(item)
                kept.append(item)
        if problems and self.options["on_invalid"] == "error":
            raise RecommenderResponseError(
                f"{where}: {'; '.join(problems[:5])}"
                + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            )
        with self._lock:
            self.stats["skipped_items"] += len(problems)
        return self._slates(
            {"lists": [{"items": kept[:k], "scores": None}]},
            [state],
            k,
            self.rank_path,
            [pool],
            [set(state.shown)],
        )[0]


__all__ = ["PrcRecommender", "check_prc_spec", "is_prc", "split_prc_spec"]
