"""kcp's API as vwserver uses it: its resource types, the logical-cluster annotation, its URLs.

Every kcp URL vwserver requests is built here; nothing else concatenates ``/clusters/`` or
``/services/apiexport/``::

    <server>/clusters/<workspace>                           a workspace, by path or logical cluster
    <shard>/services/apiexport/<export cluster>/<export>    an APIExport's virtual workspace
    <virtual workspace>/clusters/<cluster | *>              one consumer cluster in it, or all
    <vwserver>/services/filtered-apiexport/<slice cluster>/<slice>[/shards/<id>]
                                                            a slice's endpoint (vwserver's own)

A kubeconfig's server URL may already name a workspace (``https://kcp/clusters/root:org``);
:func:`workspace` replaces that part, it never appends to it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from vwserver.k8s.resources import ResourceType

CLUSTER_ANNOTATION: Final = "kcp.io/cluster"
"""Set by kcp on every object to its logical cluster; clients cannot choose it."""
ORIGINAL_API_VERSION_ANNOTATION: Final = "kcp.io/original-api-version"
"""Added by kcp when it answers an object as ``PartialObjectMetadata``: the object's own
apiVersion (observed on kcp v0.32 through the APIExport virtual workspace)."""

APIS_GROUP: Final = "apis.kcp.io"
APIEXPORTS: Final = ResourceType(APIS_GROUP, "v1alpha2", "apiexports", "APIExport")
APIEXPORT_ENDPOINT_SLICES: Final = ResourceType(
    APIS_GROUP, "v1alpha1", "apiexportendpointslices", "APIExportEndpointSlice"
)
APIBINDINGS: Final = ResourceType(APIS_GROUP, "v1alpha2", "apibindings", "APIBinding")
LOGICAL_CLUSTERS: Final = ResourceType(
    "core.kcp.io", "v1alpha1", "logicalclusters", "LogicalCluster"
)
"""Every workspace has exactly one, named :data:`LOGICAL_CLUSTER_NAME`; its
:data:`CLUSTER_ANNOTATION` is the workspace's logical-cluster ID."""
LOGICAL_CLUSTER_NAME: Final = "cluster"

SLICES: Final = ResourceType(
    "sync.edge-connect.eu",
    "v1alpha1",
    "filteredapiexportendpointslices",
    "FilteredAPIExportEndpointSlice",
)
"""vwserver's own API in kcp (``manifests/kcp/apiexport.yaml``)."""
SLICE_ENDPOINT_PREFIX: Final = "/services/filtered-apiexport"
"""Where vwserver serves a slice: ``<prefix>/<slice cluster>/<slice name>``."""


def logical_cluster(obj: Mapping[str, Any]) -> str:
    """An object's logical cluster (its :data:`CLUSTER_ANNOTATION`), or ``""``."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(CLUSTER_ANNOTATION) or "")


def origin(server: str) -> str:
    """``scheme://host:port`` of a server URL, whatever path follows."""
    scheme, _, rest = server.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def server_base(server: str) -> str:
    """A server URL without the ``/clusters/<workspace>`` it may end in."""
    head, found, _ = server.partition("/clusters/")
    return head.rstrip("/") if found else server.rstrip("/")


def workspace(name: str, *, server: str = "") -> str:
    """``<server>/clusters/<name>``; without ``server`` the path alone (which
    :class:`~vwserver.k8s.client.KubeClient` requests on its own server)."""
    return f"{server_base(server)}/clusters/{name}"


def export_virtual_workspace(server: str, *, cluster: str, name: str) -> str:
    """The virtual-workspace URL of APIExport ``name`` in logical cluster ``cluster`` on the
    shard that ``server`` names (kcp publishes the real ones in the APIExportEndpointSlice)."""
    return f"{origin(server)}/services/apiexport/{cluster}/{name}"


def clusters(virtual_workspace: str, cluster: str = "*") -> str:
    """Inside a virtual workspace: one consumer's logical cluster, or ``*`` for all of them."""
    return f"{virtual_workspace.rstrip('/')}/clusters/{cluster}"


def endpoint_urls(endpoint_slice: Mapping[str, Any] | None) -> list[str]:
    """Every distinct ``status.endpoints[].url`` of an (Filtered)APIExportEndpointSlice, in
    order, without a trailing ``/``: one per shard that serves the export."""
    urls: list[str] = []
    for endpoint in ((endpoint_slice or {}).get("status") or {}).get("endpoints") or []:
        url = str((endpoint or {}).get("url") or "").rstrip("/")
        if url and url not in urls:
            urls.append(url)
    return urls


def shard_id(url: str) -> str:
    """A short stable name for an upstream shard endpoint, used in multi-shard endpoint URLs."""
    return hashlib.sha256(url.encode()).hexdigest()[:10]


def slice_endpoint_urls(
    *, external_url: str, cluster: str, name: str, upstreams: Sequence[str]
) -> list[str]:
    """A slice's public URLs: one per upstream shard endpoint.

    With one shard (the common case) the URL is just ``<external>/services/filtered-apiexport/
    <cluster>/<name>``. With several, each gets a ``/shards/<id>`` suffix so that a client is
    pinned to one shard's virtual workspace, like kcp's own per-shard endpoint URLs.
    """
    base = f"{external_url.rstrip('/')}{SLICE_ENDPOINT_PREFIX}/{cluster}/{name}"
    if len(upstreams) <= 1:
        return [base] if upstreams else []
    return [f"{base}/shards/{shard_id(u)}" for u in upstreams]


def export_claims(
    export: Mapping[str, Any],
) -> tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]]]:
    """(group, resource) of an APIExport's (``v1alpha2``) ``spec.permissionClaims[]`` and of its
    own ``spec.resources[]`` (``{group, name}``): what a slice's related-resource rules may
    name. Whether a consumer accepted a claim is its APIBinding's business — kcp's virtual
    workspace serves only the accepted ones there."""
    spec = export.get("spec") or {}
    claimed = frozenset(
        (str(c.get("group") or ""), str(c.get("resource") or ""))
        for c in spec.get("permissionClaims") or []
        if isinstance(c, Mapping) and c.get("resource")
    )
    exported = frozenset(
        (str(r.get("group") or ""), str(r.get("name") or ""))
        for r in spec.get("resources") or []
        if isinstance(r, Mapping) and r.get("name")
    )
    return claimed, exported
