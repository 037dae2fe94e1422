"""Downstream namespaces the syncer made, and when one may go.

The syncer creates one downstream namespace per (logical cluster, namespace) pair it syncs
(:func:`~vwserver.syncer.naming.downstream_namespace`). When the last object it keeps there goes
— the last primary's copy, the last copy of a related object — the namespace is stale: left
there, a cluster that syncs many short-lived workspaces fills up with empty namespaces. But a
namespace may hold what the syncer cannot see: another syncer's copies (two syncers for the same
consumer namespace share the downstream one), what the operator made (a StatefulSet still being
garbage-collected, a connection-string Secret). Deleting a namespace deletes everything in it,
so the syncer deletes one only when it is **empty, checked live**: every namespaced resource the
server lists (discovery) is listed in it, and nothing but what Kubernetes puts in every
namespace (ServiceAccount ``default``, ConfigMap ``kube-root-ca.crt``, events) may be there —
the check ``--decommission`` makes, shared. Only a namespace labelled as syncer-made and named
exactly as this syncer derives names for the source its annotations name is a candidate; it is
deleted with a ``uid`` precondition.

A namespace found not empty is remembered and checked again at the next resync (the operator's
objects usually go a moment after the copy), until it is empty or in use again.

:func:`leftovers` and :func:`namespace_is_ours` are the pure decisions; :class:`Janitor` does
the I/O.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vwserver.clock import Clock
from vwserver.errors import (
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiNotFound,
    UpstreamUnavailable,
)
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.resources import NAMESPACES, ResourceType
from vwserver.syncer.naming import ANN_CLUSTER, ANN_NAMESPACE, LABEL_MANAGED, downstream_namespace

log = logging.getLogger(__name__)

PAGE_SIZE = 500
#: Seconds the list of namespaced resource types (discovery) is reused.
DISCOVERY_TTL = 600.0

# What Kubernetes creates in every namespace by itself: their presence does not make a namespace
# "used". (group, resource) -> names, or None for every object of the resource.
_BUILT_IN: dict[tuple[str, str], frozenset[str] | None] = {
    ("", "serviceaccounts"): frozenset({"default"}),
    ("", "configmaps"): frozenset({"kube-root-ca.crt"}),
    ("", "events"): None,
    ("events.k8s.io", "events"): None,
}


def namespace_is_ours(ns: Mapping[str, Any], *, prefix: str) -> bool:
    """Whether a downstream namespace is one this syncer's config derives: labelled as made by
    a syncer and named exactly as :func:`downstream_namespace` names its source's."""
    meta = ns.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    cluster, namespace = annotations.get(ANN_CLUSTER), annotations.get(ANN_NAMESPACE)
    if labels.get(LABEL_MANAGED) != "true" or not cluster or namespace is None:
        return False
    return bool(meta.get("name") == downstream_namespace(cluster, namespace, prefix=prefix))


