"""Reproducible, independent random streams (ctrlsim.seeding)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ctrlsim.errors import ConfigError
from ctrlsim.seeding import derive_rng, derive_seed, rng_child, seed_sequence

ROOT = Path(__file__).resolve().parents[1]


def draws(rng: np.random.Generator, n: int = 8) -> list[int]:
    return rng.integers(0, 2**62, size=n).tolist()


def test_same_keys_same_stream():
    assert draws(derive_rng(7, "agent", 3)) == draws(derive_rng(7, "agent", 3))
    assert draws(derive_rng(7)) == draws(derive_rng(7))
    a, b = derive_rng(123, "generation", 2, "cluster", 0), derive_rng(123, "generation", 2, "cluster", 0)
    assert np.array_equal(a.random(100), b.random(100))


@pytest.mark.parametrize("keys_a, keys_b", [
    (("agent", 3), ("agent", 4)),
    (("agent", 3), ("probe", 3)),
    (("agent",), ("agent", 0)),
    (("agent", 3), (3, "agent")),     # order matters
    ((7,), ("7",)),                   # int and str keys are different keys
    ((), ("agent",)),
])
def test_different_keys_different_streams(keys_a, keys_b):
    assert draws(derive_rng(7, *keys_a)) != draws(derive_rng(7, *keys_b))
    assert derive_seed(7, *keys_a) != derive_seed(7, *keys_b)


def test_different_seeds_different_streams():
    assert draws(derive_rng(1, "agent", 0)) != draws(derive_rng(2, "agent", 0))
    assert derive_seed(1, "agent") != derive_seed(2, "agent")


def test_streams_do_not_depend_on_other_streams():
    before = draws(derive_rng(5, "agent", 1))
    for k in range(10):  # creating and consuming other streams changes nothing
        derive_rng(5, "agent", k).random(1000)
    assert draws(derive_rng(5, "agent", 1)) == before


def test_numpy_integer_seeds_and_keys():
    assert draws(derive_rng(np.int64(9), np.int32(2))) == draws(derive_rng(9, 2))
    assert derive_seed(np.uint32(9), "x") == derive_seed(9, "x")


def test_large_seeds_and_keys():
    big = 2**100
    assert draws(derive_rng(big, big)) == draws(derive_rng(big, big))
    assert draws(derive_rng(big)) != draws(derive_rng(big + 1))


@pytest.mark.parametrize("seed, keys", [(0, ()), (1, ("agent", 0)), (2**40, ("x", "y", 3)), (None, ("a",))])
def test_derive_seed_is_uint32(seed, keys):
    value = derive_seed(seed, *keys)
    assert type(value) is int
    assert 0 <= value < 2**32


def test_derive_seed_matches_seed_sequence():
    ss = seed_sequence(11, "llm", 4)
    assert derive_seed(11, "llm", 4) == int(ss.generate_state(1, dtype=np.uint32)[0])
    assert isinstance(ss, np.random.SeedSequence)
    assert ss.entropy == 11
    assert ss.spawn_key[1] == 4


def test_string_keys_hash_stably():
    ss = seed_sequence(3, "agent")
    expected = int.from_bytes(hashlib.sha256(b"agent").digest()[:8], "little")
    assert ss.spawn_key == (expected,)
    assert seed_sequence(3, "").spawn_key == (int.from_bytes(hashlib.sha256(b"").digest()[:8], "little"),)
    accented = int.from_bytes(hashlib.sha256("é".encode()).digest()[:8], "little")
    assert seed_sequence(3, "é").spawn_key == (accented,)


def test_string_keys_stable_across_processes():
    code = ("from ctrlsim.seeding import derive_seed, derive_rng;"
            "print(derive_seed(42, 'agent', 'probe-7'), derive_rng(42, 'cluster', 1).integers(0, 10**9))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "random"}
    outs = {subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True).stdout for _ in range(2)}
    assert len(outs) == 1
    here = f"{derive_seed(42, 'agent', 'probe-7')} {derive_rng(42, 'cluster', 1).integers(0, 10**9)}\n"
    assert outs == {here}


def test_none_seed_draws_fresh_entropy():
    assert draws(derive_rng(None, "agent")) != draws(derive_rng(None, "agent"))


@pytest.mark.parametrize("seed", [-1, np.int64(-5), 1.5, 3.0, "42", [1, 2], True, False])
def test_bad_seeds(seed):
    with pytest.raises(ConfigError) as exc:
        derive_rng(seed)
    assert "seed" in str(exc.value)
    with pytest.raises(ConfigError):
        derive_seed(seed, "agent")
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        seed_sequence(seed)


@pytest.mark.parametrize("key", [-1, np.int64(-2), 1.0, None, True, b"agent", ("a", 1)])
def test_bad_keys(key):
    with pytest.raises(ConfigError) as exc:
        derive_rng(0, "agent", key)
    assert "key" in str(exc.value)
    with pytest.raises(ConfigError):
        derive_seed(0, key)


def test_rng_child():
    parent_a, parent_b = derive_rng(3, "env"), derive_rng(3, "env")
    child_a, child_b = rng_child(parent_a, "agent", 1), rng_child(parent_b, "agent", 1)
    assert draws(child_a) == draws(child_b)
    # The parent advanced by one draw, identically on both sides.
    assert draws(parent_a) == draws(parent_b)
    # Successive children differ, as do children with other keys.
    p = derive_rng(3, "env")
    assert draws(rng_child(p, "agent", 1)) != draws(rng_child(p, "agent", 1))
    p1, p2 = derive_rng(3, "env"), derive_rng(3, "env")
    assert draws(rng_child(p1, "agent", 1)) != draws(rng_child(p2, "agent", 2))
    with pytest.raises(ConfigError):
        rng_child(derive_rng(3), -1)
