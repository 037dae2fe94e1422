"""Deleting an owner through a slice must not make kcp delete objects outside the slice.

Kubernetes' garbage collector deletes the *dependents* of a deleted object — objects whose
``metadata.ownerReferences`` name its uid — unless the deletion orphans them (propagation
``Orphan``: the collector removes the ownerReferences instead). kcp runs one collector per
logical cluster with its own identity, so a DELETE through a slice reaches every dependent in the
workspace, also those of other slices or of no slice at all.

The rule: a DELETE through a slice whose effective propagation is not ``Orphan`` is refused
(409) when the shared watch cache shows, in the object's logical cluster (and namespace, for a
namespaced owner: the collector ignores references across namespaces), a dependent among the
export's resources that the slice does not see (or that is leaving it). The refusal names no
dependent: it says only that the slice's own object has some the slice cannot see, which the
object's uid already ties to the slice (no existence oracle for objects outside it).

Upstream cost: no kcp request per DELETE. The deleted resource's shared cache is acquired (kcp's
one list and watch of it, shared with every reader and stopped when idle); the export's other
resources are checked while the cache holds them (someone reads them, or the handoff needs them).
Where the cache is not used (``cache.enabled: false``, a slice with ``cache: false``,
``auth.mode: passthrough``) nothing is checked. Dependents of other APIs (a consumer's ConfigMap
owned by a widget) are the consumer's choice: they are collected as in Kubernetes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Final

import msgspec

from vwserver.cache.entries import Entry, Meta
from vwserver.cache.shared import SharedResource
from vwserver.cache.views import leaving, visible
from vwserver.errors import Conflict, UpstreamUnavailable
from vwserver.holds import FOREGROUND_FINALIZER, ORPHAN_FINALIZER
from vwserver.proxy.cached import api_path
from vwserver.proxy.context import ProxyRequest

# How long a DELETE waits for the first list of the deleted resource's cache.
SYNC_WAIT: Final = 10.0


class _Reference(msgspec.Struct):
    uid: str = ""


class _OwnersMeta(msgspec.Struct):
    ownerReferences: list[_Reference] | None = None


class _Owned(msgspec.Struct):
    metadata: _OwnersMeta = msgspec.field(default_factory=_OwnersMeta)


_decode_owned: Final = msgspec.json.Decoder(_Owned).decode


def orphans(options: Mapping[str, Any], *, finalizers: Iterable[str] | None) -> bool:
    """Whether a DELETE with ``options`` orphans the object's dependents, as the apiserver's
    ``shouldOrphanDependents`` (registry/generic/registry/store.go) decides: ``orphanDependents``,
    else ``propagationPolicy``, else the first of the finalizers of a deletion in progress, else
    the resource's default — for custom resources, to delete them (``Background``)."""
    orphan = options.get("orphanDependents")
    if orphan is not None:
        return bool(orphan)
    policy = options.get("propagationPolicy")
    if policy is not None:
        return bool(policy == "Orphan")
    for finalizer in finalizers or ():
        if finalizer == ORPHAN_FINALIZER:
            return True
        if finalizer == FOREGROUND_FINALIZER:
            return False
    return False


def depends_on(entry: Entry, uid: str) -> bool:
    """Whether the object of ``entry`` names ``uid`` among its owners (the bytes are searched
    first: most objects name no owner, and decoding them all would cost more)."""
    if not uid or uid.encode() not in entry.raw:
        return False
    try:
        refs = _decode_owned(entry.raw).metadata.ownerReferences or []
    except msgspec.DecodeError:
        return False
    return any(ref.uid == uid for ref in refs)


def has_hidden(entries: Iterable[Entry], *, uid: str, in_slice: Callable[[Meta], bool]) -> bool:
    """Whether a dependent of ``uid`` among ``entries`` is not ``in_slice``."""
    return any(depends_on(e, uid) and not in_slice(e.meta) for e in entries)


class DependentCheck:
    """The dependents check of one request (a DELETE, or each object of a deletecollection)."""

    def __init__(self, ctx: ProxyRequest, resources: list[SharedResource]) -> None:
        self._ctx = ctx
        self._resources = resources

    def in_slice(self, meta: Meta) -> bool:
        member = self._ctx.member
        return visible(member, meta) and leaving(member, meta) is None

    def check(
        self,
        *,
        uid: str,
        namespace: str,
        finalizers: Iterable[str] | None,
        options: Mapping[str, Any],
    ) -> None:
        """409 when deleting the object ``uid`` with ``options`` would collect a dependent
        outside the slice."""
        if not self._resources or orphans(options, finalizers=finalizers):
            return
        cluster = self._ctx.path.cluster
        for resource in self._resources:
            entries = resource.store.entries_of(cluster, namespace=namespace or None)
            if has_hidden(entries, uid=uid, in_slice=self.in_slice):
                api = self._ctx.api
                raise Conflict(
                    f'{api.resource} "{api.name or "(collection)"}" has dependents outside the '
                    f"slice {self._ctx.route.cluster}/{self._ctx.route.name} (objects whose "
                    "ownerReferences name it), which kcp's garbage collector would delete: "
                    "delete it with propagationPolicy=Orphan",
                    details={"name": api.name, "group": api.group, "kind": api.resource},
                )


@contextlib.asynccontextmanager
async def checking(ctx: ProxyRequest) -> AsyncIterator[DependentCheck]:
    """The dependents check for deletes of ``ctx``'s resource: the deleted resource's shared
    cache held (and synced: 503 if it cannot be within :data:`SYNC_WAIT`), with every other
    resource the cache holds for the same upstream. A check that checks nothing where the slice
    does not use the cache."""
    registry = ctx.cache
    if registry is None or not ctx.records_holds:
        yield DependentCheck(ctx, [])
        return
    own = await registry.acquire(upstream=ctx.upstream_base, api_path=api_path(ctx))
    try:
        if not await own.wait_synced(SYNC_WAIT):
            if own.last_error is not None:
                # kcp refused the cache's list (a resource it does not serve: 404), with the
                # identity the DELETE goes with: kcp answers the DELETE too.
                yield DependentCheck(ctx, [])
                return
            raise UpstreamUnavailable(
                f"cannot check {ctx.api.resource} for dependents outside the slice yet (its "
                "cache is not synced); retry, or delete with propagationPolicy=Orphan",
                retry_after=2,
            )
        upstream = ctx.upstream_base.rstrip("/")
        others = [
            r
            for r in registry.resources()
            if r is not own and not r.table and r.upstream == upstream and r.synced
        ]
        yield DependentCheck(ctx, [own, *others])
    finally:
        registry.release(own)
