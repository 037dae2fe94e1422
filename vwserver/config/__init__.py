"""The YAML configuration file of ``vwserver serve``.

Read like every vwserver config file (:mod:`vwserver.config.base`): decoded into msgspec Structs,
so a wrong type or an unknown key is reported with the exact path of the field
(``$.slices[1].selector``), then checked for what types cannot say (selectors parse, URLs are
https, files exist). Every problem is a :class:`ConfigError` naming the field; nothing is
half-applied. This package depends on nothing above it (the import contracts in
``tests/unit/test_import_contracts.py``): the defaults it shares live in the base.

Example (``config/example.yaml`` is the annotated version)::

    listen: {host: 0.0.0.0, port: 8443}
    externalURL: https://vwserver.example.com
    upstream:
      kubeconfig: /etc/vwserver/kcp.kubeconfig
    slices:
      - cluster: 2fx3m0rnxzbs8mq9
        name: prod-widgets
        export: {cluster: 1a2b3c4d5e6f7g8h, name: widgets.example.io}
        selector: {matchLabels: {env: prod}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from vwserver.config import base
from vwserver.config.base import (
    DNS_LABEL_RE,
    LOGICAL_CLUSTER_RE,
    OBJECT_NAME_RE,
    WORKSPACE_RE,
    ClusterAccess,
    CommandConfig,
    camel,
    convert,
    read_yaml,
    require_file,
    resolve,
)
from vwserver.config.base import Strict as _Strict
from vwserver.errors import ConfigError, SelectorError
from vwserver.health import HEALTH_PATHS
from vwserver.holds import DEFAULT_HOLD_TIMEOUT_SECONDS, MAX_HOLD_TIMEOUT_SECONDS
from vwserver.k8s.kcp import SLICE_ENDPOINT_PREFIX, SLICES
from vwserver.selector import Selector

__all__ = [
    "DEFAULT_LEASE_NAME",
    "LOGICAL_CLUSTER_RE",
    "OBJECT_NAME_RE",
    "WORKSPACE_RE",
    "Config",
    "convert",
    "load_config",
    "parse_config",
    "read_yaml",
    "resolve",
    "slice_selector",
]

PREFIX = SLICE_ENDPOINT_PREFIX + "/"
DEFAULT_LEASE_NAME = "vwserver-controller"


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = 8443


class HealthListen(_Strict):
    """A second listener, plain HTTP: the health endpoints and metrics, and ``/debug/cache``
    when ``host`` is a loopback address (the slice listener never serves it)."""

    host: str = "127.0.0.1"
    port: int = 8081


class TLS(_Strict):
    # Reloaded when the files change (vwserver.auth.tls): rotation needs no restart.
    cert_file: str
    key_file: str
    # Client certificates signed by this CA authenticate (CN = user, O = groups); read at start.
    client_ca_file: str | None = msgspec.field(default=None, name="clientCAFile")


class AuthCache(_Strict):
    """How long kcp's review answers are reused, in seconds (0: not cached), and how many."""

    token_ttl_seconds: float = msgspec.field(default=base.DEFAULT_TOKEN_TTL, name="tokenTTLSeconds")
    token_negative_ttl_seconds: float = msgspec.field(
        default=base.DEFAULT_TOKEN_NEGATIVE_TTL, name="tokenNegativeTTLSeconds"
    )
    allow_ttl_seconds: float = msgspec.field(default=base.DEFAULT_ALLOW_TTL, name="allowTTLSeconds")
    deny_ttl_seconds: float = msgspec.field(default=base.DEFAULT_DENY_TTL, name="denyTTLSeconds")
    max_entries: int = base.DEFAULT_MAX_ENTRIES


class Auth(_Strict):
    """Who may use which slice (vwserver.auth.guard has the details of both modes)."""

    # delegated: vwserver checks the caller with kcp, then calls kcp as itself.
    # passthrough: the same checks, then the caller's own token goes to kcp.
    mode: Literal["delegated", "passthrough"] = "delegated"
    cache: AuthCache = msgspec.field(default_factory=AuthCache)


