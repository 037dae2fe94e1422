"""The YAML configuration file of ``vwserver sync``.

Read like every vwserver config file (:mod:`vwserver.config.base`): msgspec Structs with unknown
keys refused, then checks for what types cannot say. Every problem is one
:class:`~vwserver.errors.ConfigError` naming the field (``$.resources[0].statusExclude[1]: ...``),
raised before anything starts. kcp and the downstream cluster are each reached with a kubeconfig
or, for a syncer running as a Deployment in its downstream cluster, ``inCluster: true`` (the
pod's ServiceAccount).

Two connections lead upstream, because the endpoint URLs need not be kcp's: with a
FilteredAPIExportEndpointSlice the slice is read from kcp (``upstream``), but its URLs are
vwserver's, with their own server certificate (another CA) and possibly another identity. The
optional ``endpoints`` section is the connection for every call to an endpoint URL; without it
the endpoint URLs are called with ``upstream``'s connection, as kcp's own
APIExportEndpointSlice URLs are served by kcp.

Example (``config/syncer.example.yaml`` is the annotated version)::

    name: eu
    upstream:
      kubeconfig: kcp.kubeconfig
      endpointSlice: {kind: FilteredAPIExportEndpointSlice, workspace: root:provider, name: eu}
    endpoints:
      caFile: vwserver-ca.crt     # vwserver's CA; credentials: upstream's (the kcp identity)
    downstream:
      kubeconfig: cluster.kubeconfig
    resources:
      - {group: mongodbcommunity.mongodb.com, version: v1, resource: mongodbcommunity,
         statusExclude: [mongoUri]}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import msgspec

from vwserver.config.base import (
    DNS_LABEL_RE,
    KIND_RE,
    OBJECT_NAME_RE,
    WORKSPACE_RE,
    ClusterAccess,
    CommandConfig,
    check_access,
    check_logging,
    convert,
    read_yaml,
    require_file,
)
from vwserver.config.base import Strict as _Strict
from vwserver.errors import ConfigError
from vwserver.syncer import naming, related_spec

# The syncer's name goes into the finalizer ``sync.edge-connect.eu/syncer-<name>`` (the part after
# the slash of a qualified name is at most 63 characters), a label value and the Lease name.
SYNCER_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,54}[a-z0-9])?$")
# A status path: dot-separated JSON keys under ``status`` (``mongoUri``, ``connection.secret``).
STATUS_PATH_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


class EndpointSliceRef(_Strict):
    """Where to read the upstream URLs from: kcp's APIExportEndpointSlice (``apis.kcp.io``) or
    vwserver's FilteredAPIExportEndpointSlice (``sync.edge-connect.eu``). Every URL in its
    ``status.endpoints`` is used (one per shard)."""

    kind: Literal["APIExportEndpointSlice", "FilteredAPIExportEndpointSlice"]
    """kcp's own endpoint slice, or vwserver's filtered one."""
    workspace: str
    """The endpoint slice's workspace (path or logical-cluster ID)."""
    name: str
    """The endpoint slice's name."""


class Upstream(ClusterAccess):
    """kcp: credentials from a kubeconfig (or ``inCluster``), endpoint URLs given or read from
    an endpoint slice."""

    urls: list[str] = msgspec.field(default_factory=list)
    """Endpoint URLs given explicitly (one per shard), instead of ``endpointSlice``."""
    endpoint_slice: EndpointSliceRef | None = None
    """Read the endpoint URLs from this endpoint slice's ``status.endpoints``."""
    refresh_seconds: float = 30.0
    """How often the endpoint slice is re-read (shards come and go with bindings)."""


