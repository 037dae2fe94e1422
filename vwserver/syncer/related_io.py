"""The caches and writes of related objects: thin I/O around :mod:`~vwserver.syncer.related_plan`.

One :class:`RelatedWatch` per ``resources[].related[]`` entry, owned by the primary resource's
:class:`~vwserver.syncer.sync_loop.ResourceController`:

* **sources**, on the origin side: for origin ``kcp`` one reflector per endpoint URL on
  ``<endpoint>/clusters/*/<related resource>`` — read through the endpoint *only*, so a
  filtered endpoint shows exactly the related objects its slice's ``spec.relatedResources``
  shows (a ``region=eu`` syncer never holds a ``region=us`` database's Secret); for origin
  ``downstream`` one reflector on the related resource in the downstream cluster, every
  namespace, of which only the syncer's own namespaces (``namespacePrefix``) are kept. Sources
  are bounded like primaries and *with* them: ``maxObjectBytes`` per object, and the
  resource's one :class:`~vwserver.syncer.memory.TenantLedger` per consumer workspace
  (``maxClusterBytes``, shared by the primaries and every related entry; a downstream source
  is charged to the workspace whose namespace it is in). An object over them is kept as a
  stub and not copied; a syncer's copy is only ever kept as a stub.
* **copies**, on the other side, restricted to this syncer's and this entry's labels: one
  reflector downstream (origin ``kcp``) or one per endpoint URL (origin ``downstream``). Only
  this syncer's own copies (:func:`~vwserver.syncer.related_plan.owned_copy`) are kept beyond
  their metadata — a consumer can put the labels on any Secret of its own, which the plan
  ignores anyway — and not beyond ``maxObjectBytes`` (a copy someone inflated is kept as its
  metadata, and applied again from its source).
* **one copy in memory**: a copy and its source share their big strings
  (:func:`~vwserver.syncer.memory.share_strings`), whichever of the two is cached second
  taking the first one's: a 1 MiB Secret is held once, not as source and copy.

Every event of either is turned into the namespace it happened in and handed to the controller,
which re-queues that namespace's primaries: a changed password Secret is copied at once, not at
the next resync. Writes (:meth:`RelatedWatch.execute`) are server-side applies under the
syncer's field manager — a new copy only after a live GET shows no object of someone else's
there — and deletes with a ``uid`` precondition, of owned copies only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from vwserver.clock import Clock
from vwserver.errors import ApiConflict, ApiError, ApiNotFound, OwnershipError, UpstreamUnavailable
from vwserver.k8s import kcp
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.reflector import Reflector
from vwserver.k8s.resources import ResourceType
from vwserver.syncer.memory import (
    UPSTREAM_PAGE,
    TenantBudget,
    TenantLedger,
    object_size,
    share_strings,
    stub,
)
from vwserver.syncer.metrics import SyncerMetrics
from vwserver.syncer.naming import (
    ANN_CLUSTER,
    ANN_NAMESPACE,
    ANN_SOURCE,
    LABEL_RELATED,
    LABEL_SYNCER,
    ObjectKey,
    downstream_namespace,
    upstream_key,
)
from vwserver.syncer.related_plan import CopyAction, CopyApply, Inputs, is_syncer_copy, owned_copy
from vwserver.syncer.related_spec import RelatedSpec

log = logging.getLogger(__name__)

Pair = tuple[str, str]
"""(logical cluster, namespace) of primaries in kcp."""
GroupKey = tuple[Hashable, str]
"""(namespace group, name): the group is a :data:`Pair` upstream, a namespace downstream."""


class GroupedCache(Cache[GroupKey]):
    """A cache that also finds its objects by namespace (:attr:`groups`); ``counterpart``: the
    cached object on the other side (a source's copy, a copy's source) whose big strings an
    object stored here takes instead of its own (one copy in memory)."""

    def __init__(
        self,
        *,
        key: Callable[[JSON], GroupKey | None],
        handler: Any,
        counterpart: Callable[[JSON], JSON | None] | None = None,
    ) -> None:
        super().__init__(key=key, handler=handler)
        self.groups: dict[Hashable, dict[str, JSON]] = {}
        self._counterpart = counterpart

    def in_group(self, group: Hashable) -> dict[str, JSON]:
        return self.groups.get(group, {})

    def _shared(self, obj: JSON) -> JSON:
        other = self._counterpart(obj) if self._counterpart is not None else None
        if other is not None:
            for field, value in obj.items():
                if field not in ("metadata", "status") and field in other:
                    obj[field] = share_strings(value, other[field])
        return obj

    def on_list(self, items: list[JSON], resource_version: str) -> None:
        super().on_list([self._shared(o) for o in items], resource_version)
        self.groups = {}
        for (group, name), obj in self.objects.items():
            self.groups.setdefault(group, {})[name] = obj

    def on_event(self, kind: str, obj: JSON) -> None:
        key = self._key(obj)
        super().on_event(kind, obj if kind == "DELETED" else self._shared(obj))
        if key is not None:
            self._index(key, None if kind == "DELETED" else obj)

    def put(self, obj: JSON) -> None:
        """Our own write's answer: seen before its event (which changes nothing then)."""
        key = self._key(obj)
        if key is not None:
            self.objects[key] = self._shared(obj)
            self._index(key, obj)

    def _index(self, key: GroupKey, obj: JSON | None) -> None:
        group, name = key
        if obj is not None:
            self.groups.setdefault(group, {})[name] = obj
            return
        members = self.groups.get(group)
        if members is not None:
            members.pop(name, None)
            if not members:
                del self.groups[group]


