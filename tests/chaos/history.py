"""What an informer may have seen of an object, given every write to it — pure, no I/O.

The chaos tests record each write as kcp answered it (a :class:`Version`: resourceVersion and
labels) and read each informer's handler calls in the order ``vwclient`` printed them. A correct
informer behind a correct proxy sees, per object, exactly the events the writes call for
(:func:`expected_events`) — except across a **relist**: after a ``410 Expired`` (or a watch that
cannot be resumed) client-go lists again and hands over the state of that moment, so changes in
between may be folded into one, an unchanged object is handed over again (an update at the same
resourceVersion), and an object that vanished meanwhile is deleted as
``DeletedFinalStateUnknown``. That is Kubernetes' contract, and the only licence the check
grants:

* every handler call shows a state the object really had (resourceVersion *and* labels), in
  the slice for adds and updates;
* per object the resourceVersions never go back (no event out of order);
* an expected event may be missing, and a state repeated, only if the client started a relist
  between the two calls around it (``vwclient`` prints each request before the handler calls
  its answer causes, so the order of its output lines says which relist came first).

Everything else is a problem, reported with the object's key, the expected and the observed
sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Member = Callable[[Mapping[str, str]], bool]
"""Whether an object with these labels is in the slice."""


@dataclass(frozen=True, slots=True)
class Version:
    """One state of an object as a write left it (kcp's answer)."""

    rv: int
    labels: Mapping[str, str]
    gone: bool = False
    """The write removed the object (``rv``: its last version's; kcp picks the deletion's)."""


@dataclass(frozen=True, slots=True)
class Expected:
    kind: str  # add | update | delete
    rv: int | None
    """None: the removal, at a resourceVersion kcp picks."""


@dataclass(frozen=True, slots=True)
class Observed:
    kind: str  # add | update | delete
    rv: int
    labels: Mapping[str, str]
    unknown: bool
    """A ``DeletedFinalStateUnknown``: the informer learnt of the deletion from a relist."""
    epoch: int
    """How many relists the client had started when the handler was called."""


@dataclass(frozen=True, slots=True)
class ClientLog:
    """One informer's handler calls in one namespace, by key, and where its relists fell."""

    by_key: Mapping[str, Sequence[Observed]]
    synced_epoch: int
    """Relists started by the time the informer synced (its first list: 1)."""
    final_epoch: int
    relists: int
    """Relists after the first sync that the server answered with 200."""


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    events: int = 0
    skipped: int = 0
    """Expected events the informer never saw, each across a relist."""
    replays: int = 0
    """States handed over again by a relist."""

    def add(self, other: Verdict) -> None:
        self.problems += other.problems
        self.events += other.events
        self.skipped += other.skipped
        self.replays += other.replays


def expected_events(versions: Sequence[Version], member: Member) -> list[Expected]:
    """The handler calls a correct informer makes for one object when it sees every change:
    add on entering the slice, update while in it, delete (at the new resourceVersion) on
    leaving it and on removal; a write that changed nothing (same resourceVersion) calls
    nothing."""
    events: list[Expected] = []
    inside, last_rv = False, None
    for version in sorted(versions, key=lambda v: (v.rv, v.gone)):
        if version.gone:
            if inside:
                events.append(Expected("delete", None))
            break
        if version.rv == last_rv:
            continue
        now = member(version.labels)
        if now:
            events.append(Expected("update" if inside else "add", version.rv))
        elif inside:
            events.append(Expected("delete", version.rv))
        inside, last_rv = now, version.rv
    return events


def is_relist(request: Mapping[str, Any], *, resource: str) -> bool:
    """A LIST of ``resource``'s collection, or a watch-list (a watch with initial events)."""
    if not request["path"].endswith(f"/{resource}"):
        return False
    params = request["query"].split("&")
    return "watch=true" not in params or "sendInitialEvents=true" in params


def read_client(lines: Sequence[Mapping[str, Any]], *, namespace: str, resource: str) -> ClientLog:
    """The handler calls on ``namespace``'s objects in ``vwclient informer``'s output ``lines``,
    each with the number of relists started before it."""
    epoch = synced_epoch = relists = 0
    synced = False
    by_key: dict[str, list[Observed]] = {}
    for line in lines:
        event = line["event"]
        if event == "request":
            if is_relist(line, resource=resource):
                epoch += 1
                if synced and line.get("status") == 200:
                    relists += 1
        elif event == "synced":
            synced, synced_epoch = True, epoch
        elif event in ("add", "update", "delete") and line["namespace"] == namespace:
            by_key.setdefault(line["key"], []).append(
                Observed(
                    kind=event,
                    rv=int(line["resourceVersion"]),
                    labels=line["labels"],
                    unknown=bool(line.get("finalStateUnknown")),
                    epoch=epoch,
                )
            )
    return ClientLog(by_key=by_key, synced_epoch=synced_epoch, final_epoch=epoch, relists=relists)


def check_object(
    key: str,
    versions: Sequence[Version],
    observed: Sequence[Observed],
    *,
    member: Member,
    synced_epoch: int,
    final_epoch: int,
) -> Verdict:
    """Whether ``observed`` (one object's handler calls, in order) is what the writes
    (``versions``) allow (see the module docstring)."""
    expected = expected_events(versions, member)
    labels = {v.rv: v.labels for v in versions if not v.gone}
    verdict = Verdict(events=len(observed))

    def problem(what: str) -> None:
        verdict.problems.append(
            f"{key}: {what}\n  expected {[(e.kind, e.rv) for e in expected]}\n"
            f"  observed {[(o.kind, o.rv, o.epoch, 'unknown' if o.unknown else '') for o in observed]}"
        )

    pos, last_rv, last_epoch = 0, 0, synced_epoch
    for i, seen in enumerate(observed):
        relisted = seen.epoch > last_epoch
        if seen.rv < last_rv and not seen.unknown:
            problem(f"resourceVersion {seen.rv} after {last_rv}: out of order")
            return verdict
        if seen.kind != "delete":
            if seen.rv not in labels or not member(labels[seen.rv]):
                problem(f"{seen.kind} at {seen.rv}: not a state of the object in the slice")
                return verdict
            if dict(seen.labels) != dict(labels[seen.rv]):
                problem(f"{seen.kind} at {seen.rv}: labels {seen.labels} != {labels[seen.rv]}")
                return verdict
            if seen.kind == "update" and seen.rv == last_rv:
                if not relisted:
                    problem(f"update at {seen.rv} repeated without a relist")
                    return verdict
                verdict.replays += 1
                last_epoch = seen.epoch
                continue
        if seen.unknown:
            # The relist's list no longer had it: the last removal or departure before the
            # next call's match (or before the end) is the one the relist saw.
            if not relisted:
                problem("DeletedFinalStateUnknown without a relist")
                return verdict
            following = (
                _find(expected, observed[i + 1], pos, relisted=True)
                if i + 1 < len(observed)
                else None
            )
            end = len(expected) if following is None else following
            deletes = [j for j in range(pos, end) if expected[j].kind == "delete"]
            if not deletes:
                problem("deleted, but the object neither left the slice nor was removed")
                return verdict
            match: int | None = deletes[-1]
        else:
            match = _find(expected, seen, pos, relisted=relisted)
        if match is None:
            problem(f"{seen.kind} at {seen.rv}: fits no expected event (or out of order)")
            return verdict
        if match > pos:
            if not relisted:
                problem(f"{match - pos} event(s) before {seen.kind} at {seen.rv} lost")
                return verdict
            verdict.skipped += match - pos
        pos, last_epoch = match + 1, seen.epoch
        last_rv = max(last_rv, seen.rv)
    if pos < len(expected):
        if final_epoch <= last_epoch:
            problem(f"the last {len(expected) - pos} event(s) lost")
            return verdict
        verdict.skipped += len(expected) - pos
    return verdict


def _find(
    expected: Sequence[Expected], seen: Observed, start: int, *, relisted: bool
) -> int | None:
    """The first expected event at or after ``start`` that ``seen`` shows. After a relist an
    add and an update are the same (the informer tells them apart by its own store)."""
    for j in range(start, len(expected)):
        e = expected[j]
        if seen.kind == "delete":
            if e.kind == "delete" and (e.rv is None or e.rv == seen.rv):
                return j
        elif e.kind != "delete" and e.rv == seen.rv and (relisted or e.kind == seen.kind):
            return j
    return None