class Endpoints(ClusterAccess):
    """The connection to the endpoint URLs (``upstream.urls`` or the slice's), when it is not
    ``upstream``'s — e.g. vwserver's filtered endpoints, served with vwserver's certificate.

    Trust: ``caFile``, else the CA of ``kubeconfig``/``inCluster``, else the system's trust
    store — never ``upstream``'s CA (keeping the two apart is why this section exists).
    Credentials: ``kubeconfig`` (its user; its server is not used: the URLs name the server),
    ``inCluster`` (the ServiceAccount token), ``tokenFile`` or ``clientCertFile`` +
    ``clientKeyFile``; with none of them, ``upstream``'s credentials (vwserver authenticates its
    callers with kcp, so the kcp identity is the usual one).
    """

    ca_file: str | None = msgspec.field(default=None, name="caFile")
    """The CA of the endpoints' serving certificate (e.g. vwserver's)."""
    token_file: str | None = None
    """A file holding the bearer token for the endpoints, re-read as it rotates."""
    client_cert_file: str | None = None
    """A client certificate for the endpoints (with ``clientKeyFile``)."""
    client_key_file: str | None = None
    """The client certificate's key."""

    @property
    def own_credentials(self) -> bool:
        """Whether this section names its own identity (else: upstream's)."""
        return (
            self.kubeconfig is not None
            or self.in_cluster
            or self.token_file is not None
            or self.client_cert_file is not None
        )


class Downstream(ClusterAccess):
    """The downstream cluster: a kubeconfig, or ``inCluster: true`` when the syncer runs there."""


class DownstreamType(_Strict):
    """The downstream resource an upstream resource is synced into (default: the same type)."""

    group: str
    """The downstream API group."""
    version: str
    """The downstream API version."""
    resource: str
    """The downstream resource (plural)."""
    kind: str
    """The downstream kind."""


class RelatedReference(_Strict):
    """Related objects named at a path of the primary object."""

    path: str
    """Field names separated by ``.``, ``[*]`` after a list field
    (``spec.users[*].passwordSecretRef.name``), as a slice's ``referencedBy.path``: every string
    there that is an object name names one related object (0 to 64 of them)."""


class RelatedConfig(_Strict, kw_only=True):
    """An object of another resource that belongs to each synced (primary) object: a Secret or
    ConfigMap it names, or one its downstream operator writes. Found in the primary's namespace
    on the *origin* side and copied into the primary's namespace on the other side (docs:
    Related resources, "In the syncer")."""

    name: str
    """A DNS label, unique within this resource: names the related resource in conditions,
    labels and metrics."""
    origin: Literal["kcp", "downstream"]
    """``kcp``: the related object is in the consumer's workspace and copied down (before the
    primary's copy is applied); ``downstream``: the downstream side writes it (e.g. the
    operator's connection-string Secret) and it is copied up into the consumer's namespace,
    written through the endpoint."""
    group: str = ""
    """The related resource's API group (``""``: core)."""
    version: str
    """Its version."""
    resource: str
    """Its resource name (plural), e.g. ``secrets``."""
    kind: str
    """Its kind, e.g. ``Secret``."""
    reference: RelatedReference | None = None
    """Found by name at a path of the primary (on the origin side: the kcp object for origin
    ``kcp``, its downstream copy for origin ``downstream``). Exactly one of ``reference``,
    ``selector`` and ``nameTemplate``."""
    selector: dict[str, Any] | None = None
    """Found by labels: a ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions``,
    not empty) over the objects of the primary's namespace on the origin side."""
    name_template: str | None = None
    """Found by a name built from the primary: text with placeholders ``{{ .path }}``, paths
    into the primary (``{{ .name }}``/``{{ .namespace }}`` are ``metadata.name``/``namespace``);
    placeholders with ``[*]`` give one name per element of that list (all of them must iterate
    the same list). A path that is not there gives no name."""
    target_name: str | None = None
    """The copy's name, a template over the related object (``{{ .name }}`` is its name);
    default: the same name."""
    keys: list[str] = msgspec.field(default_factory=list)
    """The data keys copied (Secret ``data``, ConfigMap ``data``/``binaryData``); empty: all."""