class Connections(_Strict):
    """Bounds on each client connection, against slow and greedy clients (vwserver.listener)."""

    # A request's headers must be complete this long after the connection (or the request's
    # first byte); the TLS handshake gets as long.
    header_timeout_seconds: float = base.DEFAULT_HEADER_TIMEOUT
    # A request body must be complete this long after its headers.
    body_timeout_seconds: float = base.DEFAULT_BODY_TIMEOUT
    # A keep-alive connection without a request is closed after this long.
    idle_timeout_seconds: float = base.DEFAULT_IDLE_TIMEOUT
    # Open connections per client IP address (each watch holds one); 0: no limit.
    max_connections_per_client: int = base.DEFAULT_MAX_CONNECTIONS_PER_CLIENT


class Upstream(ClusterAccess):
    """How vwserver reaches kcp: a kubeconfig, the pod's ServiceAccount (``inCluster``), or a
    server URL with explicit credentials."""

    server: str | None = None
    ca_file: str | None = None
    token: str | None = None
    token_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure_skip_tls_verify: bool = False


class ExportRef(_Strict):
    """The APIExport a slice filters: its logical cluster ID and name."""

    cluster: str
    name: str


class SliceConfig(_Strict):
    cluster: str
    name: str
    selector: dict[str, Any] | None = None
    # An empty selector would show every object of the export. That must be a visible decision,
    # never the accident of a forgotten field.
    allow_empty_selector: bool = False
    export: ExportRef | None = None
    # Full APIExport virtual-workspace URL; overrides ``export`` (e.g. a specific shard).
    upstream_url: str | None = msgspec.field(default=None, name="upstreamURL")
    # Serve this slice's LIST and WATCH from the shared watch cache (when ``cache.enabled``);
    # false: every request goes to kcp (the pass-through path).
    cache: bool = True
    # Seconds the slice may hold an object that is leaving it (a finalizer added through the
    # slice is still on it) before vwserver removes the slice's finalizers. Always bounded.
    hold_timeout_seconds: float = DEFAULT_HOLD_TIMEOUT_SECONDS


class ControllerExport(_Strict):
    """Where vwserver's own API (the FilteredAPIExportEndpointSlice APIExport) is exported."""

    path: str
    name: str = SLICES.group


class LeaseConfig(_Strict):
    workspace: str | None = None
    """Workspace of the Lease (default: the controller export's workspace)."""
    name: str = DEFAULT_LEASE_NAME
    """With ``controller.shards``, the default becomes ``vwserver-controller-<shards.name>``."""
    identity: str | None = None
    """This replica's identity (default: hostname + process id)."""


class ShardsConfig(_Strict):
    """The shards this replica serves: one vwserver Deployment per shard (or set of shards),
    each publishing and serving only its shards' endpoints of every slice (README, "Sharded
    kcp"). Without it a replica serves every shard."""

    name: str
    """The replica set's name, a DNS label: its field manager is ``vwserver-<name>``, its
    conditions are ``<name>/Ready`` etc. Every replica of one set has the same name, the same
    shards and the same ``externalURL`` (and a Lease of their own, ``lease.name``)."""
    virtual_workspace_urls: list[str] = msgspec.field(name="virtualWorkspaceURLs")
    """The shards' virtual-workspace base URLs (kcp's ``Shard.spec.virtualWorkspaceURL``)."""


class ControllerConfig(_Strict):
    """kcp mode: discover slices in kcp instead of (or besides) listing them here."""

    export: ControllerExport
    lease: LeaseConfig | None = None
    shards: ShardsConfig | None = None
    """Serve only these shards (one Deployment per shard); unset: every shard."""
    resync_seconds: float = 30.0
    # Work done for one workspace's slices is bounded (any workspace that binds vwserver's API
    # can create slices): beyond these, a slice is not looked at (Ready=False, TooManySlices /
    # TooManyExports) and costs nothing more.
    max_slices_per_workspace: int = 50
    max_exports_per_workspace: int = 20
    """Distinct ``spec.export`` references of one workspace's slices."""
    consent_reviews_per_second: float = 5.0
    """Per slice workspace: the rate of consent reviews (and workspace lookups) vwserver makes
    in kcp for slices naming another workspace's export."""


