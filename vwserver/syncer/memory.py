"""What one tenant can make the syncer hold in memory — bounded.

The syncer keeps every upstream object it sees in a cache, and its downstream copy in another.
A consumer decides how big its objects are: 40 objects of ~1.4 MiB (just under kcp's request
limit) took a syncer from 116 to 244 MB, ~3.2 MB an object — the decoded upstream object and
the decoded downstream copy, each holding its own copy of the same big strings. Two bounds and a
de-duplication, per synced resource:

* **per object** (``resources[].maxObjectBytes``, default 256 KiB of JSON as kcp sends it): a
  larger object is kept only as a *stub* — the metadata the sync decisions read (identity,
  finalizers and their ``managedFields`` claims, deletion) and its ``status.conditions`` (so the
  ``Synced=False`` condition is written as a change of one condition, not of the whole list) —
  and never copied downstream. The reflector asks (:class:`TenantBudget`) as each object is
  decoded, so a list holds at most one page of full objects (the syncer lists kcp in pages of
  :data:`UPSTREAM_PAGE` objects). It shows ``Synced=False``, reason ``ObjectTooLarge``, and is
  retried on the long backoff of permanent errors; its next change is looked at again.
* **per tenant** (``resources[].maxClusterBytes``, default 32 MiB): the objects of one logical
  cluster kept in full add up to at most this; past it, further objects of that cluster are
  stubs the same way (first come, first kept, in the order kcp lists and sends them). A stub is
  admitted in full at its next change (or relist) if the budget has room by then.
* **no duplicate copies**: a downstream copy's strings of 1 KiB or more that equal the upstream
  object's at the same place are replaced by the upstream object's string (one object in memory,
  not two) — the copy's ``spec`` is the consumer's ``spec``.

Sizes are measured by encoding the decoded object once when it arrives (the transient copy of
one object at a time is the cost). Pure, apart from the caches' own state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from vwserver.k8s import kcp
from vwserver.k8s.cache import Cache, CacheHandler
from vwserver.k8s.client import JSON
from vwserver.syncer.naming import ObjectKey

#: Objects per upstream LIST page: a page is decoded whole before its objects are admitted, so
#: this bounds the transient memory of a list (kcp pages by count, never by bytes).
UPSTREAM_PAGE = 20
#: Strings at least this long are shared between an upstream object and its downstream copy.
SHARE_AT = 1024
#: ``status.conditions`` of a stub are kept up to this size (JSON bytes), else dropped.
STUB_CONDITIONS = 16 * 1024

_encode = msgspec.json.encode
# metadata a stub keeps: what plan() and the finalizer claims read
_STUB_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "finalizers",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def object_size(obj: JSON) -> int:
    """The object's size as JSON (bytes)."""
    return len(_encode(obj))


def stub(obj: JSON) -> JSON:
    """What is kept of an object over a bound: identity, finalizers and their claims (the
    ``managedFields`` entries' finalizer members only), deletion, the logical cluster, and
    ``status.conditions`` if they are small."""
    meta = obj.get("metadata") or {}
    kept: JSON = {k: meta[k] for k in _STUB_METADATA if k in meta}
    cluster = kcp.logical_cluster(obj)
    if cluster:
        kept["annotations"] = {kcp.CLUSTER_ANNOTATION: cluster}
    claims = []
    for entry in meta.get("managedFields") or ():
        fields = entry.get("fieldsV1") if isinstance(entry, dict) else None
        owned = (
            (fields.get("f:metadata") or {}).get("f:finalizers")
            if isinstance(fields, dict)
            else None
        )
        if isinstance(owned, dict) and entry.get("manager"):
            claims.append(
                {
                    "manager": entry["manager"],
                    **({"subresource": entry["subresource"]} if entry.get("subresource") else {}),
                    "fieldsV1": {"f:metadata": {"f:finalizers": owned}},
                }
            )
    if claims:
        kept["managedFields"] = claims
    result: JSON = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}
    conditions = (obj.get("status") or {}).get("conditions")
    if isinstance(conditions, list) and len(_encode(conditions)) <= STUB_CONDITIONS:
        result["status"] = {"conditions": conditions}
    return result


