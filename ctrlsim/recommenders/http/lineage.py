"""Which service account a user state uses, in the stateful mode of an HTTP black box.

An account on the service holds one logical state: an identity (the user id if any, the profile, the
attributes, and the box's `exclude_history`/`mask_shown`, fixed when the account is created), a
history, and what the account has been shown. The client keys each account by a digest of that whole
state, never by the user id alone: the ceiling's beam holds many states of one probe (one id), and
two users without an id may have the same history. A state *continues* an account only when sending
events turns the account's state into exactly this one:

- same identity (with contract version 2, the settings of the box's controls are part of it);
- the account's history is a prefix of the state's, and the items after it are new likes (not liked
  yet, none twice), which go to the service as "like" events;
- (contract version 2) each of the account's not-interested items, dislikes and blocked tags is a
  prefix of the state's; the rest go as "not_interested", "dislike" and "block" events;
- everything the account was shown (served by the service, or sent as "shown") is among the state's
  shown items; the state's other shown items go as "shown" events.

Anything else gets a fresh account, created with the state's history, profile and attributes, its
shown items sent as events. An account serves at most one state per request, and the state that
continues it takes it over (the state it held before no longer exists on the service). So two
different logical states never share an account, and every state is ranked as the stateless box
would rank it.

The index keeps the `MAX_TRACKED` most recently used accounts; a state whose account was dropped gets
a fresh one, which costs requests, never correctness.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from ctrlsim.recommenders.base import UserState

__all__ = ["MAX_TRACKED", "AccountIndex", "Assignment", "ServiceAccount", "identity_digest",
           "negative_fields", "negative_lists", "plain_attributes"]

MAX_TRACKED = 100_000


def plain_attributes(attributes: Mapping[str, object]) -> dict:
    """Attributes as JSON values (anything else as its string), as the contract sends them."""
    return {
        str(k): (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
        for k, v in dict(attributes).items()
    }


def identity_digest(user_id: str | None, profile: str | None, attributes: dict, exclude_history: bool,
                    mask_shown: bool, settings: dict | None = None) -> str:
    """What fixes an account besides its history, shown items and negative feedback, as one digest."""
    blob = json.dumps([user_id, profile, attributes, bool(exclude_history), bool(mask_shown), settings or {}],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def negative_lists(state: UserState) -> dict[str, tuple[str, ...]]:
    """A state's negative feedback by event type (the contract's names)."""
    return {"not_interested": state.not_interested, "dislike": state.disliked, "block": state.blocked_tags}


def negative_fields(state: UserState) -> dict:
    """The contract-2 fields of a state or account that has them (empty ones are left out, so a state
    without negative feedback or settings is sent exactly as version 1 sends it)."""
    fields = {"not_interested": list(state.not_interested), "disliked": list(state.disliked),
              "blocked_tags": list(state.blocked_tags), "settings": plain_attributes(state.settings)}
    return {name: value for name, value in fields.items() if value}


def _prefix_digests(history: Sequence[str], lengths: Iterable[int]) -> dict[int, str]:
    """Digests of `history[:n]` for each wanted n, in one pass (each id length-prefixed: ids may hold
    any character)."""
    wanted = {n for n in lengths if 0 <= n <= len(history)}
    digest = hashlib.blake2b(digest_size=16)
    out = {0: digest.hexdigest()} if 0 in wanted else {}
    for n, item in enumerate(history, 1):
        data = item.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(4, "big") + data)
        if n in wanted:
            out[n] = digest.copy().hexdigest()
    return out


@dataclass(eq=False)
class ServiceAccount:
    """One account on the service and the state the client knows it holds."""

    account: str
    identity: str
    history: list[str]
    profile: str | None
    attributes: dict
    served: list[str] = field(default_factory=list)  # what the service showed, in order
    shown_sent: set[str] = field(default_factory=set)  # items sent as "shown" events
    liked: set[str] = field(default_factory=set)
    negatives: dict[str, list[str]] = field(default_factory=dict)  # event type -> items (tags), in order
    settings: dict = field(default_factory=dict)

    def __post_init__(self):
        self.liked = set(self.history)

    def logical(self) -> dict:
        """The state as the client knows it, without the live account id (an exchange's key). Negative
        feedback and settings appear only when there are some: without them the key is version 1's."""
        logical = {"history": list(self.history), "profile": self.profile, "attributes": self.attributes,
                   "served": list(self.served), "shown": sorted(self.shown_sent)}
        logical.update({kind: list(done) for kind, done in self.negatives.items() if done})
        return {**logical, "settings": self.settings} if self.settings else logical

    def negative_steps(self, state: UserState) -> list[tuple[str, str]] | None:
        """The negative events (type, item or tag) that turn this account's negative feedback into
        the state's; None when the account's lists are not prefixes of the state's."""
        steps: list[tuple[str, str]] = []
        for kind, wanted in negative_lists(state).items():
            done = self.negatives.get(kind, [])
            if list(wanted[: len(done)]) != done:
                return None
            steps.extend((kind, target) for target in wanted[len(done):])
        return steps

    def covered(self) -> set[str]:
        """Everything the service counts as shown to this account."""
        return set(self.served) | self.shown_sent

    def extension(self, history: Sequence[str], shown: set[str]) -> list[str] | None:
        """The likes that turn this account's state into (history, shown); None if none can."""
        if len(history) < len(self.history) or list(history[: len(self.history)]) != self.history:
            return None
        new = list(history[len(self.history):])
        if len(set(new)) != len(new) or self.liked.intersection(new):
            return None  # the service would not append a like it already has
        if not self.covered() <= shown:
            return None
        return new


@dataclass
class Assignment:
    """The account a state uses, the `/accounts` entry creating it (None: it continues), and the
    events that bring it to the state (likes, then items shown elsewhere)."""

    account: ServiceAccount
    creation: dict | None
    events: list[dict]


class AccountIndex:
    """The client's accounts, keyed by (identity, digest of the history), least recently used first."""

    def __init__(self, capacity: int = MAX_TRACKED):
        self.capacity = capacity
        self._by_key: OrderedDict[tuple[str, str], list[ServiceAccount]] = OrderedDict()
        self._lengths: dict[str, Counter[int]] = {}
        self._keys: dict[int, tuple[str, str]] = {}  # id(account) -> its key
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def find(self, identity: str, state: UserState,
             taken: set[int]) -> tuple[ServiceAccount, list[str], list[tuple[str, str]]] | None:
        """An account this state continues (the longest history first), the likes and the negative
        events to send, or None. `taken`: ids of accounts that already serve a state."""
        lengths = self._lengths.get(identity)
        if not lengths:
            return None
        history, shown = state.history, set(state.shown)
        digests = _prefix_digests(history, lengths)
        for n in sorted(digests, reverse=True):
            for account in self._by_key.get((identity, digests[n]), ()):
                if id(account) in taken:
                    continue
                new = account.extension(history, shown)
                steps = account.negative_steps(state) if new is not None else None
                if new is not None and steps is not None:
                    return account, new, steps
        return None

    def assign(self, state: UserState, *, exclude_history: bool, mask_shown: bool, taken: set[int],
               new_id: Callable[[], str]) -> Assignment:
        """The account `state` continues, or a fresh one (`new_id()` names it): see the module docstring.
        The index records it at once (as continued or created); `taken` gets its id."""
        attributes = plain_attributes(state.attributes)
        settings = plain_attributes(state.settings)
        identity = identity_digest(state.user_id, state.profile, attributes, exclude_history, mask_shown,
                                   settings)
        found = self.find(identity, state, taken)
        creation = None
        if found is not None:  # the same user a few steps later: its likes and dismissals since go as events
            account, likes, steps = found
            self.extend(account, likes)
            events = [{"account": account.account, "item": item, "type": "like"} for item in likes]
            for kind, target in steps:
                account.negatives.setdefault(kind, []).append(target)
                events.append({"account": account.account, "tag" if kind == "block" else "item": target,
                               "type": kind})
            covered = account.covered()
            extra_shown = [i for i in state.shown if i not in covered]
        else:  # a new episode, another beam node, another user: a fresh account
            account = ServiceAccount(new_id(), identity, list(state.history), state.profile, attributes,
                                     negatives={k: list(v) for k, v in negative_lists(state).items()},
                                     settings=settings)
            self.add(account)
            creation = {"account": account.account, "history": list(state.history),
                        "profile": state.profile, "attributes": attributes,
                        "exclude_history": exclude_history, "mask_shown": mask_shown,
                        **negative_fields(state)}
            events, extra_shown = [], list(state.shown)
        for item in extra_shown:
            if item not in account.shown_sent:
                events.append({"account": account.account, "item": item, "type": "shown"})
                account.shown_sent.add(item)
        taken.add(id(account))
        return Assignment(account, creation, events)

    def add(self, account: ServiceAccount) -> None:
        n = len(account.history)
        key = (account.identity, _prefix_digests(account.history, [n])[n])
        self._by_key.setdefault(key, []).append(account)
        self._by_key.move_to_end(key)
        self._lengths.setdefault(account.identity, Counter())[len(account.history)] += 1
        self._keys[id(account)] = key
        self._size += 1
        while self._size > self.capacity:
            _, oldest = next(iter(self._by_key.items()))
            self.remove(oldest[0])

    def remove(self, account: ServiceAccount) -> None:
        key = self._keys.pop(id(account), None)
        if key is None:
            return
        bucket = self._by_key[key]
        bucket.remove(account)
        if not bucket:
            del self._by_key[key]
        lengths = self._lengths[account.identity]
        lengths[len(account.history)] -= 1
        if lengths[len(account.history)] <= 0:
            del lengths[len(account.history)]
        if not lengths:
            del self._lengths[account.identity]
        self._size -= 1

    def extend(self, account: ServiceAccount, likes: Sequence[str]) -> None:
        """The account's history grows by `likes` (sent as events): it moves to its new key."""
        self.remove(account)
        account.history.extend(likes)
        account.liked.update(likes)
        self.add(account)

    def __getstate__(self) -> dict:
        # `_keys` holds object ids, which do not survive pickling: rebuilt from the accounts.
        accounts = [a for bucket in self._by_key.values() for a in bucket]
        return {"capacity": self.capacity, "accounts": accounts}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["capacity"])  # type: ignore[misc]
        for account in state["accounts"]:
            self.add(account)
