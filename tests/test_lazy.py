"""`ctrlsim.lazy.lazy`: one load per object, retried after a failure, preset, discard, once under threads."""
import threading
import time

import pytest

from ctrlsim.lazy import lazy


class Box:
    """A loader that counts its calls and can be told to fail."""

    def __init__(self, failures: int = 0):
        self.calls = 0
        self.failures = failures

    @lazy
    def model(self):
        """The weights."""
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(f"load {self.calls} failed")
        return ("weights", self.calls)


def test_loads_on_first_read_only():
    box = Box()
    assert box.calls == 0 and not Box.model.is_loaded(box)
    first = box.model
    assert first == ("weights", 1) and Box.model.is_loaded(box)
    assert box.model is first and box.calls == 1  # later reads return the stored value


def test_each_object_loads_its_own():
    a, b = Box(), Box()
    assert a.model == ("weights", 1)
    assert not Box.model.is_loaded(b) and b.calls == 0
    assert b.model == ("weights", 1) and (a.calls, b.calls) == (1, 1)


def test_a_failed_load_stores_nothing_and_the_next_read_retries():
    box = Box(failures=2)
    for attempt in (1, 2):
        with pytest.raises(OSError, match=f"load {attempt} failed"):
            box.model  # noqa: B018
        assert not Box.model.is_loaded(box)
    assert box.model == ("weights", 3) and box.calls == 3


def test_assignment_presets_and_discard_forgets():
    box = Box()
    box.model = ("trained", 0)
    assert Box.model.is_loaded(box) and box.model == ("trained", 0) and box.calls == 0
    Box.model.discard(box)
    Box.model.discard(box)  # discarding what is not there is harmless
    assert not Box.model.is_loaded(box)
    assert box.model == ("weights", 1) and box.calls == 1


def test_concurrent_first_reads_load_once():
    class Slow:
        calls = 0

        @lazy
        def model(self):
            Slow.calls += 1
            time.sleep(0.05)  # wide window for the other threads to arrive mid-load
            return object()

    obj = Slow()
    start = threading.Barrier(8)
    seen = []

    def read():
        start.wait()
        seen.append(obj.model)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Slow.calls == 1 and len(seen) == 8 and all(v is seen[0] for v in seen)


def test_the_class_attribute_is_the_descriptor_with_the_loaders_doc():
    assert isinstance(Box.model, lazy) and Box.model.name == "model"
    assert Box.model.__doc__ == "The weights."
