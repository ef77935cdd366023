"""Independent, reproducible random generators derived from one seed.

Every random draw in ctrlsim comes from a `numpy.random.Generator` that is
derived from the seed handed to `reset(seed=...)` (or a runner's seed) plus a
path of keys such as ("agent", 7) or ("generation", 2, "cluster", 0). Using
`SeedSequence` spawn keys keeps the streams statistically independent and
stable: adding an agent never changes another agent's stream.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ctrlsim.errors import ConfigError

Key = int | str


def _key_to_int(key: Key) -> int:
    if isinstance(key, bool):
        raise ConfigError("seed keys must be int or str, not bool")
    if isinstance(key, (int, np.integer)):
        if key < 0:
            raise ConfigError(f"integer seed keys must be >= 0, got {key}")
        return int(key)
    if isinstance(key, str):
        # Stable across processes, unlike hash().
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    raise ConfigError(f"seed keys must be int or str, got {type(key).__name__}")


def seed_sequence(seed: int | None, *keys: Key) -> np.random.SeedSequence:
    """The SeedSequence for `seed` at the path `keys` (seed None draws fresh entropy)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ConfigError(f"seed must be a non-negative int or None, got {seed!r}")
    return np.random.SeedSequence(entropy=seed, spawn_key=tuple(_key_to_int(k) for k in keys))


def derive_rng(seed: int | None, *keys: Key) -> np.random.Generator:
    """An independent generator for the stream named by `keys` under `seed`."""
    return np.random.default_rng(seed_sequence(seed, *keys))


def derive_seed(seed: int | None, *keys: Key) -> int:
    """A 32-bit integer seed for libraries that want an int (sklearn, torch, LLM sampling)."""
    return int(seed_sequence(seed, *keys).generate_state(1, dtype=np.uint32)[0])


def rng_child(rng: np.random.Generator, *keys: Key) -> np.random.Generator:
    """Derive a child generator from an existing generator (e.g. an env's `np_random`).

    Draws one 64-bit value from `rng`, so call it in a fixed order.
    """
    base = int(rng.integers(0, 2**63 - 1))
    return derive_rng(base, *keys)
