"""The limits `ctrlsim serve` puts on what clients may make the service hold, and their flags.

A module of its own, outside `ctrlsim.recommenders`, so `ctrlsim --help` builds the `serve` flags
from these defaults without importing a recommender (and pandas). The guard that enforces them is
`ctrlsim.recommenders.http.guard`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ctrlsim.errors import ConfigError

MIB = 2**20


@dataclass(frozen=True)
class ServeLimits:
    """How much clients may make the service hold (docs/http-recommenders.md, "Safe to leave running").

    max_body: bytes of one request body; max_batch: states, accounts or events in one request (at
    most the contract's 10,000); max_list: entries of one list in a state or account (history, shown,
    candidates, attributes); max_accounts and max_account_items: accounts the stateful table keeps,
    and history and shown entries they hold in all (the least recently used accounts are evicted to
    make room; about 25 bytes an entry, so 10,000,000 entries are some 250 MB)."""

    max_body: int = 16 * MIB
    max_batch: int = 10_000
    max_list: int = 100_000
    max_accounts: int = 10_000
    max_account_items: int = 10_000_000

    def __post_init__(self):
        from ctrlsim.recommenders.http.contract import MAX_BATCH

        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"serve limit {f.name} ({FLAGS[f.name]}) must be a positive integer, "
                                  f"got {value!r}")
        if self.max_batch > MAX_BATCH:
            raise ConfigError(f"serve limit max_batch ({FLAGS['max_batch']}) must be at most the contract's "
                              f"{MAX_BATCH}, got {self.max_batch}")

    @classmethod
    def from_flags(cls, *, max_body_mb: int, max_batch: int, max_list: int, max_accounts: int,
                   max_account_items: int) -> "ServeLimits":
        """The limits as `ctrlsim serve`'s flags give them (the body in MiB)."""
        if isinstance(max_body_mb, bool) or not isinstance(max_body_mb, int) or max_body_mb < 1:
            raise ConfigError(f"{FLAGS['max_body']} must be a positive number of MiB, got {max_body_mb!r}")
        return cls(max_body=max_body_mb * MIB, max_batch=max_batch, max_list=max_list,
                   max_accounts=max_accounts, max_account_items=max_account_items)


# Where each limit is set from the command line: named in every 413, so the operator knows the knob.
FLAGS = {"max_body": "--max-body-mb", "max_batch": "--max-batch", "max_list": "--max-list",
         "max_accounts": "--max-accounts", "max_account_items": "--max-account-items"}


def default_limits() -> dict[str, int]:
    """The limits' defaults by field name, read without building a `ServeLimits` (whose check loads
    the HTTP contract)."""
    return {f.name: f.default for f in fields(ServeLimits)}  # type: ignore[misc]
