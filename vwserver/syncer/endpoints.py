"""The upstream endpoint URLs of a syncer: given, or read from an endpoint slice.

kcp publishes an APIExport's virtual-workspace URLs in its APIExportEndpointSlice, one per shard,
and a shard's URL appears only while a binding exists on that shard (FIELD-NOTES); vwserver's
FilteredAPIExportEndpointSlice lists the filtered URLs the same way (``status.endpoints[].url``).
The MongoDB example used only the first URL and so missed every other shard; the syncer uses all
of them and re-reads the slice periodically, because the set changes as bindings come and go.
"""

from __future__ import annotations

from vwserver.k8s import kcp
from vwserver.k8s.client import KubeClient
from vwserver.syncer.config import EndpointSliceRef

SLICE_TYPES = {t.kind: t for t in (kcp.APIEXPORT_ENDPOINT_SLICES, kcp.SLICES)}


def slice_url(server: str, ref: EndpointSliceRef) -> str:
    """The endpoint slice's URL, in its workspace on the server of the upstream kubeconfig."""
    return SLICE_TYPES[ref.kind].item(kcp.workspace(ref.workspace, server=server), None, ref.name)


async def read_endpoints(client: KubeClient, *, server: str, ref: EndpointSliceRef) -> list[str]:
    """The slice's endpoint URLs; a missing slice has none. Raises ApiError/UpstreamUnavailable
    when it cannot be read."""
    return kcp.endpoint_urls(await client.get(slice_url(server, ref)))
