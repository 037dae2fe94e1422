"""Per-request state shared by the list, watch, read and write paths of the proxy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from multidict import CIMultiDict

from vwserver.cache.views import NAME, NAMESPACE, parse_field_selector
from vwserver.errors import BadGateway, BadRequest, SelectorError
from vwserver.holds import (
    Member,
    Peers,
    holder_label,
    leaving_safe,
    leaving_since,
    sees,
    slice_id,
)
from vwserver.k8s import kcp
from vwserver.k8s.status import not_found
from vwserver.k8s.types import ObjectMeta
from vwserver.metrics import UNKNOWN, ServerMetrics
from vwserver.proxy.filtering import Scope, UndecodableError, decode_head, object_key
from vwserver.proxy.negotiation import Representation, Shape
from vwserver.proxy.options import Options
from vwserver.proxy.paths import ApiRequest, SlicePath, Verb
from vwserver.proxy.upstream import UpstreamClient, forwarded_headers
from vwserver.proxy.yamlout import json_to_yaml
from vwserver.related import ClaimedView
from vwserver.routes import Route
from vwserver.selector import Selector

if TYPE_CHECKING:
    from vwserver.cache.registry import CacheRegistry
    from vwserver.cache.related_index import SliceReferences
log = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestRecord:
    """What the request's log line and metrics say about it; filled in as the request proceeds."""

    id: str
    started: float
    """``loop.time()`` when the handler started."""
    slice: str = UNKNOWN
    """``<cluster>/<name>`` once the slice is known to exist, else :data:`UNKNOWN`."""
    verb: str = UNKNOWN
    user: str | None = None
    """The authenticated user's name (never a credential); None before or without auth."""
    status: int | None = None
    """The status of the response whose headers went out (streamed responses), else None."""
    headers_sent: float | None = None
    """``loop.time()`` when the response headers went out (a watch is established)."""


class WriteTarget(Protocol):
    """What the pure rules of a guarded write read of a request (:mod:`vwserver.proxy.
    write_plan`, :mod:`vwserver.proxy.holding`): the object addressed, the slice and its
    membership. :class:`ProxyRequest` is one; the rules' table tests build small ones."""

    @property
    def api(self) -> ApiRequest: ...

    @property
    def route(self) -> Route: ...

    @property
    def member(self) -> Member: ...

    @property
    def records_holds(self) -> bool: ...


