"""The objects of one upstream resource and the window of their recent changes — pure, no I/O.

A watch may start at any resourceVersion a client last saw, and a paged LIST must return every
page as of the first page's resourceVersion although the objects keep changing meanwhile. The
apiserver's watch cache answers both from memory: the current objects plus a bounded window of
recent changes. :class:`Store` is that for one (upstream URL, resource):

* **Current state**: one :class:`~vwserver.cache.entries.Entry` per key, in one list sorted by
  key and maintained on every insert and delete (``bisect``): a page starts with a binary
  search instead of a sort, and a lookup is one too. No hash index beside it: it would cost
  about 30 bytes per object for lookups that happen once per upstream event.
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
import operator
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


_key: Final[Callable[[Entry], Key]] = operator.attrgetter(
    "meta.cluster", "meta.namespace", "meta.name"
)
"""What the entries are sorted by (for ``bisect``): their key, built in C (no Python frame per
comparison, unlike :attr:`~vwserver.cache.entries.Meta.key`)."""


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
        self._entries: list[Entry] = []
        """The current objects, sorted by key."""
        self._window: collections.deque[Change] = collections.deque()
        self._overlays: dict[int, _Overlay] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def window_size(self) -> int:
        """Changes held in the window now."""
        return len(self._window)

    def get(self, key: Key) -> Entry | None:
        entries = self._entries
        index = bisect.bisect_left(entries, key, key=_key)
        if index < len(entries) and _key(entries[index]) == key:
            return entries[index]
        return None

    def holds_cluster(self, cluster: str) -> bool:
        """Whether any current object is of logical cluster ``cluster`` (a binary search)."""
        entries = self._entries
        index = bisect.bisect_left(entries, (cluster, "", ""), key=_key)
        return index < len(entries) and _key(entries[index])[0] == cluster

    def entries_of(self, cluster: str, *, namespace: str | None = None) -> list[Entry]:
        """The current objects of one logical cluster (and ``namespace``, if given), by key:
        a binary search and the entries of that range."""
        entries = self._entries
        # ("", "") is the smallest rest of a key: the range starts there.
        start: Key = (cluster, namespace or "", "")
        index = bisect.bisect_left(entries, start, key=_key)
        out: list[Entry] = []
        width = 1 if namespace is None else 2
        while index < len(entries) and _key(entries[index])[:width] == start[:width]:
            out.append(entries[index])
            index += 1
        return out

    # --- writes: the reflector's list, events and bookmarks --------------------------------------

    def replace(self, entries: list[Entry], rv: int) -> None:
        """A (re)list: the collection is exactly ``entries`` at ``rv``; the window starts over
        (changes before a relist are unknown, so nothing older than ``rv`` can be served)."""
        # A stable sort keeps a key's entries in list order: the last of each run is kept.
        ordered = sorted(entries, key=_key)
        keys = list(map(_key, ordered))
        last = len(ordered) - 1
        current = [item for i, item in enumerate(ordered) if i == last or keys[i] != keys[i + 1]]
        self._entries = current
        self._window.clear()
        self._overlays.clear()
        self.raw_bytes = sum(len(item.raw) for item in current)
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
        entries = self._entries
        index = bisect.bisect_left(entries, key, key=_key)
        prev = entries[index] if index < len(entries) else None
        if prev is not None and _key(prev) != key:
            prev = None
        if prev is not None and rv <= prev.meta.resource_version:
            return None
        if type == "DELETED":
            self.rv = rv
            if prev is None:
                return None
            del entries[index]
            self.raw_bytes -= len(prev.raw)
            change = Change("DELETED", rv, prev, None, deleted=obj)
        elif type in ("ADDED", "MODIFIED"):
            self.rv = rv
            if prev is None:
                entries.insert(index, obj)
            else:
                entries[index] = obj
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

    def last_version(self, key: Key, accept: Callable[[Entry], bool]) -> Entry | None:
        """The newest version of ``key`` in the window that ``accept`` takes (None: the window
        has none) — e.g. the object as a slice last saw it before it left."""
        for change in reversed(self._window):
            if change.key != key:
                continue
            for version in (change.new, change.prev):
                if version is not None and accept(version):
                    return version
        return None

    def snapshot(self) -> list[Entry]:
        """The current objects, by key."""
        return list(self._entries)

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
        entries = self._entries
        start = 0 if after is None else bisect.bisect_right(entries, after, key=_key)
        items: list[Entry] = []
        if rv >= self.rv or not self._window or self._window[-1].rv <= rv:
            for index in range(start, len(entries)):
                item = entries[index]
                if accept(item):
                    if limit and len(items) == limit:
                        return items, items[-1].key
                    items.append(item)
            return items, None
        overlay = self._overlay(rv)
        values, changed = overlay.values, overlay.keys
        i, j = start, 0 if after is None else bisect.bisect_right(changed, after)
        ni, nj = len(entries), len(changed)
        # Merge the current entries with the keys changed since rv (some of which no longer
        # exist); a changed key takes its value at rv, which may be "absent".
        then: Entry | None
        while i < ni or j < nj:
            if j == nj or (i < ni and _key(entries[i]) < changed[j]):
                then = entries[i]
                i += 1
            else:
                key = changed[j]
                if i < ni and _key(entries[i]) == key:
                    i += 1
                j += 1
                then = values[key]
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
