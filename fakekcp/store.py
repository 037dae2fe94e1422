"""The storage half of the fake APIExport virtual workspace: an in-memory etcd plus watch cache.

vwserver's tests need an upstream that behaves like kcp's APIExport virtual workspace down to the
details a filtering proxy can get wrong: one global, monotonically increasing resourceVersion
(one etcd per shard), consistent paginated snapshots, a bounded event history that expires old
resourceVersions with 410, label-selector watches that turn "stopped matching" into DELETED, the
CRD registry's create/update/delete strategy (status subresource, generation, finalizers). This
module holds that logic without any HTTP so it stays small enough to reason about; the HTTP layer
lives in :mod:`fakekcp.http` (public API: :mod:`fakekcp.upstream`).

Everything here is synchronous and runs on the event loop thread. Writes notify watchers by
appending to their queues; nothing awaits between reading the history and registering a watcher,
which is what makes "replay from resourceVersion N, then follow live" gap-free.

Objects are stored as dicts plus their encoded JSON bytes (encoded once, with sorted keys, which
is how the apiserver encodes unstructured custom resources), so LIST and WATCH responses are built
by joining cached bytes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import collections
import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from fakekcp.status import (
    OPTIMISTIC_LOCK_MESSAGE,
    RV_SET_ON_CREATE,
    FakeApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found_error,
    status_error,
)

__all__ = [
    "APIBINDINGS",
    "CLUSTER_ANNOTATION",
    "Event",
    "Page",
    "ResourceSpec",
    "SnapshotExpired",
    "Store",
    "StoredObject",
    "Watcher",
]

JSON = dict[str, Any]
# (cluster, namespace, name); namespace is "" for cluster-scoped resources.
Key = tuple[str, str, str]


def _order(key: Key) -> tuple[str, str, str]:
    """Where ``key`` sorts: as kcp's etcd keys ``.../<cluster>/<namespace>/<name>`` do, by their
    bytes (kcp v0.32.3 lists namespace ``ns-x`` before ``ns``: ``-`` sorts before ``/``) — each
    part ended by its ``/``, which no part contains, compares as the joined key."""
    return (key[0] + "/", key[1] + "/", key[2])


CLUSTER_ANNOTATION: Final = "kcp.io/cluster"
INITIAL_EVENTS_END_ANNOTATION: Final = "k8s.io/initial-events-end"

# Custom resources are unstructured maps; Go's encoding/json writes map keys sorted.
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
# Typed Go structs (Status, Table, discovery, PartialObjectMetadata) keep field order.
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def copy_json(value: JSON) -> JSON:
    """A deep copy of a JSON document (a msgspec round trip beats ``copy.deepcopy``)."""
    result: JSON = _decode(_encode(value))
    return result


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class PrinterColumn:
    """One of an APIResourceSchema's ``additionalPrinterColumns`` (a simple ``.a.b`` path)."""

    name: str
    type: str
    json_path: str
    description: str = ""
    format: str = ""
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """One resource the fake serves, as an APIResourceSchema would describe it."""

    group: str = "example.io"
    version: str = "v1alpha1"
    plural: str = "widgets"
    kind: str = "Widget"
    namespaced: bool = True
    status_subresource: bool = True
    # kcp serves apibindings in an APIExport VW with get/list/watch only.
    read_only: bool = False
    printer_columns: tuple[PrinterColumn, ...] = ()
    """A Table's columns after Name (kcp adds no Age column to a schema without any)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """``GroupResource.String()``, e.g. ``widgets.example.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular(self) -> str:
        return self.kind.lower()


APIBINDINGS: Final = ResourceSpec(
    group="apis.kcp.io",
    version="v1alpha2",
    plural="apibindings",
    kind="APIBinding",
    namespaced=False,
    status_subresource=False,
    read_only=True,
)


# --- stored objects, events, watchers ---------------------------------------------------------


class StoredObject:
    """One stored version of an object: the dict (never mutated), its bytes and labels."""

    __slots__ = ("_partial", "labels", "obj", "raw", "rv")

    def __init__(self, obj: JSON, rv: int) -> None:
        self.obj = obj
        self.rv = rv
        self.raw: bytes = _encode_sorted(obj)
        labels = obj.get("metadata", {}).get("labels")
        self.labels: dict[str, str] | None = labels if isinstance(labels, dict) else None
        self._partial: bytes | None = None

    def partial(self, api_version: str) -> bytes:
        """The object as ``meta.k8s.io PartialObjectMetadata`` (cached for v1)."""
        if api_version != "meta.k8s.io/v1":
            return partial_metadata(self.obj, api_version)
        if self._partial is None:
            self._partial = partial_metadata(self.obj, api_version)
        return self._partial


