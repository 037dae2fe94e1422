"""The objects of one upstream resource and the window of their recent changes — pure, no I/O.

A watch may start at any resourceVersion a client last saw, and a paged LIST must return every
page as of the first page's resourceVersion although the objects keep changing meanwhile. The
apiserver's watch cache answers both from memory: the current objects plus a bounded window of
recent changes. :class:`Store` is that for one (upstream URL, resource):

* **Current state**: one :class:`~vwserver.cache.entries.Entry` per key, and the keys in a sorted
  list maintained on every insert and delete (``bisect``), so a page starts with a binary search
  instead of a sort.
* **Window**: the last ``window`` changes, each referencing the entries before and after it (the
  same objects the state holds: nothing is copied per change). ``oldest_rv`` is the bound below
  which changes are no longer complete: the list's resourceVersion after a (re)list, then the
  resourceVersion of the last change the window dropped.
* **The past**: the state at an older resourceVersion R is the current state with every change
  newer than R undone — an overlay of the keys those changes touched, each mapped to its value
  at R (the ``prev`` of the oldest change after R). Building it touches only the changes since
  R; a LIST paged at R reuses it from page to page and extends it by the changes that arrived
  in between.
* **410 Expired** (:class:`Expired`) for a resourceVersion older than ``oldest_rv``, with the
  apiserver's message (``too old resource version: R (oldest)``).

resourceVersions are integers: kcp's are etcd revisions of the shard, ordered across every
logical cluster of the virtual workspace, so they order the changes of a ``clusters/*`` stream.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable
from typing import Final

from vwserver.cache.entries import Change, ChangeType, Entry, Key

__all__ = ["Expired", "Store"]

_OVERLAYS_KEPT: Final = 16
"""Overlays remembered for paged LISTs at older resourceVersions (each holds one reference per
key changed since its resourceVersion)."""


class Expired(Exception):
    """The resourceVersion is older than the window: the apiserver's 410 ``Expired``."""

    def __init__(self, rv: int, oldest: int) -> None:
        # The watch cache's wording (watch_cache.go, getAllEventsSinceLocked).
        super().__init__(f"too old resource version: {rv} ({oldest})")
        self.rv = rv
        self.oldest = oldest


class _Overlay:
    """The keys changed after ``rv`` mapped to their entries at ``rv`` (None: absent then),
    complete up to the change at ``upto``."""

    __slots__ = ("keys", "upto", "values")

    def __init__(self) -> None:
        self.values: dict[Key, Entry | None] = {}
        self.keys: list[Key] = []
        self.upto = 0


def _accept_all(_: Entry) -> bool:
    return True


