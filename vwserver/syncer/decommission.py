"""``vwserver sync --config FILE --decommission``: take one syncer out of service cleanly.

Why: a syncer puts its finalizer ``sync.edge-connect.eu/syncer-<name>`` on every kcp object it
syncs, so that a deletion waits until the downstream copy is gone. A syncer that is stopped for
good leaves those finalizers behind, and every deletion in kcp then hangs in Terminating. This
command, run once the syncer's replicas are stopped, removes what the syncer left:

1. **Its finalizer**, from every object its endpoints show (every configured resource, every
   endpoint URL, ``clusters/*``). Each removal is a JSON patch (RFC 6902) that ``test``\\ s the
   object's ``resourceVersion`` and that the entry at index *i* of ``metadata.finalizers`` is
   ours, then removes index *i*: only our entry goes, and only from the version we read (the
   apiserver applies a patch to the stored object: a failed ``test`` is refused with 422, a
   concurrent write makes our test fail). Refused patches are retried on a fresh read.
2. With ``--delete-downstream``: **its downstream copies** — only objects labelled with this
   syncer's name (:func:`~vwserver.syncer.naming.owned_by`, as the sync loop marks them), each
   deleted with a ``uid`` precondition — and then **the namespaces it created that are now
   empty**: labelled as syncer-made, named exactly as this syncer derives names for the source
   their annotations name, and holding nothing but what Kubernetes puts in every namespace
   (ServiceAccount ``default``, ConfigMap ``kube-root-ca.crt``, events). A copy that still waits
   for its own finalizers (an operator's) is waited for up to ``--wait`` seconds; its namespace
   is kept until a later run finds it empty. **Copies of related objects** go too, by the sync
   loop's ownership rule (:func:`~vwserver.syncer.related_plan.owned_copy`: both labels, the
   owner label written by this syncer's field manager — a consumer's Secret labelled so is not
   a copy): copies down after the primaries' copies are gone (an operator cleaning up may still
   read the password), before the namespaces; copies up (origin ``downstream``: they copy what
   the downstream side wrote, which is going) in kcp through the endpoints, each with a ``uid``
   precondition.

A summary is printed; the exit code is 0 only if everything was cleaned. Running it again is
safe and finishes what an earlier run could not (nothing already clean is touched). Objects that
left the syncer's filtered view while carrying its finalizer cannot be seen through its
endpoints and are not reached (remove that finalizer through kcp directly).

Before touching anything, the syncer's Lease in the downstream cluster is read: a lease renewed
within its duration means a replica still runs (it would put every finalizer back) and the
command refuses, unless ``--force``.

:func:`finalizer_patch`, :func:`leftovers` and :func:`lease_holder` are the pure decisions;
:class:`Decommission` does the I/O.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vwserver.clock import Clock, SystemClock
from vwserver.errors import (
    ApiConflict,
    ApiError,
    ApiInvalid,
    ApiNotFound,
    DecommissionRefused,
    SyncError,
    UpstreamUnavailable,
)
from vwserver.k8s import kcp
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.kubeconfig import SERVICE_ACCOUNT_DIR
from vwserver.k8s.resources import LEASES, NAMESPACES, ResourceType
from vwserver.syncer.clients import open_clients
from vwserver.syncer.config import SyncerConfig
from vwserver.syncer.endpoints import read_endpoints
from vwserver.syncer.namespaces import (
    leftovers,
    list_all,
    namespace_is_ours,
    namespaced_types,
)
from vwserver.syncer.naming import (
    LABEL_MANAGED,
    LABEL_RELATED,
    LABEL_SYNCER,
    owned_by,
    upstream_key,
)
from vwserver.syncer.related_plan import owned_copy
from vwserver.syncer.related_spec import RelatedSpec, compile_all

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
ATTEMPTS = 5
"""Fresh reads per object before a finalizer removal counts as failed (each refused patch means
the object changed meanwhile)."""

# --- pure decisions --------------------------------------------------------------------------


def finalizer_patch(obj: Mapping[str, Any], finalizer: str) -> list[JSON] | None:
    """The JSON patch that removes ``finalizer`` from ``obj`` as read, or None if it has none.

    ``test`` ops make it conditional: on the resourceVersion read and on the entry at the index
    being ours, so only our entry is removed and only from this version of the object."""
    meta = obj.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if finalizer not in finalizers:
        return None
    i = finalizers.index(finalizer)
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
        {"op": "test", "path": f"/metadata/finalizers/{i}", "value": finalizer},
        {"op": "remove", "path": f"/metadata/finalizers/{i}"},
    ]


def lease_holder(
    lease: Mapping[str, Any] | None, *, now: datetime.datetime, margin: float = 5.0
) -> str | None:
    """The identity holding ``lease`` if it was renewed within its duration (plus ``margin``
    seconds for clock skew) before ``now``; None if it is free, released or expired."""
    spec = (lease or {}).get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder:
        return None  # released on shutdown, or never taken
    renewed = _parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if renewed is None:
        return str(holder)
    return str(holder) if (now - renewed).total_seconds() < duration + margin else None


def _parse_time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    with contextlib.suppress(ValueError):
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def _type(spec: RelatedSpec) -> ResourceType:
    return ResourceType(spec.group, spec.version, spec.resource, spec.kind)


def _owned_related(obj: JSON, *, syncer: str, label: str, busy: set[str]) -> bool:
    """A copy of the related entry ``label`` of ours, not in a namespace where a primary's copy
    is still terminating."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    return owned_copy(obj, syncer=syncer, label=label) and namespace not in busy


