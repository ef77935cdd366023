"""`lazy`: an attribute computed on first use, the one way ctrlsim defers a heavy load.

Backends and black boxes read weights (a GGUF file, a transformers checkpoint, a vLLM
engine, a RecBole model) only on the first call their caches cannot answer, so building
one, or rerunning from a full response cache, costs nothing::

    class Runtime:
        @lazy
        def model(self):
            return load_weights(self.path)

        @property
        def loaded(self) -> bool:
            return Runtime.model.is_loaded(self)

Semantics (what each backend relied on before there was one mechanism):

- the loader runs on the first read; later reads return the stored value;
- a loader that raises stores nothing, so the next read tries again (a model that was
  missing may have been downloaded meanwhile);
- concurrent first reads load once: a lock per attribute of a class guards the load
  (a class-level lock keeps instances picklable; two instances loading the same
  attribute at the same moment wait for each other, which costs nothing in practice);
- `obj.attr = value` stores a value without loading (a model just trained), and
  `Cls.attr.discard(obj)` forgets it (`close()` freeing weights), after which the next
  read loads again.

Unlike `functools.cached_property` the value cannot be shadowed by accident, the lock
exists on every Python version, and "is it loaded?" has one spelling.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Generic, TypeVar, overload

T = TypeVar("T")


class lazy(Generic[T]):  # lower case: a decorator, like property
    """Decorator: `@lazy def name(self) -> T` makes `obj.name` load once, on first read."""

    def __init__(self, load: Callable[[Any], T]) -> None:
        self.load = load
        self.name = load.__name__
        self.__doc__ = load.__doc__
        self._lock = threading.RLock()  # reentrant: a loader may read another lazy attribute

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> lazy[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> lazy[T] | T:
        if obj is None:
            return self
        store = obj.__dict__
        if self.name not in store:
            with self._lock:
                if self.name not in store:  # another thread may have loaded it while this one waited
                    store[self.name] = self.load(obj)
        return store[self.name]

    def __set__(self, obj: object, value: T) -> None:
        obj.__dict__[self.name] = value

    def is_loaded(self, obj: object) -> bool:
        """Whether `obj` holds a value (reading the attribute would not load)."""
        return self.name in obj.__dict__

    def discard(self, obj: object) -> None:
        """Forget `obj`'s value, if any; the next read loads again."""
        with self._lock:
            obj.__dict__.pop(self.name, None)

    def __repr__(self) -> str:
        return f"<lazy attribute {self.name!r}>"


__all__ = ["lazy"]