class ResourceConfig(_Strict):
    """One synced resource type. Upstream objects must be namespaced."""

    group: str
    """The API group of the resource in kcp."""
    version: str
    """Its version."""
    resource: str
    """Its resource name (plural)."""
    kind: str
    """Its kind."""
    downstream: DownstreamType | None = None
    """The downstream type it is synced into (default: the same)."""
    status_exclude: list[str] = msgspec.field(default_factory=list)
    """Paths under ``status`` of the downstream object that never go up to kcp (e.g. internal
    connection strings), dot-separated (``connection.secret``)."""
    metadata_exclude: list[str] = msgspec.field(default_factory=list)
    """Label/annotation key prefixes of this resource that the downstream side writes (its
    operator's own keys, e.g. ``mongodb.com/``): never copied, whatever the consumer sets. (Keys
    another field manager owns on the downstream copy are left to it anyway.)"""
    max_object_bytes: int = 262144
    """Objects larger than this (bytes of JSON, as kcp sends them) are not synced: only their
    metadata is kept in memory, and they show ``Synced=False``, reason ``ObjectTooLarge``
    (1024 to 3145728). Related objects too: one over it is not copied, and the objects
    naming it show ``Synced=False``, ``ObjectTooLarge``."""
    max_cluster_bytes: int = 33554432
    """The objects of one consumer workspace kept in full add up to at most this (bytes of
    JSON) — one budget for this resource's objects and all their related objects; further ones
    are not synced (or copied): ``Synced=False``, reason ``ObjectTooLarge`` (at least
    ``maxObjectBytes``)."""
    related: list[RelatedConfig] = msgspec.field(default_factory=list)
    """Related objects of each object of this resource (Secrets, ConfigMaps, ...), copied down
    or up with it (at most 8). Related objects in kcp are read through the endpoint only: a
    filtered endpoint must show them (the slice's ``spec.relatedResources``)."""

    @property
    def target(self) -> DownstreamType:
        return self.downstream or DownstreamType(
            group=self.group, version=self.version, resource=self.resource, kind=self.kind
        )


class LeaderElection(_Strict):
    """A ``coordination.k8s.io/v1`` Lease in the downstream cluster (client-go semantics)."""

    enabled: bool = True
    """Elect a leader (``false``: this process syncs alone)."""
    namespace: str = "vwserver-syncer"
    """The Lease's namespace in the downstream cluster."""
    lease_name: str | None = None
    """The Lease's name (default: ``vwserver-syncer-<name>``)."""
    lease_duration_seconds: float = 15.0
    """How long a Lease is valid without renewal (client-go's ``LeaseDuration``)."""
    renew_deadline_seconds: float = 10.0
    """How long the leader keeps trying to renew before it gives up leading."""
    retry_period_seconds: float = 2.0
    """How often acquiring or renewing is tried."""


class Health(_Strict):
    """``/healthz``, ``/readyz`` and ``/metrics``; port 0 picks a free port."""

    enabled: bool = True
    """Serve the health endpoints and metrics."""
    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 8081
    """Port to bind (0: a free port)."""


class SyncerConfig(CommandConfig, kw_only=True):
    name: str
    """This syncer's name: in its finalizer ``sync.edge-connect.eu/syncer-<name>``, its owner
    label and its Lease (lowercase alphanumerics and ``-``, at most 56 characters)."""
    upstream: Upstream
    """kcp, and where the endpoint URLs come from."""
    downstream: Downstream
    """The downstream cluster."""
    endpoints: Endpoints | None = None
    """The connection to the endpoint URLs, when it is not ``upstream``'s (see the section)."""
    resources: list[ResourceConfig]
    """The synced resource types."""
    namespace_prefix: str = "kcp-"
    """Readable start of every downstream namespace name (the rest is derived from the
    source)."""
    exclude_metadata_prefixes: list[str] = msgspec.field(default_factory=list)
    """Label/annotation key prefixes never copied downstream, on top of kcp's own
    (``kcp.io/*``, ...)."""
    workers: int = 4
    """Objects synced at once."""
    resync_seconds: float = 300.0
    """Every object is re-checked this often; the sweep of orphaned downstream objects runs
    then."""
    leader_election: LeaderElection = msgspec.field(default_factory=LeaderElection)
    """Leader election in the downstream cluster."""
    health: Health = msgspec.field(default_factory=Health)
    """The health listener."""

    @property
    def finalizer(self) -> str:
        return naming.finalizer(self.name)

    @property
    def field_manager(self) -> str:
        return naming.field_manager(self.name)

    @property
    def lease_name(self) -> str:
        return self.leader_election.lease_name or f"vwserver-syncer-{self.name}"


