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
    """Where the slice listener (TLS unless ``insecureServing``) listens."""

    host: str = "127.0.0.1"
    """Address to bind (``0.0.0.0`` in a pod)."""
    port: int = 8443
    """Port to bind."""


class HealthListen(_Strict):
    """A second listener, plain HTTP: the health endpoints and metrics, and ``/debug/cache``
    when ``host`` is a loopback address (the slice listener never serves it). Unset: no such
    listener."""

    host: str = "127.0.0.1"
    """Address to bind; ``/debug/cache`` is served only on a loopback address."""
    port: int = 8081
    """Port to bind."""


class TLS(_Strict):
    """The serving certificate (TLS ≥ 1.2). Required unless ``insecureServing: true``."""

    cert_file: str
    """PEM certificate chain; re-read when the file changes (rotation needs no restart: open
    connections keep theirs, new ones get the new certificate)."""
    key_file: str
    """PEM private key of ``certFile``; re-read with it."""
    client_ca_file: str | None = msgspec.field(default=None, name="clientCAFile")
    """Client certificates signed by this CA authenticate (CN = user, O = groups); read at
    start. Not with ``auth.mode: passthrough``."""


class AuthCache(_Strict):
    """How long kcp's review answers are reused, in seconds (0: not cached), and how many."""

    token_ttl_seconds: float = msgspec.field(default=base.DEFAULT_TOKEN_TTL, name="tokenTTLSeconds")
    """Seconds a token kcp accepted (TokenReview) is remembered."""
    token_negative_ttl_seconds: float = msgspec.field(
        default=base.DEFAULT_TOKEN_NEGATIVE_TTL, name="tokenNegativeTTLSeconds"
    )
    """Seconds a token kcp rejected is remembered."""
    allow_ttl_seconds: float = msgspec.field(default=base.DEFAULT_ALLOW_TTL, name="allowTTLSeconds")
    """Seconds a granted slice + verb (SubjectAccessReview) is remembered: a revoked grant stops
    working within this."""
    deny_ttl_seconds: float = msgspec.field(default=base.DEFAULT_DENY_TTL, name="denyTTLSeconds")
    """Seconds a denied slice + verb is remembered: a new grant starts working within this."""
    max_entries: int = base.DEFAULT_MAX_ENTRIES
    """Entries per cache; the least recently used go first. Keys hold an HMAC of the token,
    never the token."""


class Auth(_Strict):
    """Who may use which slice (vwserver.auth.guard has the details of both modes)."""

    mode: Literal["delegated", "passthrough"] = "delegated"
    """``delegated``: vwserver checks the caller with kcp, then calls kcp as itself;
    ``passthrough``: the same checks, then the caller's own bearer token goes to kcp (which then
    also checks the caller's ``apiexports/content``; the shared watch cache is not used)."""
    cache: AuthCache = msgspec.field(default_factory=AuthCache)
    """How long kcp's review answers are reused."""


class Connections(_Strict):
    """Bounds on each client connection, against slow and greedy clients (vwserver.listener)."""

    header_timeout_seconds: float = base.DEFAULT_HEADER_TIMEOUT
    """A request's headers must be complete this long after the connection (the TLS handshake
    gets as long) or after the request's first byte."""
    body_timeout_seconds: float = base.DEFAULT_BODY_TIMEOUT
    """A request body must be complete this long after its headers."""
    idle_timeout_seconds: float = base.DEFAULT_IDLE_TIMEOUT
    """A keep-alive connection without a request is closed after this long."""
    max_connections_per_client: int = base.DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    """Open connections per client IP address (each watch holds one); one more is answered
    ``429`` and closed. ``0``: no limit. Raise it behind a proxy that hides client addresses."""


