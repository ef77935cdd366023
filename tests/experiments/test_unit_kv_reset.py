"""Every unit starts with the KV caches of the process's cached models emptied, so prefix reuse
never carries from one unit into the next (a unit's record is the same whichever process ran it)."""
from ctrlsim.experiments.units import _CACHE, run_unit, worker_cache


class KeepsKV:
    def __init__(self):
        self.held: list[str] = []
        self.resets = 0

    def reset_kv(self):
        self.resets += 1
        self.held.clear()


def test_each_unit_starts_from_an_empty_kv_cache():
    model = worker_cache("test-kv-model", KeepsKV)
    worker_cache("test-plain-object", lambda: object())  # objects without reset_kv are left alone

    def unit(config, key):
        seen = list(model.held)
        model.held.append(key)
        return {"seen_before": seen}

    try:
        records = [run_unit(unit, None, key) for key in ("a", "b", "c")]
    finally:
        for name in ("test-kv-model", "test-plain-object"):
            _CACHE._objects.pop(name, None)
    assert [r["seen_before"] for r in records] == [[], [], []]
    assert model.resets == 3