def load_syncer_config(path: Path) -> SyncerConfig:
    """Read, decode and validate a syncer config file. Raises :class:`ConfigError`."""
    return parse_syncer_config(read_yaml(path), base_dir=path.parent)


def parse_syncer_config(raw: object, *, base_dir: Path) -> SyncerConfig:
    config = convert(raw, SyncerConfig)
    _validate(config, base_dir=base_dir)
    return config


def _validate(config: SyncerConfig, *, base_dir: Path) -> None:
    if not SYNCER_NAME_RE.match(config.name):
        raise ConfigError("$.name", f"{config.name!r} is not a DNS label of at most 56 characters")
    up = config.upstream
    check_access(up, field="$.upstream", base=base_dir)
    check_access(config.downstream, field="$.downstream", base=base_dir)
    if bool(up.urls) == (up.endpoint_slice is not None):
        raise ConfigError("$.upstream", "set exactly one of urls and endpointSlice")
    for i, url in enumerate(up.urls):
        if not url.startswith(("https://", "http://")):
            raise ConfigError(f"$.upstream.urls[{i}]", f"{url!r} is not an http(s) URL")
        if "/clusters/" in url:
            raise ConfigError(
                f"$.upstream.urls[{i}]",
                "give the endpoint URL without /clusters/...: the syncer adds clusters/* itself",
            )
    if (ref := up.endpoint_slice) is not None:
        if not WORKSPACE_RE.match(ref.workspace):
            raise ConfigError(
                "$.upstream.endpointSlice.workspace",
                f"{ref.workspace!r} is neither a workspace path nor a logical-cluster ID",
            )
        if not OBJECT_NAME_RE.match(ref.name):
            raise ConfigError("$.upstream.endpointSlice.name", f"{ref.name!r} is not a name")
    if config.endpoints is not None:
        _check_endpoints(config.endpoints, base_dir=base_dir)
    if up.refresh_seconds <= 0:
        raise ConfigError("$.upstream.refreshSeconds", "must be positive")
    if not config.resources:
        raise ConfigError("$.resources", "at least one resource is required")
    seen: set[tuple[str, str]] = set()
    for i, res in enumerate(config.resources):
        field = f"$.resources[{i}]"
        _check_type(res.group, res.version, res.resource, res.kind, field=field)
        if res.downstream is not None:
            d = res.downstream
            _check_type(d.group, d.version, d.resource, d.kind, field=f"{field}.downstream")
        if (res.group, res.resource) in seen:
            raise ConfigError(field, f"duplicate resource {res.resource}.{res.group}")
        seen.add((res.group, res.resource))
        for j, path in enumerate(res.status_exclude):
            if not STATUS_PATH_RE.match(path):
                raise ConfigError(
                    f"{field}.statusExclude[{j}]",
                    f"{path!r} is not a dotted path under status (e.g. mongoUri or a.b)",
                )
        for j, key in enumerate(res.metadata_exclude):
            if not key:
                raise ConfigError(f"{field}.metadataExclude[{j}]", "must not be empty")
        # kcp refuses objects over 1.5 MiB (etcd's request limit); 1 KiB holds no real object
        if not 1024 <= res.max_object_bytes <= 3 * 1024 * 1024:
            raise ConfigError(f"{field}.maxObjectBytes", "must be between 1024 and 3145728")
        if res.max_cluster_bytes < res.max_object_bytes:
            raise ConfigError(f"{field}.maxClusterBytes", "must be at least maxObjectBytes")
        _check_related(res, config.resources, field=field)
    prefix = config.namespace_prefix
    if prefix and not re.fullmatch(r"[a-z0-9][-a-z0-9]{0,19}", prefix):
        raise ConfigError(
            "$.namespacePrefix", f"{prefix!r}: at most 20 of a-z, 0-9, '-', starting alphanumeric"
        )
    if config.workers < 1:
        raise ConfigError("$.workers", "must be at least 1")
    if config.resync_seconds <= 0:
        raise ConfigError("$.resyncSeconds", "must be positive")
    le = config.leader_election
    if not DNS_LABEL_RE.match(le.namespace):
        raise ConfigError("$.leaderElection.namespace", f"{le.namespace!r} is not a namespace")
    if le.lease_name is not None and not OBJECT_NAME_RE.match(le.lease_name):
        raise ConfigError("$.leaderElection.leaseName", f"{le.lease_name!r} is not a name")
    # client-go's rules: the holder renews well before others may take over.
    if not 0 < le.retry_period_seconds < le.renew_deadline_seconds < le.lease_duration_seconds:
        raise ConfigError(
            "$.leaderElection",
            "need 0 < retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds",
        )
    if not 0 <= config.health.port < 65536:
        raise ConfigError("$.health.port", f"{config.health.port} is not a TCP port")
    check_logging(config)