# ObjectMeta's JSON field order; PartialObjectMetadata is a Go struct, so it keeps this order.
_OBJECT_META_ORDER: Final = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


def partial_metadata(obj: JSON, api_version: str, *, original_api_version: bool = True) -> bytes:
    meta = dict(obj.get("metadata") or {})
    if original_api_version:
        # kcp adds the object's own apiVersion as an annotation of its PartialObjectMetadata
        # (not of a Table row's, which the apiserver's asTable builds).
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            "kcp.io/original-api-version": obj.get("apiVersion", ""),
        }
    ordered: JSON = {}
    for field in _OBJECT_META_ORDER:
        value = meta.get(field)
        if value is None or value == "" or value == [] or value == {}:
            if field == "creationTimestamp":
                ordered[field] = None  # metav1.Time's zero value encodes as null
            continue
        ordered[field] = dict(sorted(value.items())) if isinstance(value, dict) else value
    return _encode(
        {"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": ordered}
    )


class Event:
    """One committed change: the new state (None for a deletion) and the previous one."""

    __slots__ = ("_gone", "key", "new", "prev", "rv", "type")

    def __init__(
        self, type_: str, rv: int, key: Key, new: StoredObject | None, prev: StoredObject | None
    ) -> None:
        self.type = type_
        self.rv = rv
        self.key = key
        self.new = new
        self.prev = prev
        self._gone: bytes | None = None

    def gone_raw(self) -> bytes:
        """The previous content carrying this event's resourceVersion.

        That is what the watch cache sends for DELETED — for a real deletion and for an update
        that moves the object out of a watcher's selector alike (cacheWatcher.convertToWatchEvent:
        "return a delete event with the previous object content, but with the event's resource
        version").
        """
        if self._gone is None:
            assert self.prev is not None
            obj = copy_json(self.prev.obj)
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
            self._gone = _encode_sorted(obj)
        return self._gone

    def gone_obj(self) -> JSON:
        result: JSON = _decode(self.gone_raw())
        return result


class Watcher:
    """A registered watch: the store appends matching-scope events, the HTTP loop drains them."""

    __slots__ = ("closed", "cluster", "name", "namespace", "pending", "wakeup")

    def __init__(self, cluster: str | None, namespace: str | None, name: str | None) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.pending: list[Event] = []
        self.wakeup = asyncio.Event()
        self.closed = False

    def in_scope(self, key: Key) -> bool:
        return (
            (self.cluster is None or key[0] == self.cluster)
            and (self.namespace is None or key[1] == self.namespace)
            and (self.name is None or key[2] == self.name)
        )


class SnapshotExpired(Exception):
    """The history no longer reaches back to the requested resourceVersion."""

    def __init__(self, floor: int) -> None:
        super().__init__(floor)
        self.floor = floor


@dataclass(slots=True)
class Page:
    items: list[StoredObject]
    rv: int
    last_key: Key | None
    has_more: bool
    remaining: int | None


class _Resource:
    """Per-resource state: objects, their sorted keys, the event history and the watchers."""

    def __init__(self, spec: ResourceSpec, history_size: int, floor: int) -> None:
        self.spec = spec
        self.objects: dict[Key, StoredObject] = {}
        self.keys: list[Key] = []
        self.history: collections.deque[Event] = collections.deque(maxlen=history_size)
        # Every event with rv > floor is still in ``history`` (the watch cache's "oldest - 1").
        self.floor = floor
        self.watchers: set[Watcher] = set()


def _scope_bounds(keys: list[Key], cluster: str | None, namespace: str | None) -> tuple[int, int]:
    if cluster is None:
        return 0, len(keys)
    c = cluster + "/"
    if namespace is None:
        lo = bisect.bisect_left(keys, (c, "", ""), key=_order)
        return lo, bisect.bisect_left(keys, (c + "\0", "", ""), key=_order)
    n = namespace + "/"
    lo = bisect.bisect_left(keys, (c, n, ""), key=_order)
    return lo, bisect.bisect_left(keys, (c, n + "\0", ""), key=_order)


