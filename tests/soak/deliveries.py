"""Bookkeeping of the soak's watch clients — pure, no I/O: which client received which change,
when, and anything a watch must never do.

A thousand clients times a few changes a second is too much to report event by event, so the
clients' process keeps one record per change — a bit per client that received it, the first and
the last arrival — and reports a change once, when the last client has it (or at the end, when
some never did). What a single client does wrong is reported at once, per client:

* ``order``: a resourceVersion not newer than the last one that client saw of the same object
  (a duplicate, or an event out of order: a watch delivers each object's changes in order);
* ``foreign``: an object without the slice's label — something outside the slice arrived;
* ``error``: an ERROR event (the watch reports a failure instead of a change).

A change is identified by (event type, uid, resourceVersion): the same triple kcp's own
label-selector watch reports for it, which is what the test compares against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = ["ChangeKey", "Deliveries", "WatchEvent", "decode_event"]


class _Meta(msgspec.Struct):
    name: str = ""
    uid: str = ""
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class _Object(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    message: str = ""  # a Status (ERROR events)


class WatchEvent(msgspec.Struct):
    """One line of a watch response, the fields the soak looks at."""

    type: str
    object: _Object = msgspec.field(default_factory=_Object)


decode_event = msgspec.json.Decoder(WatchEvent).decode

ChangeKey = tuple[str, str, int]
"""(event type, uid, resourceVersion)."""


@dataclass(slots=True)
class _Record:
    name: str
    first: float
    last: float
    mask: int = 0
    clients: int = 0


@dataclass(slots=True)
class _Client:
    last_rv: dict[str, int] = field(default_factory=dict)  # uid -> newest resourceVersion seen
    events: int = 0
    bookmarks: int = 0
    resume_rv: str = ""  # the newest resourceVersion of any event or bookmark (to re-watch)


class Deliveries:
    """What ``clients`` watches received; ``label`` (key, value) is the slice's selector. Each
    method returns the report lines (JSON-able dicts) due now."""

    def __init__(self, *, clients: int, label: tuple[str, str]) -> None:
        self.clients = clients
        self.label = label
        self._per_client = [_Client() for _ in range(clients)]
        self._open: dict[ChangeKey, _Record] = {}
        self._done: set[ChangeKey] = set()
        self.ends = 0

    def resume_rv(self, client: int) -> str:
        """Where ``client`` re-watches from after its watch ended."""
        return self._per_client[client].resume_rv

    def received(self, client: int, event: WatchEvent, *, at: float) -> list[dict[str, Any]]:
        """``client`` received ``event`` at monotonic time ``at``."""
        state = self._per_client[client]
        meta = event.object.metadata
        if event.type == "BOOKMARK":
            state.bookmarks += 1
            state.resume_rv = meta.resource_version or state.resume_rv
            return []
        if event.type not in ("ADDED", "MODIFIED", "DELETED"):
            return [
                {"kind": "anomaly", "what": "error", "client": client, "type": event.type}
                | {"message": event.object.message[:300]}
            ]
        state.events += 1
        rv = int(meta.resource_version)
        state.resume_rv = meta.resource_version
        lines: list[dict[str, Any]] = []
        key, value = self.label
        if meta.labels.get(key) != value:
            lines.append(
                {"kind": "anomaly", "what": "foreign", "client": client, "type": event.type}
                | {"name": meta.name, "rv": rv, "labels": meta.labels}
            )
        previous = state.last_rv.get(meta.uid, 0)
        if rv <= previous:
            lines.append(
                {"kind": "anomaly", "what": "order", "client": client, "type": event.type}
                | {"name": meta.name, "rv": rv, "after": previous}
            )
            return lines
        state.last_rv[meta.uid] = rv
        change: ChangeKey = (event.type, meta.uid, rv)
        if change in self._done:  # cannot happen without an order anomaly above; kept exact
            return lines
        record = self._open.get(change)
        if record is None:
            record = self._open[change] = _Record(name=meta.name, first=at, last=at)
        bit = 1 << client
        if not record.mask & bit:
            record.mask |= bit
            record.clients += 1
            record.last = at
        if record.clients == self.clients:
            del self._open[change]
            self._done.add(change)
            lines.append(_delivery(change, record))
        return lines

    def ended(self, client: int, reason: str, *, at: float) -> list[dict[str, Any]]:
        """``client``'s watch ended (it re-watches from :meth:`resume_rv`)."""
        self.ends += 1
        return [{"kind": "ended", "client": client, "reason": reason, "at": at}]

    def final(self) -> list[dict[str, Any]]:
        """Every change not every client received, then a summary."""
        lines = [_delivery(change, record) for change, record in self._open.items()]
        clients = self._per_client
        lines.append(
            {
                "kind": "summary",
                "clients": self.clients,
                "events": sum(c.events for c in clients),
                "bookmarks_min": min((c.bookmarks for c in clients), default=0),
                "ends": self.ends,
            }
        )
        return lines


def _delivery(change: ChangeKey, record: _Record) -> dict[str, Any]:
    kind, uid, rv = change
    return {
        "kind": "delivery",
        "type": kind,
        "uid": uid,
        "rv": rv,
        "name": record.name,
        "clients": record.clients,
        "first": record.first,
        "last": record.last,
    }
