"""The upstream endpoint URLs of a syncer: given, or read from an endpoint slice.

kcp publishes an APIExport's virtual-workspace URLs in its APIExportEndpointSlice, one per shard,
and a shard's URL appears only while a binding exists on that shard (FIELD-NOTES); vwserver's
FilteredAPIExportEndpointSlice lists the filtered URLs the same way (``status.endpoints[].url``).
The MongoDB example used only the first URL and so missed every other shard; the syncer uses all
of them and re-reads the slice periodically, because the set changes as bindings come and go.
"""

from __future__ import annotations

from typing import Any

from vwserver.k8s.client import KubeClient
from vwserver.k8s.resources import ResourceType
from vwserver.syncer.config import EndpointSliceRef

SLICE_TYPES = {
    "APIExportEndpointSlice": ResourceType(
        "apis.kcp.io", "v1alpha1", "apiexportendpointslices", "APIExportEndpointSlice"
    ),
    "FilteredAPIExportEndpointSlice": ResourceType(
        "sync.edge-connect.eu",
        "v1alpha1",
        "filteredapiexportendpointslices",
        "FilteredAPIExportEndpointSlice",
    ),
}


def endpoint_urls(slice_obj: dict[str, Any]) -> list[str]:
    """Every distinct ``status.endpoints[].url`` of a slice, in order, without trailing ``/``."""
    urls: list[str] = []
    for endpoint in (slice_obj.get("status") or {}).get("endpoints") or []:
        url = str((endpoint or {}).get("url") or "").rstrip("/")
        if url and url not in urls:
            urls.append(url)
    return urls


def shard_base(server: str) -> str:
    """A kubeconfig server URL without any ``/clusters/<workspace>`` suffix."""
    head, sep, _ = server.partition("/clusters/")
    return head.rstrip("/") if sep else server.rstrip("/")


def slice_url(server: str, ref: EndpointSliceRef) -> str:
    workspace_base = f"{shard_base(server)}/clusters/{ref.workspace}"
    return SLICE_TYPES[ref.kind].item(workspace_base, None, ref.name)


async def read_endpoints(client: KubeClient, *, server: str, ref: EndpointSliceRef) -> list[str]:
    """The slice's endpoint URLs; a missing slice has none. Raises ApiError/UpstreamUnavailable
    when it cannot be read."""
    obj = await client.get(slice_url(server, ref))
    return [] if obj is None else endpoint_urls(obj)
