"""The account table of `ctrlsim serve`'s stateful mode: in memory, bounded, least recently used first out.

Without a bound the table only grows (every episode of every client creates accounts), so a service
left running fills the machine's memory. The table keeps at most `capacity` accounts holding at most
`max_items` history, shown and negative-feedback entries in all (an account's history may repeat
items, so a count of accounts alone bounds nothing): going past either evicts the accounts used least
recently (created, given feedback or ranked for). Item ids are stored as the catalogue's own strings,
not the request's copies (a third of the memory). A request naming an evicted account gets the same
404 as an unknown one, and says why; ctrlsim's own client then creates the account again from the
state it keeps (`ctrlsim.recommenders.http.lineage`). Clients that are done with accounts delete them
(`POST /accounts/delete`).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ctrlsim.recommenders.base import UserState
from ctrlsim.recommenders.http.contract import ENDPOINTS
from ctrlsim.recommenders.http.guard import FLAGS, Refused

__all__ = ["AccountState", "AccountTable"]


@dataclass
class AccountState:
    history: list[str]
    profile: str | None
    attributes: dict[str, Any]
    exclude_history: bool
    mask_shown: bool
    not_interested: list[str] = field(default_factory=list)  # contract 2: negative feedback, in order
    disliked: list[str] = field(default_factory=list)
    blocked_tags: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # fixed when the account is created
    liked: set[str] = field(default_factory=set)
    shown: list[str] = field(default_factory=list)  # in the order first shown
    shown_set: set[str] = field(default_factory=set)

    def __post_init__(self):
        self.liked = set(self.history)

    def like(self, item: str) -> None:
        if item not in self.liked:
            self.liked.add(item)
            self.history.append(item)

    def show(self, items: Sequence[str]) -> None:
        for item in items:
            if item not in self.shown_set:
                self.shown_set.add(item)
                self.shown.append(item)

    def record(self, kind: str, target: str) -> None:
        """One feedback event on `target` (an item; a tag for a block). A like of an item already liked,
        or a shown item already shown, changes nothing; a negative event is appended as it comes (the
        state's own lists keep repeats)."""
        if kind == "like":
            self.like(target)
        elif kind == "shown":
            self.show([target])
        else:
            {"not_interested": self.not_interested, "dislike": self.disliked,
             "block": self.blocked_tags}[kind].append(target)

    def size(self) -> int:
        return (len(self.history) + len(self.shown) + len(self.not_interested) + len(self.disliked)
                + len(self.blocked_tags))

    def user_state(self) -> UserState:
        return UserState(history=tuple(self.history), profile=self.profile,
                         attributes=dict(self.attributes), shown=tuple(self.shown),
                         not_interested=tuple(self.not_interested), disliked=tuple(self.disliked),
                         blocked_tags=tuple(self.blocked_tags), settings=dict(self.settings))


class AccountTable:
    """The stateful mode's accounts (one table per app), the lock that guards them, and the bound."""

    def __init__(self, capacity: int, max_items: int):
        self.lock = threading.Lock()
        self.capacity = capacity
        self.max_items = max_items
        self.items = 0  # history and shown entries of all accounts
        self.evicted = 0  # accounts dropped to make room, since the service started
        self._accounts: OrderedDict[str, AccountState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._accounts)

    def __contains__(self, account: str) -> bool:
        return account in self._accounts

    def get(self, account: str, where: str) -> AccountState:
        try:
            state = self._accounts[account]
        except KeyError:
            raise Refused(404, f"unknown account {account!r} in {where}: never created, deleted, or "
                               f"evicted (this service keeps its most recently used accounts, at most "
                               f"{self.capacity} holding {self.max_items} entries: {FLAGS['max_accounts']}, "
                               f"{FLAGS['max_account_items']}); create it with POST "
                               f"{ENDPOINTS['accounts']}") from None
        self._accounts.move_to_end(account)
        return state

    def check_room(self, creating: int, items: int) -> None:
        """413 when one request creates more accounts, or history entries, than the table holds (the
        request would evict its own first accounts)."""
        if creating > self.capacity:
            raise Refused(413, f"accounts holds {creating} accounts to create, more than this service keeps "
                               f"({self.capacity}, {FLAGS['max_accounts']})")
        if items > self.max_items:
            raise Refused(413, f"accounts holds {items} history entries in all, more than this service keeps "
                               f"({self.max_items}, {FLAGS['max_account_items']})")

    def reset(self, account: str, state: AccountState) -> None:
        old = self._accounts.pop(account, None)
        self.items += state.size() - (old.size() if old is not None else 0)
        self._accounts[account] = state
        self._evict()

    @contextmanager
    def changing(self, states: Sequence[AccountState]) -> Iterator[None]:
        """Around changes to `states` (likes, shown items): the count of entries follows them."""
        unique = list({id(s): s for s in states}.values())
        before = sum(s.size() for s in unique)
        try:
            yield
        finally:
            self.items += sum(s.size() for s in unique) - before
            self._evict()

    def _evict(self) -> None:
        # The most recent account stays even alone over the entry budget: the request using it goes on.
        while len(self._accounts) > self.capacity or (self.items > self.max_items
                                                      and len(self._accounts) > 1):
            _, state = self._accounts.popitem(last=False)
            self.items -= state.size()
            self.evicted += 1

    def delete(self, accounts: Sequence[str]) -> list[str]:
        """Drop `accounts`; those that were there (deleting an unknown account is not an error)."""
        deleted = []
        for account in dict.fromkeys(accounts):
            state = self._accounts.pop(account, None)
            if state is not None:
                self.items -= state.size()
                deleted.append(account)
        return deleted