@dataclass(slots=True)
class ProxyRequest:
    request: web.Request
    route: Route
    path: SlicePath
    api: ApiRequest
    options: Options
    """The checked query (:mod:`vwserver.proxy.options`); the client's raw query is never used."""
    representation: Representation
    """What the client asked for (:mod:`vwserver.proxy.negotiation`)."""
    upstream: UpstreamClient
    page_size: int
    upstream_base: str
    """The upstream APIExport virtual-workspace URL this request goes to (its shard's)."""
    metrics: ServerMetrics
    record: RequestRecord
    closing: asyncio.Event
    """Set when the server stops serving (graceful shutdown): open watches end cleanly."""
    peers: Peers = field(default=lambda _sid: None)
    """The current selector of every slice this server serves, by id (membership depends on
    the slices that hold an object, :mod:`vwserver.holds`)."""
    unrecorded_move: Callable[[], None] | None = None
    """Told when a read finds an object leaving the slice whose move is not recorded yet
    (:meth:`vwserver.controller.handoff.Handoff.wake`)."""
    records_holds: bool = False
    """Whether finalizers added through this slice are recorded as its holds: only where the
    slice's reads come from the shared cache, whose views can show an object leaving it."""
    cache: CacheRegistry | None = None
    mutating_admission: bool = False
    """The provider's workspace may run mutating admission on these resources (config
    ``mutatingAdmission``): patches keep their dry run."""
    """The shared watch cache (None: not used), for the proxy's own checks of a write."""
    claimed: ClaimedView | None = None
    """Set for a resource of the export's permission claims: its membership is the slice's
    related-resource rules (:mod:`vwserver.related`)."""
    references: SliceReferences | None = None
    """The slice's live reference index, when a ``referencedBy`` rule decides ``claimed``."""
    member: Member = field(init=False)
    """The slice as the membership function sees it (built once: every object a request reads
    is checked against it)."""

    def __post_init__(self) -> None:
        route = self.route
        self.member = Member(
            selector=route.selector,
            id=slice_id(route.cluster, route.name),
            peers=self.peers,
            unrecorded=self.unrecorded_move,
            claimed=self.claimed,
        )

    @property
    def cluster_base(self) -> str:
        return kcp.clusters(self.upstream_base, self.path.cluster)

    @property
    def upstream_url(self) -> str:
        """The classified request's canonical path below the upstream virtual workspace."""
        return f"{self.cluster_base}{self.api.path}"

    @property
    def collection_url(self) -> str:
        return f"{self.cluster_base}{self.api.collection_path}"

    def item_url(self, *, namespace: str, name: str) -> str:
        """Another object of the same resource (e.g. one item of a collection)."""
        api = replace(self.api, namespace=namespace, name=name, subresource="")
        return f"{self.cluster_base}{api.object_path}"

    @property
    def object_url(self) -> str:
        """URL of the named object itself (without subresource), for the proxy's own checks."""
        return f"{self.cluster_base}{self.api.object_path}"

    def sees(self, meta: ObjectMeta) -> bool:
        """Whether the slice sees the object with ``meta`` (:func:`vwserver.holds.sees`)."""
        return sees(
            self.member,
            labels=meta.labels,
            annotations=meta.annotations,
            finalizers=meta.finalizers,
            key=object_key(meta),
        )

    def leaving(self, meta: ObjectMeta) -> str | None:
        """When the object with ``meta`` started leaving the slice (``""``: not recorded yet);
        None when it is not leaving (:func:`vwserver.holds.leaving_since`)."""
        return leaving_since(
            self.member,
            labels=meta.labels,
            annotations=meta.annotations,
            finalizers=meta.finalizers,
        )

    @property
    def table(self) -> bool:
        """The client negotiated Tables: the upstream answers with Tables whose rows embed the
        objects (every decoder is told so, :mod:`vwserver.proxy.filtering`)."""
        return self.representation.shape is Shape.TABLE

    @property
    def scope(self) -> Scope:
        """What this request addresses (:class:`~vwserver.proxy.filtering.Scope`): the path's
        logical cluster and namespace, the named object's name — or the namespace and name a
        list's or watch's ``fieldSelector`` pins (a selector kcp refuses pins nothing)."""
        api = self.api
        namespace, name = api.namespace, api.name
        if api.verb in (Verb.LIST, Verb.WATCH, Verb.DELETECOLLECTION) and (
            text := self.options.get("fieldSelector")
        ):
            try:
                fields = parse_field_selector(text)
            except BadRequest:
                fields = None
            if fields is not None:
                namespace = namespace or fields.requires(NAMESPACE) or ""
                name = name or fields.requires(NAME) or ""
        return Scope(cluster=self.path.cluster, namespace=namespace, name=name)

    @property
    def membership(self) -> bool:
        """Whether the slice's membership decides what this request reads: not for the
        read-only apibindings, the consumer workspace's own objects (they carry no slice
        labels) — for them only the request's :attr:`scope` is checked."""
        return not self.api.is_apibindings

    def check_answer(
        self,
        status: int,
        body: bytes,
        *,
        scope: Scope | None = None,
        status_ok: bool = False,
        written: bool = True,
    ) -> None:
        """A write's successful answer must be the object written, in ``scope`` (by default
        the request's :attr:`scope`); ``status_ok``: a ``Status`` may answer instead (a DELETE
        of an object that is gone); ``written``: False for a dry run. A dry run that creates
        (a POST, or an apply — also one whose object was deleted since the proxy read it:
        kcp v0.32 then answers 200 or 201) answers with an object kcp did not store; kcp
        writes ``kcp.io/cluster`` when it stores an object, so that answer carries none, and
        for a dry run only an answer naming another cluster is refused. kcp never answers with
        anything else; when it does (an upstream bug, a shard mix-up) the write was carried
        out, but its answer is not forwarded: 502, counted and logged without any of its
        content."""
        done = (
            "the write may have been carried out upstream: read the object again"
            if written
            else "nothing was written (a dry run)"
        )
        if status not in (200, 201, 202):
            return  # an error Status, relayed as it is
        try:
            head = decode_head(body)
        except UndecodableError as e:
            raise BadGateway(
                f"the upstream's answer to the {self.api.verb} is not an object ({e}); {done}"
            ) from e
        if status_ok and head.kind == "Status" and head.apiVersion == "v1":
            return
        scope = scope or self.scope
        if not written and kcp.CLUSTER_ANNOTATION not in (head.metadata.annotations or {}):
            scope = replace(scope, cluster="*")
        if not scope.admits(head.metadata):
            self.out_of_scope()
            raise BadGateway(
                f"the upstream answered the {self.api.verb} of {self.api.resource} with an "
                f"object outside the request's scope (another logical cluster, namespace or "
                f"name); {done}"
            )

    def out_of_scope(self, count: int = 1) -> None:
        """Count (and log, without any of their content) objects the upstream sent outside
        this request's :attr:`scope`; they are not forwarded."""
        if count <= 0:
            return
        self.metrics.upstream_out_of_scope.labels(self.record.slice, self.api.verb).inc(count)
        log.warning(
            "upstream sent %d object(s) outside the request's scope (cluster %s, namespace %r, "
            "name %r) for %s of %s: not forwarded",
            count,
            self.path.cluster,
            self.api.namespace,
            self.api.name,
            self.api.verb,
            self.api.resource,
        )

    def upstream_headers(self, *, content_type: str | None = None) -> CIMultiDict[str]:
        """Headers for an upstream request: the allow-listed client headers, the one
        representation the proxy chose, and the content type the proxy checked."""
        return forwarded_headers(
            self.request.headers,
            accept=self.representation.upstream_accept,
            content_type=content_type,
        )

    def effective_selector(self) -> Selector:
        """The slice's selector AND the client's ``labelSelector`` (400 if that is malformed)."""
        return self.route.selector & self.client_selector()

    def client_selector(self) -> Selector:
        """The client's own ``labelSelector`` (400 if it is malformed)."""
        text = self.options.get("labelSelector")
        try:
            return Selector.parse(text or "")
        except SelectorError as e:
            raise BadRequest(e.message) from e  # the message names labelSelector

    def leaving_safe_selector(self) -> Selector:
        """What of the client's own ``labelSelector`` kcp may be asked with for a slice that
        records holds: its requirements on keys the slice's selector does not name. An object
        leaving the slice is matched by the labels it had before it left
        (:func:`vwserver.holds.client_labels`), and a move changes the slice's own labels —
        a requirement on them pushed down would keep the leaving object from the answer; the
        proxy matches the whole selector itself."""
        return leaving_safe(self.client_selector(), slice_selector=self.route.selector)

    def held_selector(self) -> Selector:
        """What kcp is asked with for the objects this slice holds: its holder label
        (:func:`vwserver.holds.holder_label`) and the client's :meth:`leaving_safe_selector`."""
        return Selector.parse(holder_label(self.member.id)) & self.leaving_safe_selector()

    @property
    def strip_objects(self) -> bool:
        """A Table without embedded objects was asked for: the proxy fetches rows with their
        metadata (it needs the labels) and removes the objects before answering."""
        return (
            self.representation.shape is Shape.TABLE and self.options.get("includeObject") == "None"
        )

    def upstream_query(
        self,
        *,
        drop: Iterable[str] = (),
        extra: Iterable[tuple[str, str]] = (),
        push_selector: bool = True,
    ) -> list[tuple[str, str]]:
        """The checked query with the effective selector pushed down (reads and
        deletecollection; not for apibindings, which are no slice's) and what the proxy must
        see of each object made sure of."""
        dropped = {"labelSelector", *drop} if push_selector else set(drop)
        api = self.api
        if api.verb is Verb.GET:
            dropped.add("watch")  # ignored by a GET of one object; never forwarded
        if self.strip_objects:
            dropped.add("includeObject")
        out = self.options.without(*dropped)
        if push_selector and api.verb in (Verb.LIST, Verb.WATCH, Verb.DELETECOLLECTION):
            rendered = self.effective_selector().render()
            if rendered:
                out.append(("labelSelector", rendered))
        if api.verb is Verb.WATCH and "watch" not in self.options:
            out.append(("watch", "true"))  # a deprecated /watch/ path, sent as a watch
        if api.legacy_watch and api.name:
            out = [(k, v) for k, v in out if k != "fieldSelector"]
            out.append(("fieldSelector", self._name_field_selector()))
        if self.strip_objects:
            out.append(("includeObject", "Metadata"))
        out.extend(extra)
        return out

    def _name_field_selector(self) -> str:
        """A watch of one object by a deprecated ``/watch/<name>`` path is a watch with
        ``fieldSelector=metadata.name=<name>``; a client's own field selector must agree
        (the apiserver's rule, with its message)."""
        wanted = f"metadata.name={self.api.name}"
        given = self.options.get("fieldSelector")
        if given and given not in (wanted, f"metadata.name=={self.api.name}"):
            raise BadRequest("fieldSelector metadata.name doesn't match requested name")
        return wanted

    def not_found(self) -> web.Response:
        """The apiserver's NotFound for this object, for missing and invisible objects alike."""
        body = not_found(resource=self.api.resource, group=self.api.group, name=self.api.name)
        if self.representation.yaml:
            return web.Response(
                status=404, body=json_to_yaml(body), content_type="application/yaml"
            )
        return web.Response(status=404, body=body, content_type="application/json")
