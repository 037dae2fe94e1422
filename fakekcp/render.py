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
    PrinterColumn,
    ResourceSpec,
    StoredObject,
    partial_metadata,
)
from vwserver.cache.tables import date_cell

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
        head = _encode(frame)[:-1] + b',"columnDefinitions":' + columns(spec) + b',"rows":['
        return head, b"]}"
    head = b'{"apiVersion":' + _encode(spec.api_version) + b',"items":['
    tail = b'],"kind":' + _encode(spec.list_kind) + b',"metadata":' + _encode(meta) + b"}"
    return head, tail


def list_item(spec: ResourceSpec, stored: StoredObject, output: Output, include: str) -> bytes:
    if output.kind == "PartialObjectMetadataList":
        return stored.partial(output.api_version)
    if output.kind == "Table":
        return table_row(spec, stored.obj, stored.raw, output, include)
    return stored.raw


# kcp's table convertor (apiextensions-apiserver registry/customresource/tableconvertor.New):
# Name, then one column per printer column of the schema — no defaulted Age column — each
# described as "Custom resource definition column (in JSONPath format): <path>" unless it has
# a description of its own.
_NAME_COLUMN: Final = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": (
        "Name must be unique within a namespace. Is required when creating resources, although "
        "some resources may allow a client to request the generation of an appropriate name "
        "automatically. Name is primarily intended for creation idempotence and configuration "
        "definition. Cannot be updated. More info: "
        "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
    ),
    "priority": 0,
}


def columns(spec: ResourceSpec) -> bytes:
    """A Table's ``columnDefinitions`` for ``spec``."""
    defs: list[JSON] = [_NAME_COLUMN]
    for column in spec.printer_columns:
        description = column.description or (
            f"Custom resource definition column (in JSONPath format): {column.json_path}"
        )
        defs.append(
            {
                "name": column.name,
                "type": column.type,
                "format": column.format,
                "description": description,
                "priority": column.priority,
            }
        )
    return _encode(defs)


def _cell(column: PrinterColumn, obj: JSON) -> object:
    """tableconvertor's cell: the value at the column's path (missing keys allowed), as the
    column's type prints it (cellForJSONValue; a string column prints any value)."""
    value: object = obj
    for name in column.json_path.lstrip(".").split("."):
        value = value.get(name) if isinstance(value, dict) else None
    if value is None:
        return None
    if column.type == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else _encode(value).decode()
    if column.type == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if column.type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if column.type == "boolean" and isinstance(value, bool):
        return value
    if column.type == "date":
        # Printed at the time of the answer (the apiserver's rules: vwserver.cache.tables,
        # pinned to k8s.io/apimachinery's examples by its unit tests).
        return date_cell(value if isinstance(value, str) else None, datetime.now(UTC))
    return None


def table_row(
    spec: ResourceSpec, obj: JSON, raw: bytes | None, output: Output, include: str
) -> bytes:
    """A TableRow: cells, then the object as requested by ``includeObject``."""
    meta = obj.get("metadata") or {}
    cells = _encode([meta.get("name", ""), *(_cell(c, obj) for c in spec.printer_columns)])
    if include == "Object":
        embedded = raw if raw is not None else _encode_sorted(obj)
    elif include == "None":
        embedded = b"null"
    else:
        embedded = partial_metadata(obj, output.api_version, original_api_version=False)
    return b'{"cells":' + cells + b',"object":' + embedded + b"}"


def single_table(
    spec: ResourceSpec,
    obj: JSON,
    raw: bytes | None,
    output: Output,
    include: str,
    *,
    headers: bool,
) -> bytes:
    """A one-row Table for GET/writes/watch events (headers only on a watch's first event)."""
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    head: JSON = {
        "kind": "Table",
        "apiVersion": output.api_version,
        "metadata": {"resourceVersion": rv} if rv else {},
    }
    defs = columns(spec) if headers else b"null"
    row = table_row(spec, obj, raw, output, include)
    return _encode(head)[:-1] + b',"columnDefinitions":' + defs + b',"rows":[' + row + b"]}"


def table_bookmark(
    spec: ResourceSpec,
    rv: int,
    output: Output,
    include: str,
    *,
    initial_events_end: bool,
    headers: bool,
) -> bytes:
    """A BOOKMARK of a Table watch: a Table whose one row is printed from the bookmark object
    (asTable: a PartialObjectMetadata unless includeObject=Object — with None too when it ends
    the initial events)."""
    meta: JSON = {"resourceVersion": str(rv)}
    if initial_events_end:
        meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
    if include == "Object":
        embedded = _encode_sorted(
            {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": meta}
        )
    elif include == "None" and not initial_events_end:
        embedded = b"null"
    else:
        embedded = _encode(
            {"kind": "PartialObjectMetadata", "apiVersion": output.api_version, "metadata": meta}
        )
    cells = _encode(["", *(None for _ in spec.printer_columns)])
    head: JSON = {
        "kind": "Table",
        "apiVersion": output.api_version,
        "metadata": {"resourceVersion": str(rv)},
    }
    defs = columns(spec) if headers else b"null"
    row = b'{"cells":' + cells + b',"object":' + embedded + b"}"
    table = _encode(head)[:-1] + b',"columnDefinitions":' + defs + b',"rows":[' + row + b"]}"
    return event_line("BOOKMARK", table)


def render_object(
    spec: ResourceSpec, obj: JSON, raw: bytes | None, output: Output, include: str
) -> bytes:
    """One object in the negotiated shape (callers reject list-only shapes first)."""
    if output.kind == "PartialObjectMetadata":
        return partial_metadata(obj, output.api_version)
    if output.kind == "Table":
        return single_table(spec, obj, raw, output, include, headers=True)
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
