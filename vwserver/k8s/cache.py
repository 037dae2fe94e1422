"""The objects of one collection, kept by a :class:`~vwserver.k8s.reflector.Reflector`, with a
handler told what changed — client-go's store and event handlers, reduced.

A :class:`Cache` is a :class:`~vwserver.k8s.reflector.ReflectorHandler`: the reflector feeds it,
it keeps the objects by ``key(obj)`` (objects whose key is None are not kept) and tells its
:class:`CacheHandler` about every object that was added, changed or went away. A relist is
diffed against what was kept, so objects that vanished meanwhile reach the handler as deletions
and changed ones as upserts, and unchanged ones (same resourceVersion) not at all.

Until the reflector is ``synced`` the cache is not evidence that an object is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from vwserver.k8s import reflector
from vwserver.k8s.client import JSON


class CacheHandler(Protocol):
    def on_upsert(self, obj: JSON) -> None:
        """An object was added or changed."""
        ...

    def on_delete(self, obj: JSON) -> None:
        """An object is gone from the collection; ``obj`` is its last known state."""
        ...


K = TypeVar("K", bound=Hashable)


class Cache(Generic[K]):
    def __init__(self, *, key: Callable[[JSON], K | None], handler: CacheHandler) -> None:
        self.objects: dict[K, JSON] = {}
        self._key = key
        self._handler = handler

    def get(self, key: K) -> JSON | None:
        return self.objects.get(key)

    def __len__(self) -> int:
        return len(self.objects)

    # --- ReflectorHandler -------------------------------------------------------------------

    def on_list(self, items: list[JSON], resource_version: str) -> None:
        fresh: dict[K, JSON] = {}
        for obj in items:
            key = self._key(obj)
            if key is not None:
                fresh[key] = obj
        old, self.objects = self.objects, fresh
        for key, obj in old.items():
            if key not in fresh:
                self._handler.on_delete(obj)
        for key, obj in fresh.items():
            previous = old.get(key)
            if previous is None or _changed(previous, obj):
                self._handler.on_upsert(obj)

    def on_event(self, kind: str, obj: JSON) -> None:
        key = self._key(obj)
        if key is None:
            return
        if kind == "DELETED":
            self.objects.pop(key, None)
            self._handler.on_delete(obj)
        else:
            self.objects[key] = obj
            self._handler.on_upsert(obj)

    def on_bookmark(self, resource_version: str) -> None:
        pass


def _changed(before: JSON, after: JSON) -> bool:
    return reflector.resource_version(before) != reflector.resource_version(after)