class CacheConfig(_Strict):
    """The shared watch cache: one upstream watch per resource, every slice's LIST and WATCH
    computed from it (README, "The shared watch cache")."""

    enabled: bool = True
    # A resource nobody read for this long stops its upstream watch and forgets its objects.
    idle_seconds: float = 300.0
    # Changes kept to serve watches and paged lists at an older resourceVersion; older ones
    # are answered 410 Expired, as the apiserver does beyond its watch cache.
    window: int = 4096


class MetricsConfig(_Strict):
    """Prometheus metrics, unauthenticated like the health endpoints (no tokens, no objects)."""

    enabled: bool = True
    path: str = "/metrics"


MAX_WORKERS = 64
"""More processes than this on one socket is a configuration mistake, not a deployment."""


class Config(CommandConfig):
    listen: Listen = msgspec.field(default_factory=Listen)
    # Processes serving the listen socket (SO_REUSEPORT), each one core (vwserver.workers);
    # ``vwserver serve --workers N`` overrides it. 1: one process, as without the key.
    workers: int = 1
    health: HealthListen | None = None
    connections: Connections = msgspec.field(default_factory=Connections)
    tls: TLS | None = None
    # Plain HTTP without TLS. For local development only; `serve` refuses to start without TLS
    # unless this is set.
    insecure_serving: bool = False
    external_url: str | None = msgspec.field(default=None, name="externalURL")
    upstream: Upstream = msgspec.field(default_factory=Upstream)
    auth: Auth = msgspec.field(default_factory=Auth)
    slices: list[SliceConfig] = msgspec.field(default_factory=list)
    controller: ControllerConfig | None = None
    list_page_size: int = 500
    # Whether the provider's workspace runs mutating admission (webhooks, MutatingAdmission-
    # Policies) on the exported resources that can change labels, annotations or finalizers:
    # kcp runs those of the APIExport's workspace on every write through the virtual
    # workspace (vwserver.proxy.patches.ADMISSION), after the patch the proxy computed. With
    # it, merge and JSON patches keep their dry run (one more upstream request each), whose
    # result — admission included — must stay in the slice before anything is written.
    mutating_admission: bool = False
    cache: CacheConfig = msgspec.field(default_factory=CacheConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    # On SIGTERM /readyz answers 503 at once; new connections are still accepted for
    # shutdownDelaySeconds (so that endpoints stop routing here first), then the listener closes,
    # open watches end cleanly and requests in flight get shutdownGracePeriodSeconds to finish.
    shutdown_delay_seconds: float = 0.0
    shutdown_grace_period_seconds: float = 25.0


def load_config(path: Path) -> Config:
    """Read, decode and validate a config file. Raises :class:`ConfigError`."""
    return parse_config(read_yaml(path), base_dir=path.parent)


def parse_config(raw: object, *, base_dir: Path) -> Config:
    config = convert(raw, Config)
    _validate(config, base_dir=base_dir)
    return config


def slice_selector(slice_: SliceConfig, *, field: str) -> Selector:
    """The slice's selector, validated; empty only when explicitly allowed."""
    try:
        selector = Selector.from_label_selector(slice_.selector or {}, field=f"{field}.selector")
    except SelectorError as e:
        # The message starts with the exact field path ("$.slices[0].selector.matchLabels: ...").
        where, _, problem = e.message.partition(": ")
        raise ConfigError(where, problem) from e
    if selector.is_empty and not slice_.allow_empty_selector:
        raise ConfigError(
            f"{field}.selector",
            "empty selector would expose every object of the export; "
            "set allowEmptySelector: true if that is intended",
        )
    return selector


def _validate(config: Config, *, base_dir: Path) -> None:
    if not 0 < config.listen.port < 65536:
        raise ConfigError("$.listen.port", f"{config.listen.port} is not a TCP port")
    check_workers(config.workers, field="$.workers")
    if config.health is not None:
        if not 0 <= config.health.port < 65536:
            raise ConfigError("$.health.port", f"{config.health.port} is not a TCP port")
        if config.health.port == config.listen.port:
            raise ConfigError("$.health.port", "must differ from listen.port")
    if config.tls is None and not config.insecure_serving:
        raise ConfigError(
            "$.tls", "required (certFile, keyFile); set insecureServing: true for plain HTTP"
        )
    if config.tls is not None:
        for name in ("cert_file", "key_file"):
            require_file(getattr(config.tls, name), field=f"$.tls.{camel(name)}", base=base_dir)
        if config.tls.client_ca_file is not None:
            require_file(config.tls.client_ca_file, field="$.tls.clientCAFile", base=base_dir)
            if config.auth.mode == "passthrough":
                raise ConfigError(
                    "$.tls.clientCAFile",
                    "client certificates cannot be forwarded to kcp in auth.mode passthrough",
                )
    _validate_auth(config.auth)
    _validate_connections(config.connections)
    if config.controller is not None:
        if config.external_url is None:
            raise ConfigError(
                "$.externalURL", "required with controller (it prefixes every endpoint URL)"
            )
        if not WORKSPACE_RE.match(config.controller.export.path):
            raise ConfigError(
                "$.controller.export.path",
                f"{config.controller.export.path!r} is not a workspace path or logical cluster",
            )
        if config.controller.resync_seconds <= 0:
            raise ConfigError("$.controller.resyncSeconds", "must be positive")
        for key, value in (
            ("maxSlicesPerWorkspace", config.controller.max_slices_per_workspace),
            ("maxExportsPerWorkspace", config.controller.max_exports_per_workspace),
        ):
            if value < 1:
                raise ConfigError(f"$.controller.{key}", "must be at least 1")
        if config.controller.consent_reviews_per_second <= 0:
            raise ConfigError("$.controller.consentReviewsPerSecond", "must be positive")
        if config.controller.shards is not None:
            _validate_shards(config.controller.shards)
    if config.external_url is not None and not config.external_url.startswith(
        ("https://", "http://")
    ):
        raise ConfigError("$.externalURL", f"{config.external_url!r} is not an http(s) URL")
    if config.list_page_size < 1:
        raise ConfigError("$.listPageSize", "must be at least 1")
    if config.cache.idle_seconds <= 0:
        raise ConfigError("$.cache.idleSeconds", "must be positive")
    if config.cache.window < 1:
        raise ConfigError("$.cache.window", "must be at least 1")
    base.check_logging(config)
    metrics_path = config.metrics.path
    if not metrics_path.startswith("/") or metrics_path.startswith(PREFIX):
        raise ConfigError("$.metrics.path", f"{metrics_path!r}: must be a path outside {PREFIX}")
    if metrics_path in HEALTH_PATHS:
        raise ConfigError("$.metrics.path", f"{metrics_path!r} is a health endpoint")
    for name in ("shutdown_delay_seconds", "shutdown_grace_period_seconds"):
        if getattr(config, name) < 0:
            raise ConfigError(f"$.{camel(name)}", "must not be negative")
    _validate_upstream(config.upstream, base_dir=base_dir)
    seen: set[tuple[str, str]] = set()
    for i, s in enumerate(config.slices):
        field = f"$.slices[{i}]"
        if not LOGICAL_CLUSTER_RE.match(s.cluster):
            raise ConfigError(f"{field}.cluster", f"{s.cluster!r} is not a logical-cluster name")
        if not OBJECT_NAME_RE.match(s.name) or len(s.name) > 253:
            raise ConfigError(f"{field}.name", f"{s.name!r} is not a valid object name")
        if (s.cluster, s.name) in seen:
            raise ConfigError(field, f"duplicate slice {s.cluster}/{s.name}")
        if not 0 < s.hold_timeout_seconds <= MAX_HOLD_TIMEOUT_SECONDS:  # NaN too
            raise ConfigError(
                f"{field}.holdTimeoutSeconds",
                f"must be positive and at most {MAX_HOLD_TIMEOUT_SECONDS:.0f} (there is no "
                "unbounded hold)",
            )
        seen.add((s.cluster, s.name))
        if s.export is None and s.upstream_url is None:
            raise ConfigError(field, "set export {cluster, name} or upstreamURL")
        if s.export is not None:
            if not LOGICAL_CLUSTER_RE.match(s.export.cluster):
                raise ConfigError(
                    f"{field}.export.cluster",
                    f"{s.export.cluster!r} is not a logical-cluster ID "
                    "(use the ID from `kubectl get workspace -o jsonpath={.spec.cluster}`)",
                )
            if not OBJECT_NAME_RE.match(s.export.name):
                raise ConfigError(f"{field}.export.name", f"{s.export.name!r} is not a valid name")
        if s.upstream_url is not None and not s.upstream_url.startswith(("https://", "http://")):
            raise ConfigError(f"{field}.upstreamURL", f"{s.upstream_url!r} is not an http(s) URL")
        slice_selector(s, field=field)


def _validate_shards(shards: ShardsConfig) -> None:
    field = "$.controller.shards"
    if not DNS_LABEL_RE.match(shards.name):
        raise ConfigError(
            f"{field}.name",
            f"{shards.name!r} is not a DNS label (lower-case letters, digits and '-', at most "
            "63): it names the replica set's field manager and condition types",
        )
    if not shards.virtual_workspace_urls:
        raise ConfigError(f"{field}.virtualWorkspaceURLs", "name at least one shard")
    seen: set[str] = set()
    for i, url in enumerate(shards.virtual_workspace_urls):
        where = f"{field}.virtualWorkspaceURLs[{i}]"
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            raise ConfigError(where, f"{url!r} is not an http(s) URL")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ConfigError(
                where, f"{url!r}: a shard's virtual-workspace URL has no query or credentials"
            )
        base_url = url.rstrip("/")
        if base_url in seen:
            raise ConfigError(where, f"{url!r} is listed twice")
        seen.add(base_url)


def check_workers(workers: int, *, field: str) -> None:
    """``workers`` (from the file, or ``--workers``) is a usable number of processes."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(field, f"{workers} workers: must be between 1 and {MAX_WORKERS}")


def _validate_upstream(up: Upstream, *, base_dir: Path) -> None:
    base.check_access(up, field="$.upstream", base=base_dir, others=("server",))
    if up.token is not None and up.token_file is not None:
        raise ConfigError("$.upstream", "token and tokenFile are mutually exclusive")
    if up.server is not None and not up.server.startswith(("https://", "http://")):
        raise ConfigError("$.upstream.server", f"{up.server!r} is not an http(s) URL")
    for name in ("ca_file", "token_file", "client_cert_file", "client_key_file"):
        value = getattr(up, name)
        if value is not None:
            require_file(value, field=f"$.upstream.{camel(name)}", base=base_dir)


def _validate_connections(c: Connections) -> None:
    for name in ("header_timeout_seconds", "body_timeout_seconds", "idle_timeout_seconds"):
        if getattr(c, name) <= 0:
            raise ConfigError(f"$.connections.{camel(name)}", "must be positive")
    if c.max_connections_per_client < 0:
        raise ConfigError("$.connections.maxConnectionsPerClient", "must not be negative")


def _validate_auth(auth: Auth) -> None:
    cache = auth.cache
    for field, value in (
        ("tokenTTLSeconds", cache.token_ttl_seconds),
        ("tokenNegativeTTLSeconds", cache.token_negative_ttl_seconds),
        ("allowTTLSeconds", cache.allow_ttl_seconds),
        ("denyTTLSeconds", cache.deny_ttl_seconds),
    ):
        if value < 0:
            raise ConfigError(f"$.auth.cache.{field}", "must not be negative")
    if cache.max_entries < 1:
        raise ConfigError("$.auth.cache.maxEntries", "must be at least 1")