def leftovers(listings: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> list[str]:
    """What keeps a namespace from being empty: ``resource/name`` of every object but the ones
    Kubernetes puts in every namespace. ``listings``: (group, resource) -> the objects."""
    out = []
    for (group, resource), objects in sorted(listings.items()):
        if (group, resource) in _BUILT_IN and _BUILT_IN[(group, resource)] is None:
            continue
        allowed = _BUILT_IN.get((group, resource)) or frozenset()
        qualified = f"{resource}.{group}" if group else resource
        for obj in objects:
            name = str((obj.get("metadata") or {}).get("name", ""))
            if name not in allowed:
                out.append(f"{qualified}/{name}")
    return out


async def list_all(client: KubeClient, url: str, query: Iterable[tuple[str, str]]) -> list[JSON]:
    """Every item of a collection, in pages (``limit``/``continue``)."""
    items: list[JSON] = []
    token = ""
    while True:
        q = [*query, ("limit", str(PAGE_SIZE))] + ([("continue", token)] if token else [])
        page = await client.request("GET", url, query=q)
        items.extend(page.get("items") or [])
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return items


async def namespaced_types(client: KubeClient, base: str) -> list[ResourceType]:
    """Every namespaced resource type the server lists (preferred versions), from discovery."""
    lists = [await client.request("GET", f"{base}/api/v1")]
    groups = await client.request("GET", f"{base}/apis")
    for group in groups.get("groups") or []:
        gv = (group.get("preferredVersion") or {}).get("groupVersion")
        if gv:
            with contextlib.suppress(ApiNotFound):  # an aggregated API that went away
                lists.append(await client.request("GET", f"{base}/apis/{gv}"))
    out = []
    for doc in lists:
        group, _, version = str(doc.get("groupVersion", "")).rpartition("/")
        for r in doc.get("resources") or []:
            name = str(r.get("name", ""))
            if "/" in name or not r.get("namespaced") or "list" not in (r.get("verbs") or []):
                continue
            out.append(ResourceType(group, version, name, str(r.get("kind", ""))))
    return out


class Janitor:
    """Deletes downstream namespaces the syncer made once they are empty (module docstring)."""

    def __init__(
        self, *, client: KubeClient, base: str, prefix: str, clock: Clock, on_delete: Any = None
    ) -> None:
        self._client = client
        self._base = base
        self._prefix = prefix
        self._clock = clock
        self._types: list[ResourceType] = []
        self._types_at = -DISCOVERY_TTL
        #: Namespaces found not empty (what was left), checked again at each resync.
        self.pending: dict[str, str] = {}
        self._on_delete = on_delete or (lambda name: None)
        self._failing: str | None = None

    async def check(self, name: str) -> bool:
        """Delete namespace ``name`` if it is ours and empty; True if it is gone. Failures are
        logged (once per kind) and leave it pending: a kept namespace is never an error."""
        try:
            return await self._check(name)
        except (ApiError, UpstreamUnavailable) as e:
            if self._failing != type(e).__name__:
                self._failing = type(e).__name__
                hint = ""
                if isinstance(e, ApiForbidden):
                    # the chart grants this only with namespaceCleanup.enabled (broad list)
                    hint = (
                        " (needs list on every namespaced resource and delete on namespaces; "
                        "emptied namespaces are kept, and this is not logged again)"
                    )
                log.warning("cannot check whether namespace %s is empty: %s%s", name, e, hint)
            self.pending[name] = f"check failed: {e}"
            return False

    async def _check(self, name: str) -> bool:
        url = NAMESPACES.item(self._base, None, name)
        ns = await self._client.get(url)
        if ns is None:
            self.pending.pop(name, None)
            return True
        meta = ns.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            self.pending.pop(name, None)
            return True
        if not namespace_is_ours(ns, prefix=self._prefix):
            self.pending.pop(name, None)
            return False
        now = self._clock.monotonic()
        if now - self._types_at >= DISCOVERY_TTL or not self._types:
            self._types = await namespaced_types(self._client, self._base)
            self._types_at = now
        left = leftovers(
            {
                (t.group, t.resource): await list_all(
                    self._client, t.collection(self._base, name), []
                )
                for t in self._types
            }
        )
        # only a check that listed resets the once-only warning: a namespace found gone or
        # foreign without listing proves nothing about the permissions
        self._failing = None
        if left:
            shown = ", ".join(left[:5]) + (", …" if len(left) > 5 else "")
            if self.pending.get(name) != shown:
                log.info("downstream namespace %s kept: it holds %s", name, shown)
            self.pending[name] = shown
            return False
        with contextlib.suppress(ApiNotFound, ApiConflict):  # gone, or replaced (uid)
            await self._client.delete(url, uid=str(meta.get("uid") or "") or None)
        self.pending.pop(name, None)
        self._on_delete(name)
        log.info("deleted downstream namespace %s: nothing left in it", name)
        return True

    def forget(self, name: str) -> None:
        """``name`` is in use again."""
        self.pending.pop(name, None)
