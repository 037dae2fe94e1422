"""Response shapes of the fake upstream: Accept negotiation, lists, Tables, discovery, events.

These are the wire formats a filtering proxy parses and re-emits, so each one follows the
apiserver's encoder: custom resources and their lists are unstructured (keys sorted, as Go's
``encoding/json`` writes maps), while ``Table``, ``PartialObjectMetadata(List)``, ``Status``,
discovery documents and watch events are Go structs (declared field order, ``omitempty``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from fakekcp.status import FakeApiError, bad_request, status_error
from fakekcp.store import (
    INITIAL_EVENTS_END_ANNOTATION,
    JSON,
    ResourceSpec,
    StoredObject,
    partial_metadata,
)

_encode = msgspec.json.Encoder().encode
_encode_sorted = msgspec.json.Encoder(order="sorted").encode

TRANSFORMS: Final = frozenset({"Table", "PartialObjectMetadata", "PartialObjectMetadataList"})


@dataclass(frozen=True, slots=True)
class Output:
    """What the client asked for: the resource itself (``kind=""``) or a meta.k8s.io view."""

    kind: str = ""
    api_version: str = ""


def negotiate(accept: str) -> Output:
    """Pick the first acceptable ``Accept`` clause, by q-value then order (goautoneg).

    Custom resources are served as JSON only here: a protobuf clause is skipped like the CRD
    handler skips it (CRDs have no protobuf serializer), so ``protobuf, json`` falls back to JSON
    and protobuf alone is a 406. ``as=`` conversions need ``g=meta.k8s.io`` and ``v=v1|v1beta1``.
    """
    clauses: list[tuple[float, int, str, dict[str, str]]] = []
    for index, clause in enumerate(accept.split(",")):
        media, *raw_params = (part.strip() for part in clause.split(";"))
        if not media:
            continue
        params: dict[str, str] = {}
        q = 1.0
        for param in raw_params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            else:
                params[key.strip().lower()] = value.strip()
        clauses.append((-q, index, media.lower(), params))
    if not clauses:
        return Output()
    for negative_q, _, media, params in sorted(clauses):
        if negative_q == 0 or media not in ("application/json", "application/*", "*/*"):
            continue
        as_kind = params.get("as")
        if as_kind is None:
            return Output()
        version = params.get("v")
        if (
            as_kind in TRANSFORMS
            and params.get("g") == "meta.k8s.io"
            and version in ("v1", "v1beta1")
        ):
            return Output(as_kind, f"meta.k8s.io/{version}")
    raise status_error(
        406, "NotAcceptable", "only the following media types are accepted: application/json"
    )


def not_acceptable_for(output: Output, *, is_list: bool) -> FakeApiError | None:
    """transformObject's refusals: PartialObjectMetadata of a list and vice versa."""
    if output.kind == "PartialObjectMetadata" and is_list:
        return status_error(
            406,
            "NotAcceptable",
            "you requested PartialObjectMetadata, but the requested object is a list "
            "(*unstructured.UnstructuredList)",
        )
    if output.kind == "PartialObjectMetadataList" and not is_list:
        return status_error(
            406,
            "NotAcceptable",
            "you requested PartialObjectMetadataList, but the requested object is not a list "
            "(*unstructured.Unstructured)",
        )
    return None


def include_object(query: Mapping[str, str]) -> str:
    """TableOptions.includeObject; the apiserver's default for Tables is ``Metadata``."""
    value = query.get("includeObject", "")
    if value not in ("", "None", "Metadata", "Object"):
        raise bad_request(f'unrecognized includeObject value: "{value}"')
    return value or "Metadata"


def list_meta(*, rv: int, continue_token: str, remaining: int | None, sort: bool) -> JSON:
    """ListMeta: struct order for meta.k8s.io types, sorted keys in unstructured lists."""
    meta: JSON = {"resourceVersion": str(rv)}
    if continue_token:
        meta["continue"] = continue_token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return dict(sorted(meta.items())) if sort else meta