class Upstream(ClusterAccess):
    """vwserver's own identity towards kcp — exactly one of three ways: a ``kubeconfig`` (tokens,
    token files, client certificates, exec credential plugins such as OIDC helpers, re-run before
    their token expires), ``inCluster: true`` (the pod's ServiceAccount), or ``server`` with
    explicit credentials."""

    server: str | None = None
    """kcp's URL, with explicit credentials (instead of a kubeconfig)."""
    ca_file: str | None = None
    """With ``server``: the CA that signed kcp's serving certificate."""
    token: str | None = None
    """With ``server``: a bearer token (prefer ``tokenFile``)."""
    token_file: str | None = None
    """With ``server``: a file holding the bearer token, re-read as it rotates."""
    client_cert_file: str | None = None
    """With ``server``: a client certificate (with ``clientKeyFile``)."""
    client_key_file: str | None = None
    """With ``server``: the client certificate's key."""
    insecure_skip_tls_verify: bool = False
    """With ``server``: do not verify kcp's certificate (development only)."""


class ExportRef(_Strict):
    """The APIExport a slice filters: its logical cluster ID and name (the virtual-workspace URL
    is derived from the upstream server)."""

    cluster: str
    """The export's logical-cluster ID (not its workspace path)."""
    name: str
    """The APIExport's name."""


class SliceConfig(_Strict):
    """A slice served from the file (besides those the controller discovers in kcp mode)."""

    cluster: str
    """The slice's logical cluster (the first segment of its URL)."""
    name: str
    """The slice's name (the second segment of its URL)."""
    selector: dict[str, Any] | None = None
    """A ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions``): the objects the slice
    shows and lets clients write."""
    allow_empty_selector: bool = False
    """Allow an empty selector. An empty selector would show every object of the export: that
    must be a visible decision, never the accident of a forgotten field."""
    export: ExportRef | None = None
    """The APIExport the slice filters."""
    upstream_url: str | None = msgspec.field(default=None, name="upstreamURL")
    """Full APIExport virtual-workspace URL; overrides ``export`` (e.g. a specific shard)."""
    cache: bool = True
    """Serve this slice's LIST and WATCH from the shared watch cache (when ``cache.enabled``);
    ``false``: every request goes to kcp (the pass-through path), and the slice records no
    holds."""
    hold_timeout_seconds: float = DEFAULT_HOLD_TIMEOUT_SECONDS
    """Seconds the slice may hold an object that is leaving it (a finalizer added through the
    slice is still on it) before vwserver removes the slice's finalizers; at most 604800:
    every hold is bounded."""


class ControllerExport(_Strict):
    """Where vwserver's own API (the FilteredAPIExportEndpointSlice APIExport, from
    ``manifests/kcp/``) is exported."""

    path: str
    """The workspace (path or logical-cluster ID) of vwserver's APIExport."""
    name: str = SLICES.group
    """The APIExport's name."""


class LeaseConfig(_Strict):
    """Optional leader election for several replicas: only the Lease holder writes slice
    status."""

    workspace: str | None = None
    """Workspace of the Lease (default: the controller export's workspace)."""
    name: str = DEFAULT_LEASE_NAME
    """The Lease's name; with ``controller.shards``, the default becomes
    ``vwserver-controller-<shards.name>``."""
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
    """kcp mode: discover slices in kcp (in every workspace that binds vwserver's API) instead
    of (or besides) listing them here. Needs ``externalURL``."""

    export: ControllerExport
    """vwserver's own APIExport."""
    lease: LeaseConfig | None = None
    """Leader election among replicas (unset: this process writes status)."""
    shards: ShardsConfig | None = None
    """Serve only these shards (one Deployment per shard); unset: every shard."""
    resync_seconds: float = 30.0
    """How often a ready slice is re-checked against its export and its owner's consent (a
    revoked grant ends the slice within this)."""
    max_slices_per_workspace: int = 50
    """Per workspace, the slices the controller looks at (oldest first): any workspace that
    binds vwserver's API can create slices, so work per workspace is bounded. A slice beyond it
    gets ``Ready=False`` reason ``TooManySlices`` and costs nothing more."""
    max_exports_per_workspace: int = 20
    """Per workspace, the distinct ``spec.export`` references of its slices; beyond it
    ``Ready=False`` reason ``TooManyExports``."""
    consent_reviews_per_second: float = 5.0
    """Per slice workspace: the rate of consent reviews (and workspace lookups) vwserver makes
    in kcp for slices naming another workspace's export."""