class TenantBudget:
    """The upstream reflector's :class:`~vwserver.k8s.reflector.Admission` with the per-object
    and per-tenant bounds: an object over them is kept as :func:`stub` (decided as it is
    decoded, page by page) and listed in :attr:`too_large` with the reason."""

    def __init__(
        self,
        *,
        key: Callable[[JSON], ObjectKey | None],
        max_object_bytes: int,
        max_cluster_bytes: int,
    ) -> None:
        self._key = key
        self.max_object_bytes = max_object_bytes
        self.max_cluster_bytes = max_cluster_bytes
        #: Objects kept as stubs, and why (the ``Synced=False`` message).
        self.too_large: dict[ObjectKey, str] = {}
        #: Bytes of the objects kept in full, per logical cluster.
        self.cluster_bytes: dict[str, int] = {}
        self._sizes: dict[ObjectKey, int] = {}

    def begin_list(self) -> None:
        self.too_large.clear()
        self.cluster_bytes.clear()
        self._sizes.clear()

    def admit(self, kind: str, obj: JSON) -> JSON:
        key = self._key(obj)
        if key is None:
            return obj
        self._release(key)
        if kind == "DELETED":
            return obj
        size = object_size(obj)
        if size > self.max_object_bytes:
            self.too_large[key] = (
                f"the object is {size} bytes, more than this syncer's limit of "
                f"{self.max_object_bytes} bytes per object; it is not synced until it is smaller"
            )
            return stub(obj)
        used = self.cluster_bytes.get(key.cluster, 0)
        if used + size > self.max_cluster_bytes:
            self.too_large[key] = (
                f"this workspace's objects of this resource exceed this syncer's limit of "
                f"{self.max_cluster_bytes} bytes in total; this one ({size} bytes) is not synced "
                "until others are smaller or gone"
            )
            return stub(obj)
        self.cluster_bytes[key.cluster] = used + size
        self._sizes[key] = size
        return obj

    def _release(self, key: ObjectKey) -> None:
        self.too_large.pop(key, None)
        size = self._sizes.pop(key, 0)
        if size:
            left = self.cluster_bytes.get(key.cluster, 0) - size
            if left > 0:
                self.cluster_bytes[key.cluster] = left
            else:
                self.cluster_bytes.pop(key.cluster, None)


def share_strings(obj: Any, like: Any) -> Any:
    """``obj`` with every string of :data:`SHARE_AT` or more characters that equals the string
    at the same place in ``like`` replaced by ``like``'s (the same value, one object in memory).
    Dicts and lists are changed in place; the (possibly new) value is returned."""
    if isinstance(obj, str):
        return like if isinstance(like, str) and len(obj) >= SHARE_AT and obj == like else obj
    if isinstance(obj, dict) and isinstance(like, dict):
        for k, v in obj.items():
            if k in like and isinstance(v, str | dict | list):
                obj[k] = share_strings(v, like[k])
    elif isinstance(obj, list) and isinstance(like, list) and len(obj) == len(like):
        for i, (v, w) in enumerate(zip(obj, like, strict=True)):
            if isinstance(v, str | dict | list):
                obj[i] = share_strings(v, w)
    return obj


class SharingCache(Cache[tuple[str, str]]):
    """The downstream cache: each copy's big strings shared with its upstream object
    (:func:`share_strings`; ``upstream_of`` finds it, None if not cached)."""

    def __init__(
        self,
        *,
        key: Callable[[JSON], tuple[str, str] | None],
        handler: CacheHandler,
        upstream_of: Callable[[JSON], JSON | None],
    ) -> None:
        super().__init__(key=key, handler=handler)
        self._upstream_of = upstream_of

    def _shared(self, obj: JSON) -> JSON:
        source = self._upstream_of(obj)
        if source is not None:
            for field, value in obj.items():
                if field not in ("metadata", "status") and field in source:
                    obj[field] = share_strings(value, source[field])
        return obj

    def on_list(self, items: list[JSON], resource_version: str) -> None:
        super().on_list([self._shared(o) for o in items], resource_version)

    def on_event(self, kind: str, obj: JSON) -> None:
        super().on_event(kind, obj if kind == "DELETED" else self._shared(obj))