def list_frame(spec: ResourceSpec, output: Output, meta: JSON) -> tuple[bytes, bytes]:
    """The bytes before and after the items of a list; items are joined with ``,`` between."""
    if output.kind == "PartialObjectMetadataList":
        frame: JSON = {
            "kind": "PartialObjectMetadataList",
            "apiVersion": output.api_version,
            "metadata": meta,
        }
        return _encode(frame)[:-1] + b',"items":[', b"]}"
    if output.kind == "Table":
        frame = {"kind": "Table", "apiVersion": output.api_version, "metadata": meta}
        return _encode(frame)[:-1] + b',"columnDefinitions":' + _COLUMNS + b',"rows":[', b"]}"
    head = b'{"apiVersion":' + _encode(spec.api_version) + b',"items":['
    tail = b'],"kind":' + _encode(spec.list_kind) + b',"metadata":' + _encode(meta) + b"}"
    return head, tail


def list_item(stored: StoredObject, output: Output, include: str) -> bytes:
    if output.kind == "PartialObjectMetadataList":
        return stored.partial(output.api_version)
    if output.kind == "Table":
        return table_row(stored.obj, stored.raw, output, include)
    return stored.raw


# The CRD table convertor's defaults: Name plus the defaulted Age column (apiextensions-apiserver
# registry/customresource/tableconvertor and apiserver/helpers.go serveDefaultColumnsIfEmpty).
_NAME_DESCRIPTION: Final = (
    "Name must be unique within a namespace. Is required when creating resources, although some "
    "resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
_AGE_DESCRIPTION: Final = (
    "CreationTimestamp is a timestamp representing the server time when this object was "
    "created. It is not guaranteed to be set in happens-before order across separate operations. "
    "Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\n"
    "Populated by the system. Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
_COLUMNS: Final = _encode(
    [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": _NAME_DESCRIPTION,
            "priority": 0,
        },
        {
            "name": "Age",
            "type": "date",
            "format": "",
            "description": _AGE_DESCRIPTION,
            "priority": 0,
        },
    ]
)


def human_age(timestamp: object) -> str | None:
    """metatable.ConvertToHumanReadableDateType + duration.HumanDuration."""
    if not isinstance(timestamp, str):
        return None
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<invalid>"
    seconds = int((datetime.now(UTC) - then).total_seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def table_row(obj: JSON, raw: bytes | None, output: Output, include: str) -> bytes:
    """A TableRow: cells, then the object as requested by ``includeObject``."""
    meta = obj.get("metadata") or {}
    cells = _encode([meta.get("name", ""), human_age(meta.get("creationTimestamp"))])
    if include == "Object":
        embedded = raw if raw is not None else _encode_sorted(obj)
    elif include == "None":
        embedded = b"null"
    else:
        embedded = partial_metadata(obj, output.api_version)
    return b'{"cells":' + cells + b',"object":' + embedded + b"}"


def single_table(
    obj: JSON, raw: bytes | None, output: Output, include: str, *, headers: bool
) -> bytes:
    """A one-row Table for GET/writes/watch events (headers only on a watch's first event)."""
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    head: JSON = {
        "kind": "Table",
        "apiVersion": output.api_version,
        "metadata": {"resourceVersion": rv} if rv else {},
    }
    columns = _COLUMNS if headers else b"null"
    row = table_row(obj, raw, output, include)
    return _encode(head)[:-1] + b',"columnDefinitions":' + columns + b',"rows":[' + row + b"]}"


def render_object(obj: JSON, raw: bytes | None, output: Output, include: str) -> bytes:
    """One object in the negotiated shape (callers reject list-only shapes first)."""
    if output.kind == "PartialObjectMetadata":
        return partial_metadata(obj, output.api_version)
    if output.kind == "Table":
        return single_table(obj, raw, output, include, headers=True)
    return raw if raw is not None else _encode_sorted(obj)


def success_status(spec: ResourceSpec, obj: JSON) -> bytes:
    """Store.finalizeDelete's answer when the object is gone (Kind holds the resource)."""
    meta = obj.get("metadata") or {}
    details: JSON = {"name": meta.get("name", "")}
    if spec.group:
        details["group"] = spec.group
    details["kind"] = spec.plural
    if meta.get("uid"):
        details["uid"] = meta["uid"]
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }
    return _encode(body)


# --- watch events ------------------------------------------------------------------------------


def event_line(type_: str, raw: bytes) -> bytes:
    return b'{"type":"' + type_.encode() + b'","object":' + raw + b"}\n"


def bookmark_line(spec: ResourceSpec, rv: int, *, initial_events_end: bool) -> bytes:
    """A BOOKMARK: an otherwise empty unstructured object with only its resourceVersion."""
    meta: JSON = {"resourceVersion": str(rv)}
    if initial_events_end:
        meta = {"annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"}, **meta}
    obj = {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": meta}
    return event_line("BOOKMARK", _encode_sorted(obj))


def error_line(error: FakeApiError) -> bytes:
    return event_line("ERROR", error.body.rstrip(b"\n"))


# --- discovery ------------------------------------------------------------------------------------


def _group_versions(specs: Iterable[ResourceSpec]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for spec in specs:
        versions = groups.setdefault(spec.group, [])
        if spec.version not in versions:
            versions.append(spec.version)
    return groups


def _group_doc(group: str, versions: list[str]) -> JSON:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def discovery_documents(specs: list[ResourceSpec], openapi_base: str) -> dict[str, bytes]:
    """Legacy discovery (APIVersions, APIGroupList, APIGroup, APIResourceList) + OpenAPI v3 index.

    ``/api/v1`` lists no resources: the VW serves no core resources (kcp field notes).
    """
    docs: dict[str, bytes] = {
        "api": _encode(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        ),
        "api/v1": _encode({"kind": "APIResourceList", "groupVersion": "v1", "resources": []}),
    }
    groups = _group_versions(specs)
    docs["apis"] = _encode(
        {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [_group_doc(g, vs) for g, vs in groups.items()],
        }
    )
    paths: JSON = {}
    for group, versions in groups.items():
        docs[f"apis/{group}"] = _encode(
            {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, versions)}
        )
        for version in versions:
            resources: list[JSON] = []
            for spec in specs:
                if spec.group != group or spec.version != version:
                    continue
                verbs = ["get", "list", "watch"]
                if not spec.read_only:
                    verbs = [
                        "create",
                        "delete",
                        "deletecollection",
                        "get",
                        "list",
                        "patch",
                        "update",
                        "watch",
                    ]
                resources.append(
                    {
                        "name": spec.plural,
                        "singularName": spec.singular,
                        "namespaced": spec.namespaced,
                        "kind": spec.kind,
                        "verbs": verbs,
                    }
                )
                if spec.status_subresource:
                    resources.append(
                        {
                            "name": f"{spec.plural}/status",
                            "singularName": "",
                            "namespaced": spec.namespaced,
                            "kind": spec.kind,
                            "verbs": ["get", "patch", "update"],
                        }
                    )
            docs[f"apis/{group}/{version}"] = _encode(
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": f"{group}/{version}",
                    "resources": resources,
                }
            )
            url = f"{openapi_base}/apis/{group}/{version}"
            paths[f"apis/{group}/{version}"] = {"serverRelativeURL": url}
            docs[f"openapi/v3/apis/{group}/{version}"] = _encode(
                {
                    "openapi": "3.0.0",
                    "info": {"title": "Kubernetes", "version": "unversioned"},
                    "paths": {},
                    "components": {"schemas": {}},
                }
            )
    docs["openapi/v3"] = _encode({"paths": paths})
    return docs


def generic_not_found() -> FakeApiError:
    """What the apiserver's NotFoundHandler answers for paths no API serves."""
    return status_error(
        404, "NotFound", "the server could not find the requested resource", details={}
    )


def as_json(value: Any) -> bytes:
    return _encode(value)
