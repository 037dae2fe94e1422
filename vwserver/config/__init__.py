"""The YAML configuration file of ``vwserver serve``.

The file is decoded into msgspec Structs, so a wrong type or an unknown key is reported with the
exact path of the field (``$.slices[1].selector``), and then checked for what types cannot say
(selectors parse, URLs are https, files exist). Every problem is a :class:`ConfigError` naming the
field; nothing is half-applied.

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

import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec
import yaml

from vwserver import listener
from vwserver.auth import access, tokens
from vwserver.errors import ConfigError, SelectorError
from vwserver.logs import LogFormat
from vwserver.proxy.paths import PREFIX
from vwserver.selector import Selector

T = TypeVar("T")

# kcp logical-cluster names (IDs such as "2fx3m0rnxzbs8mq9", or "root"); workspace *paths*
# ("root:org") are not valid in virtual-workspace URLs (FIELD-NOTES: both segments are IDs).
LOGICAL_CLUSTER_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# A workspace path ("root:org:team") or a logical-cluster ID.
WORKSPACE_RE = re.compile(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(:[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
# A Kubernetes object name (DNS-1123 subdomain), as slice and export names are.
OBJECT_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class _Strict(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """Base: unknown keys are errors (a typo must not be silently ignored)."""


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = 8443


class TLS(_Strict):
    # Reloaded when the files change (vwserver.auth.tls): rotation needs no restart.
    cert_file: str
    key_file: str
    # Client certificates signed by this CA authenticate (CN = user, O = groups); read at start.
    client_ca_file: str | None = msgspec.field(default=None, name="clientCAFile")


class AuthCache(_Strict):
    """How long kcp's review answers are reused, in seconds (0: not cached), and how many."""

    token_ttl_seconds: float = msgspec.field(default=tokens.DEFAULT_TTL, name="tokenTTLSeconds")
    token_negative_ttl_seconds: float = msgspec.field(
        default=tokens.DEFAULT_NEGATIVE_TTL, name="tokenNegativeTTLSeconds"
    )
    allow_ttl_seconds: float = msgspec.field(
        default=access.DEFAULT_ALLOW_TTL, name="allowTTLSeconds"
    )
    deny_ttl_seconds: float = msgspec.field(default=access.DEFAULT_DENY_TTL, name="denyTTLSeconds")
    max_entries: int = tokens.DEFAULT_MAX_ENTRIES


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
    header_timeout_seconds: float = listener.DEFAULT_HEADER_TIMEOUT
    # A request body must be complete this long after its headers.
    body_timeout_seconds: float = listener.DEFAULT_BODY_TIMEOUT
    # A keep-alive connection without a request is closed after this long.
    idle_timeout_seconds: float = listener.DEFAULT_IDLE_TIMEOUT
    # Open connections per client IP address (each watch holds one); 0: no limit.
    max_connections_per_client: int = listener.DEFAULT_MAX_CONNECTIONS_PER_CLIENT

    def limits(self) -> listener.ConnectionLimits:
        return listener.ConnectionLimits(
            header_timeout=self.header_timeout_seconds,
            body_timeout=self.body_timeout_seconds,
            idle_timeout=self.idle_timeout_seconds,
            max_connections_per_client=self.max_connections_per_client,
        )


class Upstream(_Strict):
    """How vwserver reaches kcp: a kubeconfig, or a server URL with explicit credentials."""

    kubeconfig: str | None = None
    context: str | None = None
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
    # never the accident of a forgotten field (the Go peer treated {} as "no filtering").
    allow_empty_selector: bool = False
    export: ExportRef | None = None
    # Full APIExport virtual-workspace URL; overrides ``export`` (e.g. a specific shard).
    upstream_url: str | None = msgspec.field(default=None, name="upstreamURL")


class ControllerExport(_Strict):
    """Where vwserver's own API (the FilteredAPIExportEndpointSlice APIExport) is exported."""

    path: str
    name: str = "sync.edge-connect.eu"


class LeaseConfig(_Strict):
    workspace: str | None = None
    """Workspace of the Lease (default: the controller export's workspace)."""
    name: str = "vwserver-controller"
    identity: str | None = None
    """This replica's identity (default: hostname + process id)."""


class ControllerConfig(_Strict):
    """kcp mode: discover slices in kcp instead of (or besides) listing them here."""

    export: ControllerExport
    lease: LeaseConfig | None = None
    resync_seconds: float = 30.0


class MetricsConfig(_Strict):
    """Prometheus metrics, unauthenticated like the health endpoints (no tokens, no objects)."""

    enabled: bool = True
    path: str = "/metrics"


HEALTH_PATHS = ("/healthz", "/livez", "/readyz")


