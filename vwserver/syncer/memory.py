"""What one tenant can make the syncer hold in memory — bounded.

The syncer keeps every upstream object it sees in a cache, and its downstream copy in another.
A consumer decides how big its objects are: 40 objects of ~1.4 MiB (just under kcp's request
limit) took a syncer from 116 to 244 MB, ~3.2 MB an object — the decoded upstream object and
the decoded downstream copy, each holding its own copy of the same big strings. Two bounds and a
de-duplication, per synced resource:

* **per object** (``resources[].maxObjectBytes``, default 256 KiB of JSON as kcp sends it): a
  larger object is kept only as a *stub* — the metadata the sync decisions read (identity,
  labels, finalizers and their ``managedFields`` claims, deletion) and its
  ``status.conditions`` (so the ``Synced=False`` condition is written as a change of one
  condition, not of the whole list) — and never copied downstream. The reflector asks
  (:class:`TenantBudget`) as each object is decoded, so a list holds at most one page of full
  objects (the syncer lists kcp in pages of :data:`UPSTREAM_PAGE` objects). It shows
  ``Synced=False``, reason ``ObjectTooLarge``, and is retried on the long backoff of permanent
  errors; its next change is looked at again.
* **per tenant** (``resources[].maxClusterBytes``, default 32 MiB): the objects of one logical
  cluster kept in full add up to at most this — one budget (:class:`TenantLedger`) for the
  resource's primaries on every endpoint *and* the sources of all its ``related[]`` entries
  (a consumer's Secrets count against the same budget as its databases); past it, further
  objects of that cluster are stubs the same way (first come, first kept, in the order kcp
  lists and sends them). A stub is admitted in full at its next change (or relist) if the
  budget has room by then. A primary whose related object is a stub shows ``Synced=False``,
  ``ObjectTooLarge``, naming that object.
* **no duplicate copies**: a downstream copy's strings of 1 KiB or more that equal the upstream
  object's at the same place are replaced by the upstream object's string (one object in memory,
  not two) — the copy's ``spec`` is the consumer's ``spec``. Related objects likewise: a
  copy and its source share their big strings (a Secret's ``data``), whichever is cached first
  (:mod:`~vwserver.syncer.related_io`); copies are not charged to the budget, since what they
  hold beyond their metadata is their source's.

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
#: ``metadata.labels`` of a stub are kept up to this size (JSON bytes), else dropped.
STUB_LABELS = 16 * 1024

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
    ``metadata.labels`` and ``status.conditions`` if they are small. The labels, because a
    related object found by a label selector must still be found when it is a stub — else it
    would be silently left out instead of reported ``ObjectTooLarge`` — and a syncer's copy
    must still be known as one (:func:`~vwserver.syncer.related_plan.is_syncer_copy`)."""
    meta = obj.get("metadata") or {}
    kept: JSON = {k: meta[k] for k in _STUB_METADATA if k in meta}
    labels = meta.get("labels")
    if isinstance(labels, dict) and labels and len(_encode(labels)) <= STUB_LABELS:
        kept["labels"] = labels
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


class TenantLedger:
    """The per-tenant bound of one synced resource: the bytes kept in full per *account* (a
    logical cluster), shared by every :class:`TenantBudget` of the resource — its primaries
    on every endpoint and the sources of every ``related[]`` entry, both directions. What one
    consumer workspace can make the syncer hold for a resource is ``max_cluster_bytes``, not
    that times the endpoints and related entries."""

    def __init__(self, max_cluster_bytes: int) -> None:
        self.max_cluster_bytes = max_cluster_bytes
        #: Bytes of the objects kept in full, per account.
        self.cluster_bytes: dict[str, int] = {}

    def charge(self, account: str, size: int) -> bool:
        """Take ``size`` bytes of ``account``'s budget; False (nothing taken) if it has not
        that much room left."""
        used = self.cluster_bytes.get(account, 0)
        if used + size > self.max_cluster_bytes:
            return False
        self.cluster_bytes[account] = used + size
        return True

    def release(self, account: str, size: int) -> None:
        left = self.cluster_bytes.get(account, 0) - size
        if left > 0:
            self.cluster_bytes[account] = left
        else:
            self.cluster_bytes.pop(account, None)


class TenantBudget:
    """A reflector's :class:`~vwserver.k8s.reflector.Admission` with the per-object bound and
    the per-tenant one (its :class:`TenantLedger`, shared with the resource's other
    reflectors): an object over them is kept as :func:`stub` (decided as it is decoded, page
    by page) and listed in :attr:`too_large` with the reason.

    ``account``: whose budget an object is charged to (default: its logical cluster)."""

    def __init__(
        self,
        *,
        key: Callable[[JSON], ObjectKey | None],
        max_object_bytes: int,
        max_cluster_bytes: int | None = None,
        ledger: TenantLedger | None = None,
        account: Callable[[ObjectKey], str] | None = None,
    ) -> None:
        if ledger is None:
            if max_cluster_bytes is None:
                raise TypeError("TenantBudget needs max_cluster_bytes or a ledger")
            ledger = TenantLedger(max_cluster_bytes)
        self._key = key
        self._account = account or (lambda k: k.cluster)
        self.max_object_bytes = max_object_bytes
        self.ledger = ledger
        #: Objects kept as stubs, and why (the ``Synced=False`` message).
        self.too_large: dict[ObjectKey, str] = {}
        # what each object kept in full was charged: (account, bytes)
        self._sizes: dict[ObjectKey, tuple[str, int]] = {}

    @property
    def max_cluster_bytes(self) -> int:
        return self.ledger.max_cluster_bytes

    @property
    def cluster_bytes(self) -> dict[str, int]:
        """Bytes kept in full per account — the ledger's: every budget sharing it counts."""
        return self.ledger.cluster_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of the objects this budget's reflector keeps in full."""
        return sum(size for _, size in self._sizes.values())

    def begin_list(self) -> None:
        # a relist replaces this reflector's objects: give back what they took, only theirs
        for account, size in self._sizes.values():
            self.ledger.release(account, size)
        self._sizes.clear()
        self.too_large.clear()

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
        account = self._account(key)
        if not self.ledger.charge(account, size):
            self.too_large[key] = (
                f"this workspace's objects of this resource and their related objects exceed "
                f"this syncer's limit of {self.ledger.max_cluster_bytes} bytes in total (this "
                f"object: {size} bytes); not synced until others are smaller or gone"
            )
            return stub(obj)
        self._sizes[key] = (account, size)
        return obj

    def _release(self, key: ObjectKey) -> None:
        self.too_large.pop(key, None)
        charged = self._sizes.pop(key, None)
        if charged is not None:
            self.ledger.release(*charged)


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