def _upstream_group_key(obj: JSON) -> GroupKey | None:
    key = upstream_key(obj)
    return None if key is None else ((key.cluster, key.namespace), key.name)


class _Events:
    """Every change of a related object → its namespace (``pair_of``) → the controller."""

    def __init__(self, pair_of: Callable[[JSON], Pair | None], changed: Callable[[Pair], None]):
        self._pair_of = pair_of
        self._changed = changed

    def on_upsert(self, obj: JSON) -> None:
        if (pair := self._pair_of(obj)) is not None:
            self._changed(pair)

    def on_delete(self, obj: JSON) -> None:
        self.on_upsert(obj)


class _SourceBudget(TenantBudget):
    """The sources' bounds, and a syncer's copy (never a source: copies never travel back)
    kept as a stub."""

    def admit(self, kind: str, obj: JSON) -> JSON:
        if kind != "DELETED" and is_syncer_copy(obj):
            return stub(obj)
        return super().admit(kind, obj)


class _CopyAdmission:
    """What the copies' reflector keeps: this syncer's own copies in full up to
    ``max_object_bytes`` (their content is shared with their source's), their metadata only
    beyond it (the plan then sees a drifted copy and applies it again from its source); of
    anything else carrying the labels — a consumer's own object, which the plan never
    touches — only a :func:`~vwserver.syncer.memory.stub`."""

    def __init__(self, *, syncer: str, label: str, max_object_bytes: int) -> None:
        self._syncer, self._label, self._max = syncer, label, max_object_bytes

    def begin_list(self) -> None:
        pass

    def admit(self, kind: str, obj: JSON) -> JSON:
        if kind == "DELETED":
            return obj
        if not owned_copy(obj, syncer=self._syncer, label=self._label):
            return stub(obj)
        if object_size(obj) > self._max:
            return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                    "metadata": obj.get("metadata") or {}}  # fmt: skip
        return obj