class Config(_Strict):
    listen: Listen = msgspec.field(default_factory=Listen)
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
    log_level: str = "info"
    # json: one JSON object per line, for log collectors (the Deployment's choice); text: for
    # people at a terminal.
    log_format: LogFormat = "text"
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    # On SIGTERM /readyz answers 503 at once; new connections are still accepted for
    # shutdownDelaySeconds (so that endpoints stop routing here first), then the listener closes,
    # open watches end cleanly and requests in flight get shutdownGracePeriodSeconds to finish.
    shutdown_delay_seconds: float = 0.0
    shutdown_grace_period_seconds: float = 25.0


def read_yaml(path: Path) -> object:
    """A YAML file's document (``{}`` for an empty file); ConfigError names the file."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(str(path), f"cannot read: {e.strerror}") from e
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(str(path), f"not valid YAML: {e}") from e
    return raw if raw is not None else {}


def convert(raw: object, cls: type[T]) -> T:
    """Decode a config document into ``cls``; a type error or unknown key names its field."""
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as e:
        # msgspec says e.g. "Expected `int`, got `str` - at `$.listen.port`"; lead with the path.
        problem, _, where = str(e).rpartition(" - at ")
        if problem:
            raise ConfigError(where.strip("`"), problem) from e
        raise ConfigError("$", str(e)) from e  # a problem of the top-level mapping


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
    if config.tls is None and not config.insecure_serving:
        raise ConfigError(
            "$.tls", "required (certFile, keyFile); set insecureServing: true for plain HTTP"
        )
    if config.tls is not None:
        for name in ("cert_file", "key_file"):
            _require_file(getattr(config.tls, name), field=f"$.tls.{_camel(name)}", base=base_dir)
        if config.tls.client_ca_file is not None:
            _require_file(config.tls.client_ca_file, field="$.tls.clientCAFile", base=base_dir)
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
    if config.external_url is not None and not config.external_url.startswith(
        ("https://", "http://")
    ):
        raise ConfigError("$.externalURL", f"{config.external_url!r} is not an http(s) URL")
    if config.list_page_size < 1:
        raise ConfigError("$.listPageSize", "must be at least 1")
    if config.log_level.lower() not in {"debug", "info", "warning", "error"}:
        raise ConfigError("$.logLevel", f"unknown level {config.log_level!r}")
    metrics_path = config.metrics.path
    if not metrics_path.startswith("/") or metrics_path.startswith(PREFIX):
        raise ConfigError("$.metrics.path", f"{metrics_path!r}: must be a path outside {PREFIX}")
    if metrics_path in HEALTH_PATHS:
        raise ConfigError("$.metrics.path", f"{metrics_path!r} is a health endpoint")
    for name in ("shutdown_delay_seconds", "shutdown_grace_period_seconds"):
        if getattr(config, name) < 0:
            raise ConfigError(f"$.{_camel(name)}", "must not be negative")
    up = config.upstream
    if up.kubeconfig is None and up.server is None:
        raise ConfigError("$.upstream", "set either kubeconfig or server")
    if up.kubeconfig is not None and up.server is not None:
        raise ConfigError("$.upstream", "kubeconfig and server are mutually exclusive")
    if up.token is not None and up.token_file is not None:
        raise ConfigError("$.upstream", "token and tokenFile are mutually exclusive")
    if up.server is not None and not up.server.startswith(("https://", "http://")):
        raise ConfigError("$.upstream.server", f"{up.server!r} is not an http(s) URL")
    for name in ("kubeconfig", "ca_file", "token_file", "client_cert_file", "client_key_file"):
        value = getattr(up, name)
        if value is not None:
            _require_file(value, field=f"$.upstream.{_camel(name)}", base=base_dir)
    seen: set[tuple[str, str]] = set()
    for i, s in enumerate(config.slices):
        field = f"$.slices[{i}]"
        if not LOGICAL_CLUSTER_RE.match(s.cluster):
            raise ConfigError(f"{field}.cluster", f"{s.cluster!r} is not a logical-cluster name")
        if not OBJECT_NAME_RE.match(s.name) or len(s.name) > 253:
            raise ConfigError(f"{field}.name", f"{s.name!r} is not a valid object name")
        if (s.cluster, s.name) in seen:
            raise ConfigError(field, f"duplicate slice {s.cluster}/{s.name}")
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


def _validate_connections(c: Connections) -> None:
    for name in ("header_timeout_seconds", "body_timeout_seconds", "idle_timeout_seconds"):
        if getattr(c, name) <= 0:
            raise ConfigError(f"$.connections.{_camel(name)}", "must be positive")
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


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _require_file(value: str, *, field: str, base: Path) -> None:
    if not (base / value).is_file():
        raise ConfigError(field, f"file {value!r} does not exist")


def resolve(value: str, *, base: Path) -> Path:
    """Relative paths in the config are relative to the config file's directory."""
    return base / value