MAX_RELATED = 8


def _check_related(res: ResourceConfig, resources: list[ResourceConfig], *, field: str) -> None:
    if len(res.related) > MAX_RELATED:
        raise ConfigError(f"{field}.related", f"at most {MAX_RELATED} related resources")
    primaries = {(r.group, r.resource) for r in resources} | {
        (r.target.group, r.target.resource) for r in resources
    }
    names: set[str] = set()
    for j, rel in enumerate(res.related):
        here = f"{field}.related[{j}]"
        if not DNS_LABEL_RE.match(rel.name) or len(rel.name) > 40:
            raise ConfigError(f"{here}.name", f"{rel.name!r} is not a DNS label of at most 40")
        if rel.name in names:
            raise ConfigError(f"{here}.name", f"duplicate related name {rel.name!r}")
        names.add(rel.name)
        _check_type(rel.group, rel.version, rel.resource, rel.kind, field=here)
        if (rel.group, rel.resource) in primaries:
            raise ConfigError(
                f"{here}.resource", "a synced resource cannot be a related resource as well"
            )
        # compiles the finder and the target template: every error names its field
        related_spec.compile_related(rel, field=here)
        for k, key in enumerate(rel.keys):
            if not key or len(key) > 253:
                raise ConfigError(f"{here}.keys[{k}]", "must be a data key (1 to 253 chars)")


def _check_endpoints(ep: Endpoints, *, base_dir: Path) -> None:
    field = "$.endpoints"
    ways = [
        name
        for name, set_ in (
            ("kubeconfig", ep.kubeconfig is not None),
            ("inCluster", ep.in_cluster),
            ("tokenFile", ep.token_file is not None),
            ("clientCertFile", ep.client_cert_file is not None),
        )
        if set_
    ]
    if len(ways) > 1:
        raise ConfigError(field, f"{' and '.join(ways)} are mutually exclusive (one identity)")
    if ep.context is not None and ep.kubeconfig is None:
        raise ConfigError(f"{field}.context", "only meaningful with kubeconfig")
    if (ep.client_cert_file is None) != (ep.client_key_file is None):
        raise ConfigError(field, "clientCertFile and clientKeyFile go together")
    if not ep.own_credentials and ep.ca_file is None:
        raise ConfigError(
            field,
            "names neither a CA (caFile) nor credentials (kubeconfig, inCluster, tokenFile, "
            "clientCertFile): leave it out to use upstream's connection",
        )
    for name, value in (
        ("kubeconfig", ep.kubeconfig),
        ("caFile", ep.ca_file),
        ("tokenFile", ep.token_file),
        ("clientCertFile", ep.client_cert_file),
        ("clientKeyFile", ep.client_key_file),
    ):
        if value is not None:
            require_file(value, field=f"{field}.{name}", base=base_dir)


def _check_type(group: str, version: str, resource: str, kind: str, *, field: str) -> None:
    # The core group ("") is allowed; any other group is a DNS subdomain.
    if group and not OBJECT_NAME_RE.match(group):
        raise ConfigError(f"{field}.group", f"{group!r} is not an API group")
    if not DNS_LABEL_RE.match(version):
        raise ConfigError(f"{field}.version", f"{version!r} is not an API version")
    if not DNS_LABEL_RE.match(resource):
        raise ConfigError(f"{field}.resource", f"{resource!r} is not a resource (plural) name")
    if not KIND_RE.match(kind):
        raise ConfigError(f"{field}.kind", f"{kind!r} is not a kind (CamelCase)")