def _in_scope(key: Key, cluster: str | None, namespace: str | None) -> bool:
    return (cluster is None or key[0] == cluster) and (namespace is None or key[1] == namespace)


_GENERATE_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apiserver/pkg/storage/names
_NON_CONTENT: Final = frozenset({"metadata"})


def _content(obj: Mapping[str, Any]) -> JSON:
    """Everything but metadata: a change here bumps metadata.generation (CRD strategy)."""
    return {k: v for k, v in obj.items() if k not in _NON_CONTENT}


class Store:
    """An etcd-like keyspace for a few resources with one global resourceVersion."""

    def __init__(self, resources: Sequence[ResourceSpec], *, history_size: int) -> None:
        self.rv = 1  # an empty etcd is at revision 1
        self._resources: dict[tuple[str, str], _Resource] = {
            (spec.group, spec.plural): _Resource(spec, history_size, self.rv) for spec in resources
        }
        self._rv_waiters: list[tuple[int, asyncio.Future[None]]] = []

    # --- lookup -------------------------------------------------------------------------------

    @property
    def specs(self) -> list[ResourceSpec]:
        return [r.spec for r in self._resources.values()]

    def spec_for(self, group: str, version: str, plural: str) -> ResourceSpec | None:
        res = self._resources.get((group, plural))
        return res.spec if res is not None and res.spec.version == version else None

    def spec_by_plural(self, plural: str) -> ResourceSpec:
        found = [r.spec for r in self._resources.values() if r.spec.plural == plural]
        # (a core resource's qualified name is its plural: counted once)
        found += [
            r.spec
            for r in self._resources.values()
            if r.spec.qualified == plural and r.spec.qualified != r.spec.plural
        ]
        if len(found) != 1:
            raise ValueError(f"resource {plural!r} is unknown or ambiguous")
        return found[0]

    def spec_for_object(self, obj: Mapping[str, Any]) -> ResourceSpec:
        for res in self._resources.values():
            if res.spec.api_version == obj.get("apiVersion") and res.spec.kind == obj.get("kind"):
                return res.spec
        raise ValueError(f"no resource serves {obj.get('apiVersion')}/{obj.get('kind')}")

    def _res(self, spec: ResourceSpec) -> _Resource:
        return self._resources[(spec.group, spec.plural)]

    def get(self, spec: ResourceSpec, key: Key) -> StoredObject | None:
        return self._res(spec).objects.get(key)

    def objects(self, spec: ResourceSpec, cluster: str | None) -> Iterable[StoredObject]:
        res = self._res(spec)
        lo, hi = _scope_bounds(res.keys, cluster, None)
        return (res.objects[k] for k in res.keys[lo:hi])

    # --- commits: the only code that changes state ----------------------------------------------

    def _record(self, res: _Resource, event: Event) -> None:
        if res.history.maxlen is not None and len(res.history) == res.history.maxlen:
            res.floor = res.history[0].rv
        res.history.append(event)
        for watcher in res.watchers:
            if watcher.in_scope(event.key):
                watcher.pending.append(event)
                watcher.wakeup.set()
        if self._rv_waiters:
            for target, future in self._rv_waiters:
                if target <= self.rv and not future.done():
                    future.set_result(None)
            self._rv_waiters = [(t, f) for t, f in self._rv_waiters if not f.done()]

    async def wait_for_rv(self, rv: int, within: float) -> bool:
        """Wait until the store reaches *rv*; false on timeout (the watch cache's blockTimeout)."""
        if self.rv >= rv:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rv_waiters.append((rv, future))
        try:
            async with asyncio.timeout(within):
                await future
        except TimeoutError:
            return False
        finally:
            self._rv_waiters = [(t, f) for t, f in self._rv_waiters if f is not future]
        return True

    def _commit_put(self, spec: ResourceSpec, key: Key, obj: JSON) -> StoredObject:
        res = self._res(spec)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        stored = StoredObject(obj, self.rv)
        prev = res.objects.get(key)
        res.objects[key] = stored
        if prev is None:
            bisect.insort(res.keys, key, key=_order)
        self._record(
            res, Event("ADDED" if prev is None else "MODIFIED", self.rv, key, stored, prev)
        )
        return stored

    def commit_delete(self, spec: ResourceSpec, key: Key) -> Event:
        res = self._res(spec)
        prev = res.objects.pop(key)
        del res.keys[bisect.bisect_left(res.keys, _order(key), key=_order)]
        self.rv += 1
        event = Event("DELETED", self.rv, key, None, prev)
        self._record(res, event)
        return event

    def bulk_put(self, spec: ResourceSpec, items: Iterable[tuple[Key, JSON]]) -> int:
        """Store many new objects; each still gets its own resourceVersion and event."""
        res = self._res(spec)
        count = 0
        new_keys: list[Key] = []
        for key, obj in items:
            if key in res.objects:
                raise already_exists(spec.group, spec.plural, key[2])
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            stored = StoredObject(obj, self.rv)
            res.objects[key] = stored
            new_keys.append(key)
            self._record(res, Event("ADDED", self.rv, key, stored, None))
            count += 1
        res.keys = sorted(res.keys + new_keys, key=_order) if new_keys else res.keys
        return count

    # --- reads at a resourceVersion ----------------------------------------------------------

    def list_page(
        self,
        spec: ResourceSpec,
        *,
        cluster: str | None,
        namespace: str | None,
        match: Callable[[Key, StoredObject], bool],
        at_rv: int | None,
        after: Key | None,
        limit: int,
        count_remaining: bool,
    ) -> Page:
        """One page of a LIST, consistent as of *at_rv* (``None``: now).

        Like etcd, an older snapshot is served from the same data: the history is replayed
        backwards to recover each key's value as of *at_rv*. A page holds up to *limit* matching
        items; ``has_more`` is true when any key (matching or not) follows the last examined one,
        which is how both the cacher and the etcd3 store decide whether to hand out a continue
        token.
        """
        res = self._res(spec)
        rv = self.rv if at_rv is None else at_rv
        if rv < res.floor:
            raise SnapshotExpired(res.floor)
        lo, hi = _scope_bounds(res.keys, cluster, namespace)
        entry: Callable[[int], tuple[Key, StoredObject]]
        if res.history and res.history[-1].rv > rv:
            overlay: dict[Key, StoredObject | None] = {}
            for event in reversed(res.history):
                if event.rv <= rv:
                    break
                overlay[event.key] = event.prev  # the last one written is the oldest change
            keys = {k for k in res.keys[lo:hi] if k not in overlay}
            keys.update(
                k for k, v in overlay.items() if v is not None and _in_scope(k, cluster, namespace)
            )
            snapshot: list[tuple[Key, StoredObject]] = []
            for key in sorted(keys, key=_order):
                value = overlay[key] if key in overlay else res.objects[key]
                assert value is not None
                snapshot.append((key, value))
            entry = snapshot.__getitem__
            start = (
                0
                if after is None
                else bisect.bisect_right([_order(k) for k, _ in snapshot], _order(after))
            )
            end = len(snapshot)
        else:
            keys_now, objects_now = res.keys, res.objects

            def entry(i: int) -> tuple[Key, StoredObject]:
                return keys_now[i], objects_now[keys_now[i]]

            start = (
                lo
                if after is None
                else max(lo, bisect.bisect_right(res.keys, _order(after), key=_order))
            )
            end = hi
        items: list[StoredObject] = []
        last_key: Key | None = None
        has_more = False
        index = start
        while index < end:
            key, stored = entry(index)
            index += 1
            if match(key, stored):
                items.append(stored)
                last_key = key
                if limit and len(items) >= limit:
                    has_more = index < end
                    break
        remaining = end - index if has_more and count_remaining else None
        return Page(items, rv, last_key, has_more, remaining)

    def events_since(self, spec: ResourceSpec, rv: int) -> list[Event]:
        res = self._res(spec)
        if rv < res.floor:
            raise SnapshotExpired(res.floor)
        events: list[Event] = []
        for event in reversed(res.history):
            if event.rv <= rv:
                break
            events.append(event)
        events.reverse()
        return events

    def watch(self, spec: ResourceSpec, watcher: Watcher) -> None:
        self._res(spec).watchers.add(watcher)

    def unwatch(self, spec: ResourceSpec, watcher: Watcher) -> None:
        self._res(spec).watchers.discard(watcher)

    def close_watchers(self) -> None:
        for res in self._resources.values():
            for watcher in res.watchers:
                watcher.closed = True
                watcher.wakeup.set()

    # --- the CRD registry strategy: create / update / delete -------------------------------------

    def create(
        self,
        spec: ResourceSpec,
        cluster: str,
        namespace: str,
        body: JSON,
        *,
        dry_run: bool = False,
        strategy: bool = True,
    ) -> tuple[JSON, StoredObject | None]:
        """POST semantics (``strategy=False``: the Python API, which may preset status)."""
        obj = copy_json(body)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            suffix = "".join(random.choices(_GENERATE_ALPHABET, k=5))
            # names.SimpleNameGenerator: the base cut to 63 - 5 characters
            name = meta["name"] = f"{meta['generateName'][:58]}{suffix}"
        if not name:
            raise invalid(
                spec.group,
                spec.kind,
                "",
                [
                    (
                        "FieldValueRequired",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    )
                ],
            )
        namespace = _object_namespace(spec, meta, namespace)
        if meta.get("resourceVersion"):
            # etcd3 store Create: storage.ErrResourceVersionSetOnCreate, surfaced as a 500.
            raise status_error(
                500,
                "InternalError",
                f"Internal error occurred: {RV_SET_ON_CREATE}",
                details={"causes": [{"message": RV_SET_ON_CREATE}]},
            )
        key: Key = (cluster, namespace, name)
        if self.get(spec, key) is not None:
            raise already_exists(spec.group, spec.plural, name)
        if strategy and spec.status_subresource:
            obj.pop(
                "status", None
            )  # customResourceStrategy.PrepareForCreate: create cannot set status
        for server_field in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(server_field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        if dry_run:
            # kcp writes kcp.io/cluster when it stores the object: a dry-run create's answer
            # has none (kcp v0.32.3).
            return obj, None
        meta.setdefault("annotations", {})[CLUSTER_ANNOTATION] = cluster
        stored = self._commit_put(spec, key, obj)
        return stored.obj, stored

    def update(
        self,
        spec: ResourceSpec,
        key: Key,
        body: JSON,
        *,
        status: bool = False,
        dry_run: bool = False,
        strategy: bool = True,
        require_rv: bool = True,
    ) -> tuple[JSON, StoredObject | None]:
        """PUT semantics for the main resource (or ``status=True``: the status subresource)."""
        cluster, namespace, name = key
        existing = self.get(spec, key)
        if existing is None:
            raise not_found_error(
                spec.group, spec.plural, name
            )  # CRDs: AllowCreateOnUpdate is false
        obj = copy_json(body)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        _object_namespace(spec, meta, namespace)
        requested = meta.get("resourceVersion") or ""
        if not requested and require_rv:
            # AllowUnconditionalUpdate is false for custom resources.
            raise invalid(
                spec.group,
                spec.plural,
                name,
                [
                    (
                        "FieldValueInvalid",
                        "metadata.resourceVersion",
                        "Invalid value: 0: must be specified for an update",
                    )
                ],
            )
        if requested and requested != existing.obj["metadata"]["resourceVersion"]:
            raise conflict(spec.group, spec.plural, name, OPTIMISTIC_LOCK_MESSAGE)
        old = existing.obj
        if status:
            # statusStrategy.PrepareForUpdate: only status changes, the rest is the old object.
            new = copy_json(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = obj
            if strategy and spec.status_subresource:
                # customResourceStrategy.PrepareForUpdate: the main resource cannot change status.
                if "status" in old:
                    new["status"] = copy_json({"s": old["status"]})["s"]
                else:
                    new.pop("status", None)
            new_meta = new["metadata"]
            old_meta = old["metadata"]
            new_meta["name"] = name
            for server_field in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if server_field in old_meta:
                    new_meta[server_field] = old_meta[server_field]
                else:
                    new_meta.pop(server_field, None)
            new_meta["generation"] = old_meta.get("generation", 1)
            if _content(new) != _content(old):
                new_meta["generation"] = old_meta.get("generation", 1) + 1
            new_meta.setdefault("annotations", {})[CLUSTER_ANNOTATION] = cluster
            if "deletionTimestamp" in old_meta:
                added = sorted(
                    set(new_meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
                )
                if added:
                    raise invalid(
                        spec.group,
                        spec.kind,
                        name,
                        [
                            (
                                "FieldValueForbidden",
                                "metadata.finalizers",
                                "Forbidden: no new finalizers can be added if the object is being "
                                f"deleted, found new finalizers {_go_string_slice(added)}",
                            )
                        ],
                    )
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return old, existing  # a no-op update writes nothing and keeps the resourceVersion
        if "deletionTimestamp" in new["metadata"] and not new["metadata"].get("finalizers"):
            # Store.Update: emptying the finalizers of an object being deleted deletes it, and the
            # PUT answers with the object it was sent.
            if not dry_run:
                self.commit_delete(spec, key)
            return new, None
        if dry_run:
            return new, None
        stored = self._commit_put(spec, key, new)
        return stored.obj, stored

    def delete(
        self,
        spec: ResourceSpec,
        key: Key,
        *,
        precondition_uid: str | None = None,
        precondition_rv: str | None = None,
        dry_run: bool = False,
    ) -> tuple[JSON, bool]:
        """DELETE semantics: returns (object, deleted). Finalizers only mark the object."""
        name = key[2]
        existing = self.get(spec, key)
        if existing is None:
            raise not_found_error(spec.group, spec.plural, name)
        meta = existing.obj["metadata"]
        # rest.BeforeDelete checks preconditions early; note it names the Kind, not the resource.
        if precondition_uid is not None and precondition_uid != meta.get("uid"):
            raise conflict(
                spec.group,
                spec.kind,
                name,
                f"the UID in the precondition ({precondition_uid}) does not match the UID in "
                f"record ({meta.get('uid')}). "
                "The object might have been deleted and then recreated",
            )
        if precondition_rv is not None and precondition_rv != meta.get("resourceVersion"):
            raise conflict(
                spec.group,
                spec.kind,
                name,
                f"the ResourceVersion in the precondition ({precondition_rv}) does not match the "
                f"ResourceVersion in record ({meta.get('resourceVersion')}). The object might have "
                "been modified",
            )
        if meta.get("finalizers"):
            if "deletionTimestamp" in meta:
                return existing.obj, False
            marked = copy_json(existing.obj)
            marked_meta = marked["metadata"]
            # registry.markAsDeleting: bump generation, set deletionTimestamp, grace period 0.
            if marked_meta.get("generation", 0) > 0:
                marked_meta["generation"] += 1
            marked_meta["deletionTimestamp"] = now_rfc3339()
            marked_meta["deletionGracePeriodSeconds"] = 0
            if dry_run:
                return marked, False
            return self._commit_put(spec, key, marked).obj, False
        if not dry_run:
            self.commit_delete(spec, key)
        return existing.obj, True


def _object_namespace(spec: ResourceSpec, meta: JSON, request_namespace: str) -> str:
    """rest.EnsureObjectNamespaceMatchesRequestNamespace."""
    if not spec.namespaced:
        meta.pop("namespace", None)
        return ""
    given = meta.get("namespace") or ""
    if given and given != request_namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    meta["namespace"] = request_namespace
    return request_namespace


def _go_string_slice(values: Sequence[str]) -> str:
    return "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"


# --- continue tokens ---------------------------------------------------------------------------


def encode_continue(key: Key, rv: int) -> str:
    """storage.EncodeContinue: base64url(JSON{v, rv, start}) with start just after *key*."""
    start = "/".join(part for part in key if part) + "\0"
    raw = _encode({"v": "meta.k8s.io/v1", "rv": rv, "start": start})
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_continue(token: str, spec: ResourceSpec) -> tuple[Key, int]:
    """storage.DecodeContinue; raises the apiserver's 400 for anything unusable."""

    def invalid_token(why: str) -> FakeApiError:
        return bad_request(f"invalid continue token: continue key is not valid{why}")

    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = _decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError) as e:
        raise invalid_token(f": {e}") from None
    if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
        raise invalid_token(": server does not recognize this encoded version")
    rv = data.get("rv")
    start = data.get("start")
    if not isinstance(rv, int) or rv == 0:
        raise invalid_token(": incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start:
        raise invalid_token(": encoded start key empty (version meta.k8s.io/v1)")
    parts = start.rstrip("\0").split("/")
    if spec.namespaced and len(parts) == 3:
        return (parts[0], parts[1], parts[2]), rv
    if not spec.namespaced and len(parts) == 2:
        return (parts[0], "", parts[1]), rv
    raise invalid_token(f": {start!r}")
