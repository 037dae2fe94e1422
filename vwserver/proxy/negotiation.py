"""Which representation a client asked for — pure, no I/O.

The apiserver serves one object in several shapes, chosen by the ``Accept`` header: the object
itself (JSON, YAML; protobuf only for built-in types), a ``meta.k8s.io`` ``Table`` (what
``kubectl get`` asks for), and ``PartialObjectMetadata`` / ``PartialObjectMetadataList`` (what
metadata informers ask for). Each shape puts an object's labels in a different place, and the
filter must know where to look, so the proxy parses ``Accept`` into one :class:`Representation`
from an allow-list and sends the upstream exactly that one choice (always as JSON, because the
proxy reads what it forwards). An ``Accept`` naming nothing the proxy understands is refused
with 406 before anything reaches the upstream; so is a shape the verb cannot produce (e.g.
``PartialObjectMetadataList`` for a GET of one object), which the apiserver would otherwise refuse
only *after* fetching the object — an answer that would differ for a missing object.

Protobuf entries are read as their JSON equivalent: custom resources have no protobuf encoding,
and client-go reads whatever ``Content-Type`` the response carries.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum

from vwserver.errors import NotAcceptable
from vwserver.proxy.paths import Verb

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")


class Shape(StrEnum):
    OBJECT = ""
    TABLE = "Table"
    PARTIAL = "PartialObjectMetadata"
    PARTIAL_LIST = "PartialObjectMetadataList"


@dataclass(frozen=True, slots=True)
class Representation:
    shape: Shape = Shape.OBJECT
    version: str = ""
    """``meta.k8s.io`` version of a Table/PartialObjectMetadata shape (``v1``/``v1beta1``)."""
    yaml: bool = False
    """The client wants YAML; the proxy reads JSON upstream and converts."""
    discovery_accept: str = ""
    """For discovery documents: the client's Accept, rebuilt from its allow-listed entries."""

    @property
    def upstream_accept(self) -> str:
        """The one ``Accept`` value sent upstream for this representation."""
        if self.discovery_accept:
            return self.discovery_accept
        if self.shape is Shape.OBJECT:
            return JSON
        return f"{JSON};as={self.shape};v={self.version};g={META_GROUP}"


PLAIN = Representation()

# Which shapes each read verb can produce (the apiserver's transformObject: a list target for a
# collection, an element target for one object or a watch event; Table for both).
_SHAPES: dict[Verb, frozenset[Shape]] = {
    Verb.GET: frozenset({Shape.OBJECT, Shape.TABLE, Shape.PARTIAL}),
    Verb.LIST: frozenset({Shape.OBJECT, Shape.TABLE, Shape.PARTIAL_LIST}),
    Verb.WATCH: frozenset({Shape.OBJECT, Shape.TABLE, Shape.PARTIAL}),
    Verb.DELETECOLLECTION: frozenset({Shape.OBJECT}),
}
_MAX_ENTRIES = 32


def negotiate(accept: str | None, *, verb: Verb) -> Representation:
    """The representation for ``verb`` chosen from the client's ``Accept`` header.

    Writes answer with the object (or a Status); their ``Accept`` only has to allow JSON.
    """
    if not accept or not accept.strip():
        return PLAIN
    return _negotiate(accept, verb)


# Clients send few distinct Accept values (each client library and kubectl command has its
# fixed one), parsing one costs tens of microseconds (kubectl's three entries), and the answer
# depends on nothing else: answers are remembered, refusals (exceptions) are not.
@functools.lru_cache(maxsize=256)
def _negotiate(accept: str, verb: Verb) -> Representation:
    entries = [e for e in accept.split(",") if e.strip()]
    if len(entries) > _MAX_ENTRIES:
        raise NotAcceptable(f"Accept header has more than {_MAX_ENTRIES} media types")
    allowed = _SHAPES.get(verb, frozenset({Shape.OBJECT}))
    candidates: list[tuple[float, int, Representation]] = []
    for index, entry in enumerate(entries):
        parsed = _parse_entry(entry)
        if parsed is None:
            continue
        quality, rep = parsed
        if quality <= 0 or rep.shape not in allowed:
            continue
        if rep.yaml and verb not in (Verb.GET, Verb.LIST):
            # YAML has no streaming encoding (the apiserver refuses it for watches), and writes
            # answer in JSON here.
            continue
        candidates.append((-quality, index, rep))
    if not candidates:
        raise NotAcceptable(
            f"none of the media types in the Accept header can be served for {verb}; "
            f"use {JSON}, {YAML} (get and list), or {JSON};as=Table|PartialObjectMetadata"
            f"[List];v=v1;g={META_GROUP}"
        )
    return min(candidates, key=lambda c: (c[0], c[1]))[2]


def _parse_entry(entry: str) -> tuple[float, Representation] | None:
    media, *raw_params = (p.strip() for p in entry.split(";"))
    media = media.lower()
    params: dict[str, str] = {}
    for raw in raw_params:
        key, sep, value = raw.partition("=")
        if not sep:
            return None
        params[key.strip().lower()] = value.strip().strip('"')
    try:
        quality = float(params.pop("q", "1"))
    except ValueError:
        return None
    params.pop("charset", None)
    params.pop("stream", None)  # protobuf watch framing; the proxy answers JSON lines
    if media in ("*/*", "application/*", JSON, PROTOBUF):
        shape_name = params.pop("as", "")
        if not shape_name:
            if params.keys() - {"g", "v"}:
                return None
            return quality, PLAIN
        try:
            shape = Shape(shape_name)
        except ValueError:
            return None
        version, group = params.pop("v", ""), params.pop("g", "")
        if params or group != META_GROUP or version not in META_VERSIONS:
            return None
        return quality, Representation(shape=shape, version=version)
    if media == YAML and not params:
        return quality, Representation(yaml=True)
    return None


# Discovery documents are the export's schema, not objects: what matters is that only well-formed
# media types from this list reach the upstream (aggregated discovery, OpenAPI v2/v3 protobuf).
_DISCOVERY_MEDIA = frozenset(
    {
        "*/*",
        "application/*",
        JSON,
        PROTOBUF,
        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        "application/com.github.proto-openapi.spec.v3@v1.0+protobuf",
    }
)
_DISCOVERY_PARAMS = frozenset({"as", "g", "v", "q", "charset"})
_TOKEN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def negotiate_discovery(accept: str | None) -> Representation:
    """A discovery request's Accept, rebuilt from its allow-listed entries (JSON if none)."""
    kept: list[str] = []
    for entry in (accept or "").split(",")[:_MAX_ENTRIES]:
        media, *raw_params = (p.strip() for p in entry.split(";"))
        if media.lower() not in _DISCOVERY_MEDIA:
            continue
        params = []
        for raw in raw_params:
            key, sep, value = (x.strip() for x in raw.partition("="))
            if not sep or key not in _DISCOVERY_PARAMS or not value or set(value) - _TOKEN:
                break
            params.append(f"{key}={value}")
        else:
            kept.append(";".join([media.lower(), *params]))
    return Representation(discovery_accept=",".join(kept) or JSON)
