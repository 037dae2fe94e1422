"""The handoff loop: the writes that holds need beyond a client's own (:mod:`vwserver.holds`).

Membership is computed from an object alone, so most of the handoff needs no writes. Three
things do, and this loop makes them from what the shared watch cache holds:

* **When the move was seen.** An object that a slice holds and no longer matches shows there
  as being deleted since the time vwserver first saw it leave. That time is written into the
  slice's entry of the holds annotation (``leavingSince``), so that every replica and every
  restart shows the same deletionTimestamp — with the labels the object had as the slice last
  saw it (``leavingLabels``: what the slice's clients' own label selectors match while it
  leaves). A recorded leave is never cleared: when the object matches the slice again before
  the slice released it, the slice still sees it being deleted until its finalizers are gone
  (then DELETED, and ADDED again as the object it now matches) — Kubernetes never takes a
  deletionTimestamp back, and controllers rely on that.
* **Hold timeouts.** Every hold of a leaving object is bounded: by the slice's
  ``holdTimeoutSeconds``, or by :data:`~vwserver.holds.DEFAULT_HOLD_TIMEOUT_SECONDS` (an hour)
  when it sets none; past it, the slice's finalizers are removed from the object and its entry
  with them. Holds of a slice this server does not know never time out here (another server
  may serve it).
* **The operator's escape hatch.** ``sync.edge-connect.eu/release: <slice cluster>/<slice
  name>`` (or ``*``) set directly on the object in kcp ends those holds the same way.

Each of these writes also sets the holder labels (:func:`vwserver.holds.holder_label`) to
the entries it leaves; an object whose labels do not match its entries (a label removed in kcp,
an entry written before the labels existed) gets a write that repairs them alone.

Ended holds are logged (the audit trail: object, slice, finalizers, why) and counted in
``vwserver_handoff_holds_ended_total{reason}``; holds that have been leaving for longer than
``stuck_after`` are counted per slice (:meth:`Handoff.stuck`) for the slice's ``HoldsReleased``
condition. Every write is one JSON patch that starts with
a ``test`` of the resourceVersion the decision was made on, so replicas racing each other, or a
client's write in between, cost a failed test and a new decision on the next scan — never a
lost finalizer. A write whose answer never came (a timeout, a dropped connection: kcp may have
made it) is read back, and counted and logged once the object shows it made
(:func:`carried_out`): the next scan finds nothing left to end, so counting only kcp's answers
missed such holds.

The loop scans the objects of the running shared resources every ``interval`` seconds (it does
not subscribe: a resource nobody reads still stops when idle; a move is then seen when the
first reader starts it again, and shown from then on).

**Several workers** (``vwserver serve --workers N``, :mod:`vwserver.workers`): each process has
its own cache, and worker 0 alone runs this loop — one writer per server, so that N processes
do not each spend a write (and a failed test) on every move. A loop can only scan what its own
cache runs, and a client's reads may all land on another worker; so every other worker runs a
:class:`HandoffRelay` instead, which tells worker 0 every ``interval`` which resources it runs
(worker 0 keeps them running as if read: :meth:`Handoff.keep`) and forwards at once the wake of
a read that found an unrecorded move. Replicas (other pods) still each run their own loop; their
writes race safely as described above.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from msgspec.structs import replace

from vwserver.cache.entries import Entry, Meta
from vwserver.cache.registry import CacheRegistry
from vwserver.cache.shared import SharedResource
from vwserver.clock import Clock, rfc3339
from vwserver.errors import ApiError, UpstreamUnavailable
from vwserver.holds import (
    HOLDS_ANNOTATION,
    RELEASE_ANNOTATION,
    Hold,
    annotation_pointer,
    effective_holds,
    holder_label_changes,
    implied_labels,
    label_pointer,
    parse_holds,
    render_holds,
)
from vwserver.k8s.client import KubeClient
from vwserver.metrics import ServerMetrics
from vwserver.routes import Routes
from vwserver.selector import Selector

log = logging.getLogger(__name__)

JSON_PATCH: Final = "application/json-patch+json"
RELEASE_ALL: Final = "*"
_MIN_GAP: Final = 0.05


@dataclass(frozen=True, slots=True)
class StuckHolds:
    """How many objects have been leaving a slice for too long, and since when the oldest."""

    count: int
    oldest: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What one object needs: its new finalizers and annotations (None: unchanged)."""

    finalizers: list[str] | None
    holds: str | None
    remove_release: bool
    ended: list[tuple[str, tuple[str, ...], str]]
    """(slice id, finalizers removed, reason) of each hold that ends."""
    recorded: list[str]
    """Slice ids whose ``leavingSince`` is recorded now."""
    labels: Mapping[str, str | None] = field(default_factory=dict)
    """The holder labels to set (None: remove) so that they name exactly the holders of the
    new annotation (:func:`vwserver.holds.holder_label_changes`): written with it, and also
    alone — a label missing from an entry written before the labels existed, or removed in kcp,
    is repaired."""