def _copy_selector(syncer: str, spec: RelatedSpec) -> str:
    """The copies of one related entry (the sync loop's reflectors select them so too)."""
    return f"{LABEL_SYNCER}={syncer},{LABEL_RELATED}={spec.label}"


# --- the summary -----------------------------------------------------------------------------


@dataclass
class Summary:
    """What a decommission did; :attr:`clean` decides the exit code."""

    syncer: str
    finalizers_removed: list[str] = field(default_factory=list)
    objects_seen: int = 0
    copies_deleted: list[str] = field(default_factory=list)
    copies_terminating: list[str] = field(default_factory=list)
    upstream_copies_deleted: list[str] = field(default_factory=list)
    """Copies of related objects of origin ``downstream``, in kcp."""
    namespaces_deleted: list[str] = field(default_factory=list)
    namespaces_kept: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.failures and not self.copies_terminating

    def lines(self, *, downstream: bool) -> list[str]:
        out = [
            f"decommission of syncer {self.syncer!r}:",
            f"  finalizers removed: {len(self.finalizers_removed)} "
            f"(of {self.objects_seen} objects seen upstream)",
        ]
        out += [f"    {key}" for key in self.finalizers_removed]
        if downstream:
            out.append(f"  downstream copies deleted: {len(self.copies_deleted)}")
            out += [f"    {name}" for name in self.copies_deleted]
            if self.copies_terminating:
                out.append(
                    f"  downstream copies still terminating (their own finalizers): "
                    f"{len(self.copies_terminating)} — run again later"
                )
                out += [f"    {name}" for name in self.copies_terminating]
            if self.upstream_copies_deleted:
                out.append(f"  related copies deleted in kcp: {len(self.upstream_copies_deleted)}")
                out += [f"    {name}" for name in self.upstream_copies_deleted]
            out.append(f"  namespaces deleted: {len(self.namespaces_deleted)}")
            out += [f"    {name}" for name in self.namespaces_deleted]
            if self.namespaces_kept:
                out.append(f"  namespaces kept (not empty): {len(self.namespaces_kept)}")
                out += [f"    {line}" for line in self.namespaces_kept]
        else:
            out.append("  downstream copies: kept (no --delete-downstream)")
        if self.failures:
            out.append(f"  FAILED: {len(self.failures)}")
            out += [f"    {line}" for line in self.failures]
        out.append("  result: " + ("clean" if self.clean else "NOT clean — run again"))
        return out


# --- the I/O ---------------------------------------------------------------------------------


