"""The upstream endpoint URLs of a syncer — given, or read from an endpoint slice — and the
connection they are called with.

kcp publishes an APIExport's virtual-workspace URLs in its APIExportEndpointSlice, one per shard,
and a shard's URL appears only while a binding exists on that shard (FIELD-NOTES); vwserver's
FilteredAPIExportEndpointSlice lists the filtered URLs the same way (``status.endpoints[].url``).
The MongoDB example used only the first URL and so missed every other shard; the syncer uses all
of them and re-reads the slice periodically, because the set changes as bindings come and go.

The slice is read from kcp with ``upstream``'s connection; the URLs it lists are called with the
``endpoints`` connection when the config has one (:func:`endpoints_auth`): vwserver's endpoints
have their own server certificate, signed by another CA than kcp's, and may want another
identity. Before, one kubeconfig served both and only a CA file with both CAs concatenated
worked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vwserver.config.base import client_auth, resolve
from vwserver.errors import ConfigError
from vwserver.k8s import kcp
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import SERVICE_ACCOUNT_DIR, ClientAuth
from vwserver.syncer.config import Endpoints, EndpointSliceRef

SLICE_TYPES = {t.kind: t for t in (kcp.APIEXPORT_ENDPOINT_SLICES, kcp.SLICES)}

ENDPOINTS_SERVER = "https://endpoints.invalid"
"""The ``server`` of the endpoints' :class:`ClientAuth`. Endpoint URLs are absolute, so the
client never addresses it; being https it makes :meth:`ClientAuth.ssl_context` build a verifying
context for every https endpoint URL (an http URL ignores it)."""


def slice_url(server: str, ref: EndpointSliceRef) -> str:
    """The endpoint slice's URL, in its workspace on the server of the upstream kubeconfig."""
    return SLICE_TYPES[ref.kind].item(kcp.workspace(ref.workspace, server=server), None, ref.name)


async def read_endpoints(client: KubeClient, *, server: str, ref: EndpointSliceRef) -> list[str]:
    """The slice's endpoint URLs; a missing slice has none. Raises ApiError/UpstreamUnavailable
    when it cannot be read."""
    return kcp.endpoint_urls(await client.get(slice_url(server, ref)))


async def endpoints_auth(
    section: Endpoints,
    *,
    upstream: ClientAuth,
    base: Path,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> ClientAuth:
    """The connection for the endpoint URLs that ``section`` describes (rules in
    :class:`~vwserver.syncer.config.Endpoints`): its own trust — never ``upstream``'s CA — and
    its own identity, or ``upstream``'s. Raises :class:`ConfigError` naming the field."""
    field = "$.endpoints"
    ca_pem: str | None = None
    if section.ca_file is not None:
        ca_pem = _read(section.ca_file, field=f"{field}.caFile", base=base)
    if section.kubeconfig is not None or section.in_cluster:
        own = await client_auth(
            section, field=field, base=base, service_account_dir=service_account_dir
        )
        return dataclasses.replace(own, server=ENDPOINTS_SERVER, ca_pem=ca_pem or own.ca_pem)
    if section.token_file is not None:
        identity = ClientAuth(
            server=ENDPOINTS_SERVER, token_file=resolve(section.token_file, base=base)
        )
    elif section.client_cert_file is not None and section.client_key_file is not None:
        identity = ClientAuth(
            server=ENDPOINTS_SERVER,
            client_cert_pem=_read(
                section.client_cert_file, field=f"{field}.clientCertFile", base=base
            ),
            client_key_pem=_read(
                section.client_key_file, field=f"{field}.clientKeyFile", base=base
            ),
        )
    else:  # upstream's identity (token, token file, plugin or client certificate)
        identity = dataclasses.replace(upstream, server=ENDPOINTS_SERVER, ca_pem=None)
    return dataclasses.replace(identity, ca_pem=ca_pem, insecure_skip_tls_verify=False)


def _read(value: str, *, field: str, base: Path) -> str:
    path = resolve(value, base=base)
    try:
        return path.read_text()
    except OSError as e:
        raise ConfigError(field, f"cannot read {path}: {e.strerror}") from e