def decide(
    *,
    labels: dict[str, str],
    annotations: dict[str, str],
    finalizers: Iterable[str],
    selector_of: Callable[[str], Selector | None],
    timeout_of: Callable[[str], float | None],
    now: datetime,
    labels_before: Callable[[str, Selector], Mapping[str, str] | None] | None = None,
) -> Decision | None:
    """What the holds of one object need now (pure). Slices this server does not know are
    left alone: another server may serve them, and their holds stay until it or the operator
    ends them.

    A move is recorded with the time and with the labels the object had as the slice last saw
    it — ``labels_before(slice id, selector)``, from the cache's window of changes; when that
    no longer has them (vwserver was down, the window moved on), the labels implied by the
    slice's selector (:func:`vwserver.holds.implied_labels`)."""
    recorded = parse_holds(annotations.get(HOLDS_ANNOTATION))
    release = annotations.get(RELEASE_ANNOTATION)
    if not recorded and release is None:
        return None
    present = list(finalizers)
    holds: dict[str, Hold] = {}
    ended: list[tuple[str, tuple[str, ...], str]] = []
    started: list[str] = []
    for sid, hold in recorded.items():
        kept = tuple(f for f in hold.finalizers if f in present)
        if not kept:
            continue  # a stale entry: dropped with the next write
        if release is not None and release in (sid, RELEASE_ALL):
            ended.append((sid, kept, "released"))
            continue
        selector = selector_of(sid)
        if selector is not None:
            if hold.leavingSince:
                # A recorded leave completes (monotonic deletion): it is never cleared, even
                # when the object matches the slice again; the hold's end finishes it.
                timeout = timeout_of(sid)
                began = _parse_time(hold.leavingSince)
                # Compared as seconds elapsed: no datetime arithmetic to overflow.
                if timeout and began is not None and (now - began).total_seconds() >= timeout:
                    ended.append((sid, kept, "timeout"))
                    continue
            elif not selector.matches(labels):
                before = labels_before(sid, selector) if labels_before is not None else None
                holds[sid] = replace(
                    hold,
                    finalizers=kept,
                    leavingSince=rfc3339(now),
                    leavingLabels=dict(
                        before if before is not None else implied_labels(selector, labels)
                    ),
                )
                started.append(sid)
                continue
        holds[sid] = hold if kept == hold.finalizers else replace(hold, finalizers=kept)
    removed = {f for _, fs, _ in ended for f in fs}
    new_finalizers = [f for f in present if f not in removed] if removed else None
    value = render_holds(holds)
    holds_changed = value != render_holds(recorded)  # as written, whatever its spacing
    label_changes = holder_label_changes(labels, value)
    if not holds_changed and new_finalizers is None and release is None and not label_changes:
        return None
    return Decision(
        finalizers=new_finalizers,
        holds=value,
        remove_release=release is not None,
        ended=ended,
        recorded=started,
        labels=label_changes,
    )