class RelatedWatch:
    """The caches of one related entry and its writes (module docstring)."""

    def __init__(
        self,
        spec: RelatedSpec,
        *,
        syncer: str,
        field_manager: str,
        namespace_prefix: str,
        upstream: KubeClient,
        downstream: KubeClient,
        downstream_base: str,
        clock: Clock,
        metrics: SyncerMetrics,
        metrics_name: str,
        max_object_bytes: int,
        ledger: TenantLedger,
        pair_of_namespace: Callable[[str], Pair | None],
        changed: Callable[[Pair], None],
    ) -> None:
        self.spec = spec
        self.type = ResourceType(spec.group, spec.version, spec.resource, spec.kind)
        self._syncer = syncer
        self._manager = field_manager
        self._prefix = namespace_prefix
        self._upstream = upstream
        self._downstream = downstream
        self._down_base = downstream_base
        self._clock = clock
        self._metrics = metrics
        self._metrics_name = metrics_name
        self._max_object = max_object_bytes
        self._ledger = ledger
        self._pair_of_namespace = pair_of_namespace
        self._changed = changed
        self._copy_selector = f"{LABEL_SYNCER}={syncer},{LABEL_RELATED}={spec.label}"
        self.reflectors: dict[str, Reflector[GroupedCache]] = {}
        """Per endpoint URL: the sources (origin kcp) or the copies (origin downstream)."""
        self._budgets: dict[str, TenantBudget] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.downstream_reflector = self._downstream_reflector()

    # --- caches ---------------------------------------------------------------------------

    def _down_group_key(self, obj: JSON) -> GroupKey | None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if not name or not namespace.startswith(self._prefix):
            return None  # not a namespace of the syncer's: never held
        return (namespace, name)

    def _down_pair(self, obj: JSON) -> Pair | None:
        if self.spec.copies_down:  # a copy names its primaries' namespace
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            cluster, namespace = annotations.get(ANN_CLUSTER), annotations.get(ANN_NAMESPACE)
            return (str(cluster), str(namespace)) if cluster and namespace is not None else None
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        return self._pair_of_namespace(namespace)

    def _downstream_reflector(self) -> Reflector[GroupedCache]:
        copies = self.spec.copies_down
        name = f"downstream {self.spec.resource} ({'copies' if copies else 'sources'} of "
        name += f"{self._metrics_name} related {self.spec.name})"
        admission: TenantBudget | _CopyAdmission
        if copies:
            admission = self._copy_admission()
        else:
            admission = self._budgets["downstream"] = _SourceBudget(
                key=lambda o: _budget_key(self._down_group_key(o)),
                max_object_bytes=self._max_object,
                ledger=self._ledger,
                account=self._downstream_account,
            )
        return Reflector(
            name=name,
            client=self._downstream,
            url=self.type.collection(self._down_base),
            handler=GroupedCache(
                key=self._down_group_key,
                handler=_Events(self._down_pair, self._changed),
                counterpart=self._source_of_copy if copies else self._copy_of_source,
            ),
            clock=self._clock,
            admission=admission,
            label_selector=self._copy_selector if copies else self._source_selector(),
            on_restart=lambda cause: self._metrics.watch_restarts.labels(
                self._metrics_name, "downstream", cause
            ).inc(),
        )

    def _copy_admission(self) -> _CopyAdmission:
        return _CopyAdmission(
            syncer=self._syncer, label=self.spec.label, max_object_bytes=self._max_object
        )

    def _downstream_account(self, key: ObjectKey) -> str:
        # a downstream source counts against the workspace whose namespace it is in (known
        # once a primary of that namespace was seen; until then against the namespace alone)
        pair = self._pair_of_namespace(key.namespace)
        return pair[0] if pair is not None else key.cluster

    # --- one copy in memory: a copy and its source share their big strings ------------------

    def _source_of_copy(self, copy: JSON) -> JSON | None:
        annotations = (copy.get("metadata") or {}).get("annotations") or {}
        namespace, _, name = str(annotations.get(ANN_SOURCE) or "").rpartition("/")
        if not name:
            return None
        if self.spec.copies_down:  # the source is in kcp: (cluster, namespace), name
            group: Hashable = (str(annotations.get(ANN_CLUSTER) or ""), namespace)
            for reflector in self.reflectors.values():
                if (found := reflector.handler.in_group(group).get(name)) is not None:
                    return found
            return None
        return self.downstream_reflector.handler.in_group(namespace).get(name)

    def _copy_of_source(self, source: JSON) -> JSON | None:
        meta = source.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        wanted = f"{namespace}/{name}"
        if self.spec.copies_down:  # the copy is downstream, in the namespace's namespace
            cluster = kcp.logical_cluster(source)
            down = downstream_namespace(cluster, namespace, prefix=self._prefix)
            groups = [self.downstream_reflector.handler.in_group(down)]
        else:  # the copy is in kcp, in the primaries' namespace
            pair = self._pair_of_namespace(namespace)
            if pair is None:
                return None
            groups = [r.handler.in_group(pair) for r in self.reflectors.values()]
        for copies in groups:
            for copy in copies.values():
                annotations = (copy.get("metadata") or {}).get("annotations") or {}
                if annotations.get(ANN_SOURCE) == wanted:
                    return copy
        return None

    def _source_selector(self) -> str | None:
        return self.spec.selector.render() if self.spec.selector is not None else None

    def set_endpoints(self, urls: Iterable[str]) -> None:
        wanted = list(urls)
        for url in list(self.reflectors):
            if url not in wanted:
                self._tasks.pop(url).cancel()
                budget = self._budgets.pop(url, None)
                if budget is not None:
                    budget.begin_list()  # what its objects took of the tenants' budgets
                reflector = self.reflectors.pop(url)
                for group in reflector.handler.groups:
                    if isinstance(group, tuple):
                        self._changed(group)
        sources = self.spec.copies_down
        for url in wanted:
            if url in self.reflectors:
                continue
            admission: TenantBudget | _CopyAdmission
            if sources:
                admission = self._budgets[url] = _SourceBudget(
                    key=upstream_key, max_object_bytes=self._max_object, ledger=self._ledger
                )
            else:
                admission = self._copy_admission()
            what = "sources" if sources else "copies"
            reflector = Reflector(
                name=f"upstream {self.spec.resource} ({what} of {self._metrics_name} related "
                f"{self.spec.name}) @ {url}",
                client=self._upstream,
                url=self.type.collection(kcp.clusters(url)),
                handler=GroupedCache(
                    key=_upstream_group_key,
                    handler=_Events(lambda o: _pair(_upstream_group_key(o)), self._changed),
                    counterpart=self._copy_of_source if sources else self._source_of_copy,
                ),
                clock=self._clock,
                admission=admission,
                page_size=UPSTREAM_PAGE,
                label_selector=self._source_selector() if sources else self._copy_selector,
                on_restart=lambda cause: self._metrics.watch_restarts.labels(
                    self._metrics_name, "upstream", cause
                ).inc(),
            )
            self.reflectors[url] = reflector
            self._tasks[url] = asyncio.create_task(
                reflector.run(), name=f"reflector {reflector.name}"
            )

    def all_reflectors(self) -> list[Reflector[GroupedCache]]:
        return [self.downstream_reflector, *self.reflectors.values()]

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.all_reflectors())

    async def run(self) -> None:
        try:
            await self.downstream_reflector.run()
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def copy_pairs(self) -> set[Pair]:
        """The namespaces holding copies (for the resync: a namespace without primaries)."""
        if self.spec.copies_down:
            pairs = set()
            for obj in self.downstream_reflector.handler.objects.values():
                if (pair := self._down_pair(obj)) is not None:
                    pairs.add(pair)
            return pairs
        groups = (g for r in self.reflectors.values() for g in r.handler.groups)
        return {g for g in groups if isinstance(g, tuple)}

    def inputs(
        self, pair: Pair, downstream_namespace: str, *, fetched: Mapping[str, JSON] | None = None
    ) -> Inputs:
        """What the caches hold for the namespace ``pair`` (its downstream namespace given);
        ``fetched``: sources of origin kcp just read live (:meth:`fetch`), not yet cached."""
        up: dict[str, JSON] = dict(fetched or {})
        for reflector in self.reflectors.values():
            up.update(reflector.handler.in_group(pair))
        down = dict(self.downstream_reflector.handler.in_group(downstream_namespace))
        if self.spec.copies_down:
            sources, copies = up, down
            too_large = {
                name: reason
                for budget in self._budgets.values()
                for name in sources
                if (reason := budget.too_large.get(ObjectKey(*pair, name))) is not None
            }
        else:
            sources, copies = down, up
            budget = self._budgets.get("downstream")
            too_large = {}
            if budget is not None:
                for name in sources:
                    key = _budget_key((downstream_namespace, name))
                    if key is not None and (reason := budget.too_large.get(key)) is not None:
                        too_large[name] = reason
        return Inputs(sources=sources, copies=copies, too_large=too_large)

    async def fetch(self, pair: Pair, names: Iterable[str], *, endpoint: str) -> dict[str, JSON]:
        """Sources of origin kcp named by a new primary that the cache does not hold yet, read
        live through ``endpoint`` (:func:`~vwserver.syncer.related_plan.missing_sources` says
        which, at most the names one object references). Only for this one plan: the cache
        keeps what its watch says (a missing one, a syncer's copy or one over
        ``maxObjectBytes`` is left to it, and to the note or condition the plan then gives)."""
        found: dict[str, JSON] = {}
        cluster, namespace = pair
        for name in sorted(names):
            url = self.type.item(kcp.clusters(endpoint, cluster), namespace, name)
            try:
                obj = await self._upstream.get(url)
            except (ApiError, UpstreamUnavailable) as e:
                log.debug(
                    "%s: related %s: cannot read %s/%s: %s",
                    self._metrics_name,
                    self.spec.name,
                    namespace,
                    name,
                    e,
                )
                continue
            if obj is None or is_syncer_copy(obj) or object_size(obj) > self._max_object:
                continue
            found[name] = obj
        return found

    # --- writes ---------------------------------------------------------------------------

    async def execute(self, action: CopyAction, *, cluster: str, endpoint: str | None) -> None:
        """Carry out one copy action; ``endpoint``: the endpoint URL of the namespace's
        primaries (writes in kcp go through it)."""
        down = action.down
        cache: GroupedCache | None
        if down:
            url = self.type.item(self._down_base, action.namespace, action.name)
            client, cache = self._downstream, self.downstream_reflector.handler
            side = "downstream"
        else:
            found = self._upstream_copy_endpoint(cluster, action.namespace, action.name)
            endpoint = found or endpoint
            if endpoint is None:
                raise OwnershipError(
                    f"related {self.spec.name}: no endpoint to write {action.namespace}/"
                    f"{action.name} through (the primary is not visible)"
                )
            url = self.type.item(kcp.clusters(endpoint, cluster), action.namespace, action.name)
            client = self._upstream
            cache = self.reflectors[endpoint].handler if endpoint in self.reflectors else None
            side = "upstream"
        where = "downstream" if down else "kcp"
        if isinstance(action, CopyApply):
            if action.create:
                existing = await client.get(url)
                if existing is not None and not owned_copy(
                    existing, syncer=self._syncer, label=self.spec.label
                ):
                    raise OwnershipError(
                        f"related {self.spec.name}: {where} {self.spec.resource} "
                        f"{action.namespace}/{action.name} exists and is not a copy of syncer "
                        f"{self._syncer}; delete or rename it"
                    )
            try:
                # a new copy does not take fields over from anyone (force only on our own)
                stored = await client.apply(
                    url, action.body, field_manager=self._manager, force=not action.create
                )
            except ApiConflict as e:
                raise OwnershipError(
                    f"related {self.spec.name}: {where} {self.spec.resource} "
                    f"{action.namespace}/{action.name}: another writer owns its fields"
                ) from e
            if cache is not None:
                cache.put(stored)
            self._metrics.writes.labels(self._metrics_name, side, "related-apply").inc()
            log.info(
                "%s: related %s: applied %s %s/%s",
                self._metrics_name,
                self.spec.name,
                where,
                action.namespace,
                action.name,
            )
            return
        with contextlib.suppress(ApiNotFound, ApiConflict):  # gone, or replaced (uid)
            await client.delete(url, uid=action.uid or None)
        self._metrics.writes.labels(self._metrics_name, side, "related-delete").inc()
        log.info(
            "%s: related %s: deleted %s %s/%s",
            self._metrics_name,
            self.spec.name,
            where,
            action.namespace,
            action.name,
        )

    def _upstream_copy_endpoint(self, cluster: str, namespace: str, name: str) -> str | None:
        for endpoint, reflector in self.reflectors.items():
            if name in reflector.handler.in_group((cluster, namespace)):
                return endpoint
        return None


def _pair(key: GroupKey | None) -> Pair | None:
    if key is None:
        return None
    group = key[0]
    return group if isinstance(group, tuple) else None


def _budget_key(key: GroupKey | None) -> ObjectKey | None:
    # the downstream sources' bound per namespace: the namespace stands in for the cluster
    if key is None:
        return None
    namespace = str(key[0])
    return ObjectKey(namespace, namespace, key[1])