class Store:
    """One resource's objects at :attr:`rv` and its last ``window`` changes."""

    def __init__(self, *, window: int = 4096) -> None:
        if window < 1:
            raise ValueError("the window must hold at least one change")
        self.capacity = window
        self.rv = 0
        """The latest resourceVersion known: the list's, then every change's and bookmark's."""
        self.oldest_rv = 0
        """Every change with a resourceVersion above this is in the window."""
        self.synced = False
        """Set by the first :meth:`replace`."""
        self.raw_bytes = 0
        """The bytes of the current objects' JSON (what the store holds at the least)."""
        self._objects: dict[Key, Entry] = {}
        self._keys: list[Key] = []
        self._window: collections.deque[Change] = collections.deque()
        self._overlays: dict[int, _Overlay] = {}

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def window_size(self) -> int:
        """Changes held in the window now."""
        return len(self._window)

    def get(self, key: Key) -> Entry | None:
        return self._objects.get(key)

    # --- writes: the reflector's list, events and bookmarks --------------------------------------

    def replace(self, entries: list[Entry], rv: int) -> None:
        """A (re)list: the collection is exactly ``entries`` at ``rv``; the window starts over
        (changes before a relist are unknown, so nothing older than ``rv`` can be served)."""
        objects: dict[Key, Entry] = {}
        for item in entries:
            objects[item.key] = item
        self._objects = objects
        self._keys = sorted(objects)
        self._window.clear()
        self._overlays.clear()
        self.raw_bytes = sum(len(item.raw) for item in objects.values())
        self.rv = rv
        self.oldest_rv = rv
        self.synced = True

    def apply(self, type: ChangeType, obj: Entry) -> Change | None:
        """One upstream event: ADDED or MODIFIED store ``obj`` (either creates or replaces),
        DELETED removes the key (``obj`` is the object as the DELETED event carried it).

        Returns the change appended to the window, or None when nothing changed: an event at
        or below the resourceVersion already reflected (a replay), or a deletion of an object
        that is not stored. ``rv`` advances for every event that is not a replay.
        """
        rv = obj.meta.resource_version
        if rv <= self.rv:
            return None
        key = obj.key
        prev = self._objects.get(key)
        if prev is not None and rv <= prev.meta.resource_version:
            return None
        if type == "DELETED":
            self.rv = rv
            if prev is None:
                return None
            del self._objects[key]
            del self._keys[bisect.bisect_left(self._keys, key)]
            self.raw_bytes -= len(prev.raw)
            change = Change("DELETED", rv, prev, None, deleted=obj)
        elif type in ("ADDED", "MODIFIED"):
            self.rv = rv
            self._objects[key] = obj
            if prev is None:
                bisect.insort(self._keys, key)
            else:
                self.raw_bytes -= len(prev.raw)
            self.raw_bytes += len(obj.raw)
            change = Change("ADDED" if prev is None else "MODIFIED", rv, prev, obj)
        else:
            raise ValueError(f"not a change: {type!r}")
        self._window.append(change)
        if len(self._window) > self.capacity:
            self.oldest_rv = self._window.popleft().rv
        return change

    def bookmark(self, rv: int) -> None:
        """Nothing changed up to ``rv`` (an upstream BOOKMARK)."""
        if rv > self.rv:
            self.rv = rv

    # --- reads --------------------------------------------------------------------------------

    def _check(self, rv: int) -> None:
        if rv < self.oldest_rv:
            raise Expired(rv, self.oldest_rv)

    def changes_since(self, rv: int) -> list[Change]:
        """Every change after ``rv``, oldest first. Raises :class:`Expired` if ``rv`` is older
        than the window."""
        self._check(rv)
        newer: list[Change] = []
        for change in reversed(self._window):
            if change.rv <= rv:
                break
            newer.append(change)
        newer.reverse()
        return newer

    def snapshot(self) -> list[Entry]:
        """The current objects, by key."""
        objects = self._objects
        return [objects[key] for key in self._keys]

    def state_at(self, rv: int) -> list[Entry]:
        """The objects as they were at ``rv`` (the current ones for ``rv`` at or beyond
        :attr:`rv`), by key. Raises :class:`Expired` if ``rv`` is older than the window."""
        items, _ = self.page(rv, after=None, limit=0, accept=_accept_all)
        return items

    def page(
        self,
        rv: int,
        *,
        after: Key | None,
        limit: int,
        accept: Callable[[Entry], bool],
    ) -> tuple[list[Entry], Key | None]:
        """The entries of :meth:`state_at` ``(rv)`` with a key above ``after`` that ``accept``
        takes, at most ``limit`` of them (0: all); and the last one's key if more accepted
        entries follow (None otherwise): where the next page starts.

        Costs a binary search, the entries examined, and (for an ``rv`` in the past) the
        changes since ``rv``; never a sort of the whole collection.
        """
        self._check(rv)
        keys, objects = self._keys, self._objects
        start = 0 if after is None else bisect.bisect_right(keys, after)
        items: list[Entry] = []
        if rv >= self.rv or not self._window or self._window[-1].rv <= rv:
            for index in range(start, len(keys)):
                item = objects[keys[index]]
                if accept(item):
                    if limit and len(items) == limit:
                        return items, items[-1].key
                    items.append(item)
            return items, None
        overlay = self._overlay(rv)
        values, changed = overlay.values, overlay.keys
        i, j = start, 0 if after is None else bisect.bisect_right(changed, after)
        ni, nj = len(keys), len(changed)
        # Merge the current keys with the keys changed since rv (some of which no longer
        # exist); a changed key takes its value at rv, which may be "absent".
        while i < ni or j < nj:
            if j == nj or (i < ni and keys[i] < changed[j]):
                key = keys[i]
                i += 1
            else:
                key = changed[j]
                if i < ni and keys[i] == key:
                    i += 1
                j += 1
            then = values[key] if key in values else objects[key]
            if then is not None and accept(then):
                if limit and len(items) == limit:
                    return items, items[-1].key
                items.append(then)
        return items, None

    def _overlay(self, rv: int) -> _Overlay:
        """The undo overlay for ``rv``, brought up to date with the window."""
        overlay = self._overlays.get(rv)
        if overlay is None:
            for stale in [r for r in self._overlays if r < self.oldest_rv]:
                del self._overlays[stale]
            if len(self._overlays) >= _OVERLAYS_KEPT:
                del self._overlays[next(iter(self._overlays))]
            overlay = self._overlays[rv] = _Overlay()
            overlay.upto = rv
        newer: list[Change] = []
        for change in reversed(self._window):
            if change.rv <= overlay.upto:
                break
            newer.append(change)
        if newer:
            values = overlay.values
            added: list[Key] = []
            # Oldest first: a key's value at rv is the prev of the first change after rv.
            for change in reversed(newer):
                key = change.key
                if key not in values:
                    values[key] = change.prev
                    added.append(key)
            if len(added) > 8:
                overlay.keys = sorted(overlay.keys + added)
            else:
                for key in added:
                    bisect.insort(overlay.keys, key)
            overlay.upto = newer[0].rv
        return overlay