def _parse_time(text: str) -> datetime | None:
    """An RFC 3339 time; None when it is none (then the hold never times out)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def patch_for(
    decision: Decision, *, resource_version: str, had_holds: bool, had_labels: bool = True
) -> list[Any]:
    """The conditional JSON patch that carries out ``decision`` (``had_labels``: the object
    has a labels map)."""
    ops: list[Any] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
    ]
    if decision.finalizers is not None:
        ops.append({"op": "replace", "path": "/metadata/finalizers", "value": decision.finalizers})
    if decision.holds is not None:
        ops.append(
            {"op": "add", "path": annotation_pointer(HOLDS_ANNOTATION), "value": decision.holds}
        )
    elif had_holds:
        ops.append({"op": "remove", "path": annotation_pointer(HOLDS_ANNOTATION)})
    if decision.remove_release:
        ops.append({"op": "remove", "path": annotation_pointer(RELEASE_ANNOTATION)})
    if not had_labels:
        added = {k: v for k, v in decision.labels.items() if v is not None}
        if added:
            ops.append({"op": "add", "path": "/metadata/labels", "value": added})
        return ops
    for key, value in decision.labels.items():
        if value is None:
            ops.append({"op": "remove", "path": label_pointer(key)})
        else:
            ops.append({"op": "add", "path": label_pointer(key), "value": value})
    return ops


class Handoff:
    """Scans the shared resources of ``registry`` and writes what holds need (module doc)."""

    def __init__(
        self,
        *,
        registry: CacheRegistry,
        routes: Routes,
        clock: Clock,
        interval: float = 2.0,
        stuck_after: float = 300.0,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self._registry = registry
        self._routes = routes
        self._clock = clock
        self._interval = interval
        self._metrics = metrics
        self._wake = asyncio.Event()
        self._stuck_after = timedelta(seconds=stuck_after)
        self._stuck: dict[str, StuckHolds] = {}
        self._counting: dict[str, StuckHolds] = {}
        self._failed: dict[tuple[str, str, str, str], int] = {}
        """Objects whose last write failed, by (resource, key): the resourceVersion it was
        decided on, so that an object is retried only once it changed."""
        self._unconfirmed: dict[tuple[str, str, str, str], tuple[Decision, Meta]] = {}
        """Objects whose last write got no answer and could not be read back: the decision
        and the version it was made on (the cache's next version tells)."""

    def wake(self) -> None:
        """Scan now: a read found an object leaving a slice whose move is not recorded yet (so
        the slice's clients see the deletion one write later, not one interval later)."""
        self._wake.set()

    async def run(self) -> None:
        """Scan until cancelled: every ``interval`` seconds, and at once when woken."""
        while True:
            self._wake.clear()
            self._counting = {}
            for resource in self._registry.resources():
                if resource.synced and not resource.stopped:
                    await self.scan(resource)
            self._stuck = self._counting
            await self._pause()

    async def _pause(self) -> None:
        # Reads can wake the loop as often as they come: at most one scan per _MIN_GAP of real
        # time, so a move that cannot be recorded (its write refused) costs no busy loop.
        await asyncio.sleep(_MIN_GAP)
        await _sleep_or_wake(self._clock, self._interval, self._wake)

    async def keep(self, resources: Iterable[tuple[str, str]]) -> int:
        """Run the shared resources ``(upstream, API path)`` that another worker of this server
        runs, as if read now (started if need be, idle from now), so that this loop scans them;
        only those of an upstream some route serves. How many were kept."""
        served = self._routes.table.upstreams()
        kept = 0
        for upstream, api_path in resources:
            if upstream.rstrip("/") not in served:
                continue
            resource = await self._registry.acquire(upstream=upstream, api_path=api_path)
            self._registry.release(resource)
            kept += 1
        return kept

    def stuck(self, sid: str) -> StuckHolds | None:
        """The holds of slice ``sid`` that have been leaving for longer than ``stuck_after``,
        as of the last full scan (None: none)."""
        return self._stuck.get(sid)

    def _count_stuck(self, meta: Meta, now: datetime) -> None:
        for sid, hold in effective_holds(meta.annotations, meta.finalizers).items():
            began = _parse_time(hold.leavingSince) if hold.leavingSince else None
            if began is None or self._routes.selector_of(sid) is None:
                continue
            if began + self._stuck_after <= now:
                seen = self._counting.get(sid)
                oldest = min(seen.oldest, hold.leavingSince) if seen else hold.leavingSince
                self._counting[sid] = StuckHolds(
                    count=(seen.count if seen else 0) + 1, oldest=oldest
                )

    async def scan(self, resource: SharedResource) -> None:
        """Carry out what every object of ``resource`` needs now."""
        now = self._clock.now()
        unconfirmed = {k for k in self._unconfirmed if k[0] == resource.url}
        for entry in resource.store.snapshot():
            meta = entry.meta
            if unconfirmed:
                seen = (resource.url, *entry_key(entry))
                unconfirmed.discard(seen)
                self._confirm(seen, meta, resource)
            annotations = meta.annotations
            if HOLDS_ANNOTATION not in annotations and RELEASE_ANNOTATION not in annotations:
                continue
            self._count_stuck(meta, now)
            decision = decide(
                labels=meta.labels,
                annotations=meta.annotations,
                finalizers=meta.finalizers,
                selector_of=self._routes.selector_of,
                timeout_of=self._timeout_of,
                now=now,
                labels_before=_labels_before(resource, entry),
            )
            if decision is None:
                continue
            key = (resource.url, *entry_key(entry))
            if self._failed.get(key) == meta.resource_version:
                continue
            await self._write(resource, entry, decision, key)
        for key in unconfirmed:  # gone from the cache (deleted): its outcome stays unknown
            self._unconfirmed.pop(key, None)

    def _confirm(
        self, key: tuple[str, str, str, str], meta: Meta, resource: SharedResource
    ) -> None:
        """An object whose last write got no answer and could not be read back either: once
        the cache shows a newer version, that version says whether the write was made."""
        waiting = self._unconfirmed.get(key)
        if waiting is None or meta.resource_version == waiting[1].resource_version:
            return
        del self._unconfirmed[key]
        decision, before = waiting
        if _made(
            decision,
            before=before,
            version=str(meta.resource_version),
            annotations=meta.annotations,
            labels=meta.labels,
            finalizers=meta.finalizers,
        ):
            self._done(resource, before, decision)

    def _timeout_of(self, sid: str) -> float | None:
        cluster, _, name = sid.partition("/")
        route = self._routes.table.lookup(cluster, name)
        return route.hold_timeout if route is not None else None

    async def _write(
        self,
        resource: SharedResource,
        entry: Entry,
        decision: Decision,
        key: tuple[str, str, str, str],
    ) -> None:
        meta = entry.meta
        ops = patch_for(
            decision,
            resource_version=str(meta.resource_version),
            had_holds=HOLDS_ANNOTATION in meta.annotations,
            had_labels=bool(meta.labels),  # "add" of the whole map also replaces an empty one
        )
        path = object_path(resource, cluster=meta.cluster, namespace=meta.namespace, name=meta.name)
        client = self._registry.client
        try:
            await client.request("PATCH", path, body=ops, content_type=JSON_PATCH)
        except ApiError as e:
            # kcp refused it, nothing was written: a failed test (the object changed since it
            # was scanned) answers 422; the next scan decides again on the new version.
            self._failed[key] = meta.resource_version
            log.info("handoff write to %s/%s not made: %s", meta.namespace, meta.name, e)
            if self._metrics is not None:
                self._metrics.handoff_writes.labels("failed").inc()
            return
        except UpstreamUnavailable as e:
            # No answer (a timeout, a connection lost): kcp may have carried the write out all
            # the same. Its outcome is read back, so that an ended hold is counted (and logged)
            # once it is — the next scan sees it ended and has nothing left to decide; when
            # the read fails too, the cache's next version of the object says.
            made = await self._read_back(client, path, decision, meta)
            if not made:
                self._failed[key] = meta.resource_version
                if made is None:
                    self._unconfirmed[key] = (decision, meta)
                elif self._metrics is not None:
                    self._metrics.handoff_writes.labels("failed").inc()
                log.info("handoff write to %s/%s not made: %s", meta.namespace, meta.name, e)
                return
            log.info(
                "handoff write to %s/%s got no answer (%s), but was made",
                meta.namespace,
                meta.name,
                e,
            )
        self._failed.pop(key, None)
        self._done(resource, meta, decision)

    def _done(self, resource: SharedResource, meta: Meta, decision: Decision) -> None:
        """Log (and count) what a write that was made did."""
        if self._metrics is not None:
            self._metrics.handoff_writes.labels("made").inc()
        for sid in decision.recorded:
            log.info(
                "object %s/%s (logical cluster %s) is leaving slice %s",
                meta.namespace,
                meta.name,
                meta.cluster,
                sid,
            )
        for sid, finalizers, reason in decision.ended:
            # The audit trail of an ended hold: what was removed from which object, and why.
            log.warning(
                "hold of slice %s on %s/%s (logical cluster %s, %s) ended by %s: removed "
                "finalizers %s",
                sid,
                meta.namespace,
                meta.name,
                meta.cluster,
                resource.api_path,
                "the release annotation" if reason == "released" else "its hold timeout",
                ", ".join(finalizers),
            )
            if self._metrics is not None:
                self._metrics.holds_ended.labels(reason).inc()

    async def _read_back(
        self, client: KubeClient, path: str, decision: Decision, meta: Meta
    ) -> bool | None:
        """Whether the object at ``path`` now shows ``decision`` carried out (its write's
        answer was lost); None when that cannot be read either."""
        try:
            now = await client.get(path)
        except (ApiError, UpstreamUnavailable) as e:
            log.info("handoff: %s/%s not read back: %s", meta.namespace, meta.name, e)
            return None
        return now is not None and carried_out(decision, before=meta, after=now)


def carried_out(decision: Decision, *, before: Meta, after: Mapping[str, Any]) -> bool:
    """Whether object ``after`` (read back from kcp) is ``before`` with ``decision`` carried
    out: a newer version in which every ended hold's entry and finalizers are gone, every
    recorded leave is recorded, the release annotation is gone when it was to go, and the
    holder labels are as decided (pure)."""
    metadata = after.get("metadata")
    if not isinstance(metadata, dict):
        return False
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    finalizers = metadata.get("finalizers") or ()
    if not isinstance(annotations, dict) or not isinstance(labels, dict):
        return False
    return _made(
        decision,
        before=before,
        version=str(metadata.get("resourceVersion") or ""),
        annotations=annotations,
        labels=labels,
        finalizers=[f for f in finalizers if isinstance(f, str)],
    )


def _made(
    decision: Decision,
    *,
    before: Meta,
    version: str,
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    finalizers: Iterable[str],
) -> bool:
    if version in ("", str(before.resource_version)):
        return False
    present = set(finalizers)
    holds = parse_holds(annotations.get(HOLDS_ANNOTATION))
    for sid, removed, _reason in decision.ended:
        if sid in holds or present.intersection(removed):
            return False
    if any(not (sid in holds and holds[sid].leavingSince) for sid in decision.recorded):
        return False
    if decision.remove_release and RELEASE_ANNOTATION in annotations:
        return False
    return all(labels.get(k) == v for k, v in decision.labels.items())


def _labels_before(
    resource: SharedResource, entry: Entry
) -> Callable[[str, Selector], Mapping[str, str] | None]:
    """The labels of the newest version of ``entry``'s object in the cache's window that a
    selector matched (None: the window no longer has one)."""

    def labels(_sid: str, selector: Selector) -> Mapping[str, str] | None:
        found = resource.store.last_version(
            entry.key, lambda version: selector.matches(version.meta.labels)
        )
        return found.meta.labels if found is not None else None

    return labels


def entry_key(entry: Entry) -> tuple[str, str, str]:
    meta = entry.meta
    return (meta.cluster, meta.namespace, meta.name)


def object_path(resource: SharedResource, *, cluster: str, namespace: str, name: str) -> str:
    """The URL of one object of ``resource`` in logical cluster ``cluster``."""
    prefix, _, plural = resource.api_path.rpartition("/")
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{resource.upstream}/clusters/{cluster}{prefix}{scope}/{plural}/{name}"


class HandoffRelay:
    """A worker's part in the handoff when worker 0 is the server's one handoff writer (module
    doc): every ``interval`` seconds, and at once when woken, ``send`` worker 0 the resources
    this worker's cache runs and whether a read found an unrecorded move. ``send`` returns
    False when worker 0 did not take the message (it is starting, or stopping): the next turn
    sends again."""

    def __init__(
        self,
        *,
        registry: CacheRegistry,
        send: Callable[[dict[str, Any]], Awaitable[bool]],
        clock: Clock,
        interval: float = 2.0,
    ) -> None:
        self._registry = registry
        self._send = send
        self._clock = clock
        self._interval = interval
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """A read found an object leaving a slice whose move is not recorded yet."""
        self._wake.set()

    def message(self) -> dict[str, Any]:
        woken = self._wake.is_set()
        self._wake.clear()
        running = sorted(
            {(r.upstream, r.api_path) for r in self._registry.resources() if not r.stopped}
        )
        return {"resources": [list(r) for r in running], "wake": woken}

    async def run(self) -> None:
        while True:
            await self._send(self.message())
            await asyncio.sleep(_MIN_GAP)
            await _sleep_or_wake(self._clock, self._interval, self._wake)


async def _sleep_or_wake(clock: Clock, interval: float, wake: asyncio.Event) -> None:
    """Until ``interval`` seconds of ``clock`` have passed or ``wake`` is set."""
    sleep = asyncio.ensure_future(clock.sleep(interval))
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait([sleep, woken], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in (sleep, woken):
            waiter.cancel()
        await asyncio.gather(sleep, woken, return_exceptions=True)


def relayed(message: object, *, limit: int = 10_000) -> tuple[list[tuple[str, str]], bool]:
    """A :class:`HandoffRelay` message as worker 0 reads it: (resources, wake); anything of
    another shape is dropped (ValueError)."""
    if not isinstance(message, dict):
        raise ValueError("not an object")
    resources = message.get("resources")
    wake = message.get("wake")
    if not isinstance(resources, list) or len(resources) > limit or not isinstance(wake, bool):
        raise ValueError(f"resources must be a list of at most {limit}, wake a boolean")
    out: list[tuple[str, str]] = []
    for item in resources:
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        ):
            raise ValueError("each resource is [upstream, API path]")
        out.append((item[0], item[1]))
    return out, wake
