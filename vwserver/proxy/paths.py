"""Parse and classify request paths — pure functions, no I/O.

The filtered endpoint of a slice is::

    /services/filtered-apiexport/<slice-cluster>/<slice-name>/clusters/<cluster | *>/<api path>

and everything after ``clusters/<cluster>`` is forwarded to the same place below the upstream
APIExport virtual workspace. Paths are parsed from the *raw* (still percent-encoded) request path
and every segment is checked before anything is forwarded: a percent-encoded slash, ``..`` or an
empty segment could otherwise make the upstream resolve a different resource than the one the
proxy checked: a request the proxy did not understand never reaches the upstream.

:class:`ApiRequest` says what a request is in Kubernetes terms (the verb, group, resource,
namespace, name, subresource), the way the apiserver's ``RequestInfoFactory`` does, because every
filtering decision hangs on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from vwserver.errors import BadRequest, MethodNotAllowed, NotFound
from vwserver.k8s.kcp import APIBINDINGS, SLICE_ENDPOINT_PREFIX
from vwserver.names import LOGICAL_CLUSTER_RE, OBJECT_NAME_RE

PREFIX = SLICE_ENDPOINT_PREFIX + "/"

# Shard ids in multi-shard endpoint URLs (see vwserver.k8s.kcp.shard_id).
_SHARD_RE = re.compile(r"^[a-f0-9]{1,64}$")
# Versions and resource plurals are DNS labels in practice; allow what CRDs allow.
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class Verb(StrEnum):
    GET = "get"
    LIST = "list"
    WATCH = "watch"
    CREATE = "create"
    UPDATE = "update"
    PATCH = "patch"
    DELETE = "delete"
    DELETECOLLECTION = "deletecollection"


READ_VERBS = frozenset({Verb.GET, Verb.LIST, Verb.WATCH})


@dataclass(frozen=True, slots=True)
class SlicePath:
    """The slice part of a filtered-endpoint URL plus the rest, still raw."""

    slice_cluster: str
    slice_name: str
    cluster: str
    """The consumer logical cluster, or ``*``."""
    api_path: str
    """Everything after ``clusters/<cluster>``, starting with ``/`` (may be ``""``)."""
    shard: str = ""
    """Shard id from ``.../<slice-name>/shards/<id>/clusters/...`` (multi-shard exports)."""

    @property
    def wildcard(self) -> bool:
        return self.cluster == "*"


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """What a request under ``clusters/<cluster>`` means in Kubernetes terms."""

    discovery: bool
    """Discovery, OpenAPI or version documents; no resource involved."""
    verb: Verb
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    name: str = ""
    subresource: str = ""
    legacy_watch: bool = False
    """Came in on a deprecated ``/watch/`` path: with a name, it watches that one object
    (``fieldSelector=metadata.name=<name>``, as the apiserver serves it)."""
    discovery_path: str = ""
    """For discovery only: the canonical path of the document."""

    @property
    def is_apibindings(self) -> bool:
        return (self.group, self.resource) == (APIBINDINGS.group, APIBINDINGS.resource)

    @property
    def collection_path(self) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        ns = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{prefix}{ns}/{self.resource}"

    @property
    def object_path(self) -> str:
        """The named object itself, without subresource."""
        return f"{self.collection_path}/{self.name}"

    @property
    def path(self) -> str:
        """The canonical API path the upstream gets: rebuilt from what was classified, never the
        client's raw path, so the upstream cannot read a request differently from the proxy."""
        if self.discovery:
            return self.discovery_path
        if not self.name or self.verb in (Verb.WATCH, Verb.LIST, Verb.DELETECOLLECTION):
            return self.collection_path
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.object_path}{sub}"


def split_slice_path(raw_path: str) -> SlicePath | None:
    """Split a raw request path; None when it is not below :data:`PREFIX`.

    Raises :class:`BadRequest` for a path that is below the prefix but malformed.
    """
    if not raw_path.startswith(PREFIX):
        return None
    # client-go escapes the wildcard cluster as "%2A" (Go's url.PathEscape); it is the one
    # percent-encoding a valid path needs.
    raw_path = raw_path.replace("%2A", "*").replace("%2a", "*")
    rest = raw_path[len(PREFIX) :]
    _check_raw(raw_path)
    shard = ""
    head = rest.split("/", 4)
    if len(head) >= 4 and head[2] == "shards":
        # <cluster>/<name>/shards/<id>/clusters/...: drop the shard part, remember the id.
        shard = head[3]
        if not _SHARD_RE.match(shard):
            raise BadRequest(f"invalid shard {shard!r}")
        rest = "/".join([*head[:2], head[4] if len(head) == 5 else ""])
    parts = rest.split("/", 4)
    if len(parts) < 4 or parts[2] != "clusters":
        raise BadRequest(
            f"path {raw_path!r} must look like "
            f"{PREFIX}<slice-cluster>/<slice-name>/clusters/<cluster>/<api path>"
        )
    slice_cluster, slice_name, _, cluster = parts[:4]
    api_path = "/" + parts[4] if len(parts) == 5 else ""
    if not LOGICAL_CLUSTER_RE.match(slice_cluster):
        raise BadRequest(f"invalid slice cluster {slice_cluster!r}: not a logical-cluster name")
    if not OBJECT_NAME_RE.match(slice_name) or len(slice_name) > 253:
        raise BadRequest(f"invalid slice name {slice_name!r}")
    if cluster != "*" and not LOGICAL_CLUSTER_RE.match(cluster):
        raise BadRequest(f"invalid cluster {cluster!r}: not a logical-cluster name or '*'")
    return SlicePath(slice_cluster, slice_name, cluster, api_path, shard)