class Decommission:
    def __init__(
        self,
        config: SyncerConfig,
        *,
        upstream: KubeClient,
        endpoints: KubeClient,
        downstream: KubeClient,
        upstream_server: str,
        downstream_base: str,
        clock: Clock | None = None,
        wait_seconds: float = 60.0,
        poll_seconds: float = 1.0,
    ) -> None:
        """``upstream``: kcp (the slice lookup); ``endpoints``: the endpoint URLs' connection;
        ``wait_seconds``: how long deleted downstream copies are waited for."""
        self.config = config
        self._upstream = upstream
        self._endpoints = endpoints
        self._downstream = downstream
        self._upstream_server = upstream_server
        self._down = downstream_base
        self._clock = clock or SystemClock()
        self._wait = wait_seconds
        self._poll = poll_seconds
        self.summary = Summary(config.name)

    async def check_not_running(self) -> None:
        """Refuse while a replica holds the syncer's Lease (it would re-add every finalizer)."""
        cfg = self.config
        if not cfg.leader_election.enabled:
            log.warning("leader election is off: cannot check that no replica still runs")
            return
        url = LEASES.item(self._down, cfg.leader_election.namespace, cfg.lease_name)
        try:
            lease = await self._downstream.get(url)
        except (ApiError, UpstreamUnavailable) as e:
            raise DecommissionRefused(
                f"cannot read lease {cfg.leader_election.namespace}/{cfg.lease_name} to check "
                f"that the syncer is stopped: {e} (--force skips the check)"
            ) from e
        holder = lease_holder(lease, now=self._clock.now())
        if holder is not None:
            raise DecommissionRefused(
                f"the syncer still runs: lease {cfg.leader_election.namespace}/{cfg.lease_name} "
                f"is held by {holder!r}; stop every replica first (a stopped replica releases "
                "it; a crashed one's expires after leaseDurationSeconds), or --force"
            )

    async def remove_finalizers(self) -> None:
        urls = await self._endpoint_urls()
        for resource in self.config.resources:
            t = ResourceType(resource.group, resource.version, resource.resource, resource.kind)
            for url in urls:
                await self._remove_finalizers_at(t, url)

    async def delete_downstream(self) -> None:
        """Delete this syncer's downstream copies and wait for them, then the related copies
        (down, waited for; up, in kcp), then its empty namespaces."""
        used_namespaces: set[str] = set()
        name = self.config.name
        pending: dict[str, tuple[ResourceType, str, str]] = {}
        for resource in self.config.resources:
            d = resource.target
            t = ResourceType(d.group, d.version, d.resource, d.kind)
            await self._delete_copies(
                t,
                f"{LABEL_SYNCER}={name}",
                # the label selector said so; the labels must say so too
                lambda obj: owned_by(obj, name),
                label=t.resource,
                pending=pending,
                used=used_namespaces,
            )
        left = await self._wait_gone(pending)
        # what a copy still terminating references stays (its operator may still read the
        # password while it cleans up), as in the sync loop: a later run deletes it
        busy = {namespace for _, namespace, _ in left.values()}
        specs = [spec for r in self.config.resources for spec in compile_all(r)]
        pending = {}
        for spec in specs:
            if spec.copies_down:
                await self._delete_copies(
                    _type(spec),
                    _copy_selector(name, spec),
                    functools.partial(_owned_related, syncer=name, label=spec.label, busy=busy),
                    label=f"{spec.resource} (related {spec.name})",
                    pending=pending,
                    used=used_namespaces,
                )
        await self._wait_gone(pending)
        up = [spec for spec in specs if not spec.copies_down]
        if up:
            try:
                urls = await self._endpoint_urls()
            except (ApiError, UpstreamUnavailable) as e:
                self.summary.failures.append(f"endpoint URLs (for the related copies in kcp): {e}")
                urls = []
            for spec in up:
                for url in urls:
                    await self._delete_upstream_copies(spec, url)
        await self._delete_empty_namespaces(used_namespaces)

    async def _delete_copies(
        self,
        t: ResourceType,
        selector: str,
        owns: Callable[[JSON], bool],
        *,
        label: str,
        pending: dict[str, tuple[ResourceType, str, str]],
        used: set[str],
    ) -> None:
        """Delete the downstream objects of ``t`` that ``selector`` lists and ``owns`` (a
        predicate over the object) accepts; what was deleted is added to ``pending``."""
        try:
            objects = await list_all(
                self._downstream, t.collection(self._down), [("labelSelector", selector)]
            )
        except (ApiError, UpstreamUnavailable) as e:
            self.summary.failures.append(f"listing downstream {label}: {e}")
            return
        for obj in objects:
            if not owns(obj):
                continue
            meta = obj.get("metadata") or {}
            namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            what = f"{label} {namespace}/{name}"
            used.add(namespace)
            try:
                if not meta.get("deletionTimestamp"):
                    # uid precondition: a same-named object created meanwhile is not ours
                    await self._downstream.delete(
                        t.item(self._down, namespace, name), uid=meta.get("uid")
                    )
                    self.summary.copies_deleted.append(what)
                    log.info("deleted downstream %s", what)
            except (ApiNotFound, ApiConflict):
                continue  # gone, or replaced by an object that is not this one
            except (ApiError, UpstreamUnavailable) as e:
                self.summary.failures.append(f"deleting downstream {what}: {e}")
                continue
            pending[what] = (t, namespace, name)

    async def _delete_upstream_copies(self, spec: RelatedSpec, endpoint: str) -> None:
        """Delete the copies in kcp of related objects of origin ``downstream`` that one
        endpoint shows (the sync loop writes them through it; the slice shows them by their
        owner label)."""
        t = _type(spec)
        try:
            objects = await list_all(
                self._endpoints,
                t.collection(kcp.clusters(endpoint)),
                [("labelSelector", _copy_selector(self.config.name, spec))],
            )
        except (ApiError, UpstreamUnavailable) as e:
            self.summary.failures.append(f"listing {spec.resource} at {endpoint}: {e}")
            return
        for obj in objects:
            key = upstream_key(obj)
            if key is None or not owned_copy(obj, syncer=self.config.name, label=spec.label):
                continue
            what = f"{spec.resource} {key} (related {spec.name})"
            url = t.item(kcp.clusters(endpoint, key.cluster), key.namespace or None, key.name)
            uid = (obj.get("metadata") or {}).get("uid")
            try:
                await self._endpoints.delete(url, uid=uid)
            except (ApiNotFound, ApiConflict):
                continue  # gone, or replaced by an object that is not this one
            except (ApiError, UpstreamUnavailable) as e:
                self.summary.failures.append(f"deleting {what}: {e}")
                continue
            self.summary.upstream_copies_deleted.append(what)
            log.info("deleted %s in kcp", what)

    # --- upstream ------------------------------------------------------------------------------

    async def _endpoint_urls(self) -> list[str]:
        up = self.config.upstream
        if up.endpoint_slice is None:
            return [u.rstrip("/") for u in up.urls]
        urls = await read_endpoints(
            self._upstream, server=self._upstream_server, ref=up.endpoint_slice
        )
        if not urls:
            log.warning("endpoint slice %s lists no endpoint URLs", up.endpoint_slice.name)
        return urls

    async def _remove_finalizers_at(self, t: ResourceType, endpoint: str) -> None:
        try:
            objects = await list_all(self._endpoints, t.collection(kcp.clusters(endpoint)), [])
        except (ApiError, UpstreamUnavailable) as e:
            self.summary.failures.append(f"listing {t.resource} at {endpoint}: {e}")
            return
        self.summary.objects_seen += len(objects)
        for obj in objects:
            key = upstream_key(obj)
            if key is None or finalizer_patch(obj, self.config.finalizer) is None:
                continue
            url = t.item(kcp.clusters(endpoint, key.cluster), key.namespace or None, key.name)
            label = f"{t.resource} {key}"
            try:
                removed = await self._remove_finalizer(url, obj)
            except (ApiError, SyncError, UpstreamUnavailable) as e:
                self.summary.failures.append(f"finalizer of {label}: {e}")
                continue
            if removed:
                self.summary.finalizers_removed.append(label)
                log.info("removed finalizer %s from %s", self.config.finalizer, label)

    async def _remove_finalizer(self, url: str, obj: JSON) -> bool:
        """Remove our finalizer from the object at ``url`` (``obj``: as last read); False if it
        was gone already. Retried on a fresh read when the object changed meanwhile."""
        for _ in range(ATTEMPTS):
            patch = finalizer_patch(obj, self.config.finalizer)
            if patch is None:
                return False
            try:
                await self._endpoints.request("PATCH", url, body=patch, content_type=JSON_PATCH)
                return True
            except ApiNotFound:
                return False  # deleted (or out of view) meanwhile
            except (ApiConflict, ApiInvalid):
                # a failed `test`: the object changed since we read it
                fresh = await self._endpoints.get(url)
                if fresh is None:
                    return False
                obj = fresh
        raise SyncError(f"it kept changing ({ATTEMPTS} conditional patches refused); run again")

    # --- downstream ----------------------------------------------------------------------------

    async def _wait_gone(
        self, pending: dict[str, tuple[ResourceType, str, str]]
    ) -> dict[str, tuple[ResourceType, str, str]]:
        """Wait up to ``--wait`` seconds for ``pending`` to be gone; returns what is not."""
        deadline = self._clock.monotonic() + self._wait
        while pending:
            for label, (t, namespace, name) in list(pending.items()):
                try:
                    if await self._downstream.get(t.item(self._down, namespace, name)) is None:
                        del pending[label]
                except (ApiError, UpstreamUnavailable) as e:
                    self.summary.failures.append(f"checking downstream {label}: {e}")
                    del pending[label]
            if not pending or self._clock.monotonic() >= deadline:
                break
            await self._clock.sleep(self._poll)
        self.summary.copies_terminating.extend(sorted(pending))
        return pending

    async def _delete_empty_namespaces(self, used: set[str]) -> None:
        try:
            namespaces = await list_all(
                self._downstream,
                NAMESPACES.collection(self._down),
                [("labelSelector", f"{LABEL_MANAGED}=true")],
            )
        except (ApiError, UpstreamUnavailable) as e:
            self.summary.failures.append(f"listing downstream namespaces: {e}")
            return
        candidates = [
            str(ns["metadata"]["name"])
            for ns in namespaces
            if namespace_is_ours(ns, prefix=self.config.namespace_prefix)
            and not (ns.get("metadata") or {}).get("deletionTimestamp")
        ]
        if not candidates:
            return
        try:
            types = await namespaced_types(self._downstream, self._down)
        except (ApiError, UpstreamUnavailable) as e:
            self.summary.failures.append(f"downstream discovery (to see what is left): {e}")
            return
        for name in sorted(candidates):
            try:
                left = leftovers(
                    {
                        (t.group, t.resource): await list_all(
                            self._downstream, t.collection(self._down, name), []
                        )
                        for t in types
                    }
                )
                if left:
                    if name in used:
                        shown = ", ".join(left[:5]) + (", …" if len(left) > 5 else "")
                        self.summary.namespaces_kept.append(f"{name}: {shown}")
                    continue
                await self._downstream.request("DELETE", NAMESPACES.item(self._down, None, name))
                self.summary.namespaces_deleted.append(name)
                log.info("deleted downstream namespace %s", name)
            except ApiNotFound:
                continue
            except (ApiError, UpstreamUnavailable) as e:
                self.summary.failures.append(f"namespace {name}: {e}")


async def decommission(
    config: SyncerConfig,
    *,
    base_dir: Path,
    delete_downstream: bool,
    force: bool = False,
    wait_seconds: float = 60.0,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Summary:
    """Decommission the syncer ``config`` describes (module docstring). Raises ConfigError for
    unusable credentials, :class:`DecommissionRefused` when a replica still runs."""
    async with open_clients(
        config, base_dir=base_dir, service_account_dir=service_account_dir
    ) as clients:
        job = Decommission(
            config,
            upstream=clients.upstream,
            endpoints=clients.endpoints,
            downstream=clients.downstream,
            upstream_server=clients.upstream_server,
            downstream_base=clients.downstream_base,
            wait_seconds=wait_seconds,
        )
        if not force:
            await job.check_not_running()
        try:
            await job.remove_finalizers()
        except (ApiError, UpstreamUnavailable) as e:  # the endpoint slice could not be read
            job.summary.failures.append(f"endpoint URLs: {e}")
        if delete_downstream:
            await job.delete_downstream()
        return job.summary


__all__ = [
    "Decommission",
    "DecommissionRefused",
    "Summary",
    "decommission",
    "finalizer_patch",
    "lease_holder",
    "leftovers",
    "namespace_is_ours",
]