class CacheConfig(_Strict):
    """The shared watch cache: one upstream watch per resource, every slice's LIST and WATCH
    computed from it (docs: "The shared watch cache")."""

    enabled: bool = True
    """Serve LIST and WATCH from the shared watch cache; ``false``: every read goes to kcp."""
    idle_seconds: float = 300.0
    """A resource nobody read for this long stops its upstream watch and forgets its objects."""
    window: int = 4096
    """Changes kept per resource to serve watches and paged lists at an older resourceVersion;
    older ones are answered ``410 Expired``, as the apiserver does beyond its watch cache."""


class MetricsConfig(_Strict):
    """Prometheus metrics, unauthenticated like the health endpoints (no tokens, no objects)."""

    enabled: bool = True
    """Serve metrics (they show which slices exist: keep the endpoint off the public network)."""
    path: str = "/metrics"
    """Where metrics are served (slice and health listener)."""


MAX_WORKERS = 64
"""More processes than this on one socket is a configuration mistake, not a deployment."""


class Config(CommandConfig):
    listen: Listen = msgspec.field(default_factory=Listen)
    """Where slices are served."""
    workers: int = 1
    """Processes serving the listen socket with ``SO_REUSEPORT``, each one core
    (vwserver.workers; at most 64); ``vwserver serve --workers N`` overrides it. 1: one
    process."""
    health: HealthListen | None = None
    """Optional second listener, plain HTTP: health endpoints and metrics (and ``/debug/cache``
    on loopback)."""
    connections: Connections = msgspec.field(default_factory=Connections)
    """Per-connection bounds."""
    tls: TLS | None = None
    """The serving certificate."""
    insecure_serving: bool = False
    """Plain HTTP without TLS, for local development only (logs a warning: bearer tokens would
    travel in clear text); ``serve`` refuses to start without TLS unless this is set."""
    external_url: str | None = msgspec.field(default=None, name="externalURL")
    """How clients reach this server (the endpoint URLs in slice status are built from it)."""
    upstream: Upstream = msgspec.field(default_factory=Upstream)
    """vwserver's own identity towards kcp."""
    auth: Auth = msgspec.field(default_factory=Auth)
    """Who may use a slice, and how kcp is called for them."""
    slices: list[SliceConfig] = msgspec.field(default_factory=list)
    """Slices served from this file."""
    controller: ControllerConfig | None = None
    """kcp mode: slices discovered as objects in kcp."""
    list_page_size: int = 500
    """Size of the first upstream page when the proxy pages a LIST itself (an unpaged LIST of a
    slice that records holds, or in YAML); each later page doubles, up to 10,000 objects or
    about 4 MiB at the previous page's bytes per object (kcp's cost per page). An unpaged JSON
    LIST of a slice that records no holds is one upstream LIST without a limit, streamed through
    in batches of 256 KiB."""
    mutating_admission: bool = False
    """``true`` when the provider's workspace runs mutating admission (webhooks,
    MutatingAdmissionPolicies) on the exported resources that can change labels, annotations or
    finalizers: kcp runs those of the APIExport's workspace on every write through the virtual
    workspace (vwserver.proxy.patches.ADMISSION), after the patch the proxy computed. Merge and
    JSON patches then keep their dry run (one more upstream request each), so that a patch
    admission would move out of the slice is refused with 422 before anything is written.
    ``false``: one write; such a move is made, logged and counted in
    ``vwserver_writes_moved_by_admission_total``."""
    cache: CacheConfig = msgspec.field(default_factory=CacheConfig)
    """The shared watch cache."""
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    """Prometheus metrics."""
    shutdown_delay_seconds: float = 0.0
    """On SIGTERM ``/readyz`` answers 503 at once; new connections are still accepted this long
    (so that endpoints stop routing here first)."""
    shutdown_grace_period_seconds: float = 25.0
    """Then the listener closes, open watches end cleanly and requests in flight get this long
    to finish."""


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