def _check_raw(raw_path: str) -> None:
    # Object names, namespaces and resources never need percent-encoding; refusing "%" outright
    # rules out encoded slashes and dots and double-decoding tricks in one check.
    if "%" in raw_path:
        raise BadRequest("percent-encoded characters are not allowed in the path")
    segments = raw_path.split("/")[1:]
    if segments and segments[-1] == "":
        segments = segments[:-1]  # one trailing slash is harmless
    for segment in segments:
        if segment in ("", ".", ".."):
            raise BadRequest("empty, '.' and '..' path segments are not allowed")


def classify(api_path: str, *, method: str, watch: bool) -> ApiRequest:
    """Classify the API path below ``clusters/<cluster>`` for an HTTP method.

    ``watch`` is whether the query asks for a watch (see :func:`vwserver.proxy.options.watch`).
    The forms understood are exactly the apiserver's: discovery documents, collections, objects
    and one level of subresource, and the deprecated ``/watch/`` prefix; anything else is a 400.
    """
    parts = [p for p in api_path.split("/") if p]
    method = method.upper()
    if not parts:
        raise BadRequest("unsupported path '/': address /api or /apis")
    if parts[0] not in ("api", "apis"):
        return _discovery(parts, method=method)
    if parts[0] == "api":
        # Core group: /api, /api/v1, /api/v1/...
        group, rest = "", parts[1:]
    else:
        if len(parts) == 1:
            return _discovery(parts, method=method)
        group, rest = parts[1], parts[2:]
        if not OBJECT_NAME_RE.match(group):
            raise BadRequest(f"invalid API group {group!r}")
    if len(rest) <= 1:
        # /api, /api/v1, /apis/<g>, /apis/<g>/<v>
        if rest and not _SEGMENT_RE.match(rest[0]):
            raise BadRequest(f"invalid version {rest[0]!r}")
        return _discovery(parts, method=method, group=group)
    version, rest = rest[0], rest[1:]
    legacy_watch = rest[0] == "watch"
    if legacy_watch:
        # /apis/<g>/<v>/watch/[namespaces/<ns>/]<resource>[/<name>] (deprecated, still served)
        rest = rest[1:]
        if not rest or method not in ("GET", "HEAD"):
            raise BadRequest(f"unsupported path {api_path!r}")
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    if len(rest) > (2 if legacy_watch else 3):
        raise BadRequest(f"unsupported path {api_path!r}")
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    for what, value in (
        ("version", version),
        ("resource", resource),
        ("subresource", subresource),
    ):
        if value and not _SEGMENT_RE.match(value):
            raise BadRequest(f"invalid {what} {value!r}")
    if subresource and subresource != "status":
        # The APIExport virtual workspace serves the status subresource only (no scale).
        raise NotFound(f"the server could not find the requested resource ({subresource!r})")
    for what, value in (("namespace", namespace), ("name", name)):
        if value and (not OBJECT_NAME_RE.match(value) or len(value) > 253):
            raise BadRequest(f"invalid {what} {value!r}")
    verb = Verb.WATCH if legacy_watch else _resource_verb(method, named=bool(name), watch=watch)
    return ApiRequest(
        discovery=False,
        verb=verb,
        group=group,
        version=version,
        namespace=namespace,
        resource=resource,
        name=name,
        subresource=subresource,
        legacy_watch=legacy_watch,
    )


# Discovery documents served below one cluster: /api, /api/<v>, /apis, /apis/<g>, /apis/<g>/<v>,
# /version, /openapi/v2, /openapi/v3 and /openapi/v3/apis/<g>/<v> (or api/<v>).
def _discovery(parts: list[str], *, method: str, group: str = "") -> ApiRequest:
    ok = (
        parts[0] in ("api", "apis")
        or parts in (["version"], ["openapi", "v2"], ["openapi", "v3"])
        or (
            parts[:2] == ["openapi", "v3"]
            and (
                (len(parts) == 4 and parts[2] == "api")
                or (len(parts) == 5 and parts[2] == "apis" and OBJECT_NAME_RE.match(parts[3]))
            )
            and all(_SEGMENT_RE.match(p) for p in parts[2:])
        )
    )
    if not ok:
        raise NotFound("the server could not find the requested resource")
    return ApiRequest(
        discovery=True,
        verb=_discovery_verb(method),
        group=group,
        discovery_path="/" + "/".join(parts),
    )


def _discovery_verb(method: str) -> Verb:
    if method not in ("GET", "HEAD"):
        raise MethodNotAllowed(f"{method} is not allowed on discovery documents")
    return Verb.GET


def _resource_verb(method: str, *, named: bool, watch: bool) -> Verb:
    # The apiserver's RequestInfoFactory mapping (k8s.io/apiserver/pkg/endpoints/request).
    if method in ("GET", "HEAD"):
        # "watch" is a list option: a GET of a named object ignores it and returns the object.
        if named:
            return Verb.GET
        return Verb.WATCH if watch else Verb.LIST
    if method == "POST" and not named:
        return Verb.CREATE
    if method == "PUT" and named:
        return Verb.UPDATE
    if method == "PATCH" and named:
        return Verb.PATCH
    if method == "DELETE":
        return Verb.DELETE if named else Verb.DELETECOLLECTION
    raise MethodNotAllowed(f"{method} is not supported on this path")
