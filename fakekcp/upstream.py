"""A fake kcp APIExport virtual workspace: a real aiohttp server for tests and benchmarks.

Why it exists: vwserver sits in front of kcp's APIExport virtual workspace, and most of what can go
wrong in a filtering proxy — paging, resourceVersion semantics, label-selector watches that must
turn "stopped matching" into DELETED, bookmarks, 410s, write preconditions, error pass-through —
can be exercised in milliseconds against an in-process upstream instead of minutes against kcp.
That only helps if the fake behaves like the real thing, so it follows the apiserver's code paths
(cited in comments, checked against k8s.io/apiserver and kcp's virtual-workspace-framework) and
kcp's own rules for the ``clusters/*`` wildcard and for APIBindings. It also has what kcp cannot
offer: fault injection (:class:`Faults`), a record of every request the proxy forwarded, and a
preloaded store for benchmarks (``python -m fakekcp.upstream --objects 100000``).

URL layout (one APIExport)::

    /services/apiexport/<export-cluster>/<export-name>/clusters/<cluster-id | *>/<API path>

Deliberate choices where kcp or the apiserver left room (see also the module docstrings of
:mod:`~fakekcp.store` and :mod:`~fakekcp.render`):

* Per-cluster resource requests need an APIBinding to the export in that cluster (kcp's
  ``boundAPIAuthorizer``); without one they are 403. :meth:`FakeUpstream.create` and
  :meth:`FakeUpstream.bulk_load` bind the cluster automatically; :meth:`FakeUpstream.bind` does it
  explicitly, and deleting the APIBinding unbinds.
* Writes to APIBindings in a cluster are 403 (kcp's authorizer: "write access to APIBinding is not
  allowed from virtual workspace"); on ``clusters/*`` they are 405 (the read-only storage).
* On ``clusters/*`` every verb but list/watch is 405 "... in the `*` logical cluster" (kcp's
  ``WithWildcardListWatchGuard``); a namespaced list/watch there is 400 without a reason (kcp's
  forwarding registry), and a namespaced resource addressed without a namespace is 400 likewise.
* ``application/strategic-merge-patch+json`` is 415, as kcp and the CRD handler answer for custom
  resources (strategic merge needs Go struct tags a CRD does not have).
* Only JSON is served; protobuf/YAML ``Accept`` clauses are skipped (406 if nothing else fits).
* With ``gzip=True`` every LIST is compressed when the client accepts gzip (the apiserver only
  compresses bodies over 128 KiB; always compressing keeps small test lists meaningful).
* Server-side apply merges the applied configuration like a JSON merge patch (no conflict
  detection); a missing object is created, as in kcp's forwarding registry. ``managedFields``
  are written only with ``managed_fields=True``, as a model (:mod:`fakekcp.managed`).
* Namespaces are not modelled: any namespace exists.

Layout: this module is the public face (:class:`FakeUpstream`, :func:`start_fake_upstream`, the
CLI); ``fake_http`` routes and serves the verbs, ``fake_watch`` streams watches, ``fake_store``
holds objects, history and the CRD write strategy, ``fake_render`` the wire shapes,
``fake_requests`` request decoding and kcp's refusals, ``fake_status`` the Status errors and
``fake_patch`` merge/JSON patch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from fakekcp.auth import FakeAuth
from fakekcp.http import Handlers
from fakekcp.requests import (
    Faults,
    RecordedRequest,
    binds_export,
    error_response,
    fault_error,
)
from fakekcp.status import FakeApiError, not_found_error
from fakekcp.store import (
    APIBINDINGS,
    JSON,
    Key,
    ResourceSpec,
    Store,
    copy_json,
    now_rfc3339,
)

__all__ = [
    "FakeApiError",
    "FakeUpstream",
    "Faults",
    "RecordedRequest",
    "ResourceSpec",
    "demo_objects",
    "start_fake_upstream",
]


class FakeUpstream:
    """An in-memory APIExport VW; mount :attr:`app` or serve it with :func:`start_fake_upstream`.

    The store methods below change the store like a controller writing through the apiserver
    would (each bumps the global resourceVersion and notifies watchers), but skip request-level
    rules so tests can set up any state: they may set ``status`` on create and ignore
    ``metadata.resourceVersion`` on update, and :meth:`delete` removes objects even with
    finalizers. They must be called on the event loop's thread.
    """

    def __init__(
        self,
        *,
        export_cluster: str = "exportid",
        export_name: str = "widgets.example.io",
        resources: Sequence[ResourceSpec] | None = None,
        bookmark_interval: float = 1.0,
        history_size: int = 10_000,
        gzip: bool = False,
        managed_fields: bool = False,
    ) -> None:
        specs = list(resources) if resources is not None else [ResourceSpec()]
        if not any((s.group, s.plural) == (APIBINDINGS.group, APIBINDINGS.plural) for s in specs):
            specs.append(APIBINDINGS)
        self.export_cluster = export_cluster
        self.export_name = export_name
        self.bookmark_interval = bookmark_interval
        self.gzip = gzip
        #: Write ``metadata.managedFields`` (:mod:`fakekcp.managed`; off: kcp's bytes matter).
        self.managed_fields = managed_fields
        self.faults = Faults()
        self._store = Store(specs, history_size=history_size)
        self._handlers = Handlers(self, self._store)
        self.app = web.Application(middlewares=[self._faults_middleware])
        self.app.router.add_route(
            "*", self.base_path + "/clusters/{cluster}/{tail:.*}", self._handlers.handle
        )
        self.app.on_shutdown.append(self._on_shutdown)

    @property
    def base_path(self) -> str:
        return f"/services/apiexport/{self.export_cluster}/{self.export_name}"

    @property
    def active_watches(self) -> int:
        """Watch responses currently streaming (to check that clients close theirs)."""
        return self._handlers.active_watches

    @property
    def watch_write_backlog(self) -> int:
        """Bytes of watch responses written but not yet taken by the reader (its socket buffer
        plus ours): grows when whoever reads the watch stops reading."""
        return sum(
            r.transport.get_write_buffer_size()
            for r in self._handlers.watch_requests.values()
            if r.transport is not None
        )

    @property
    def resource_version(self) -> int:
        """The store's current (global) resourceVersion."""
        return self._store.rv

    # --- Python store API ------------------------------------------------------------------------

    def create(self, *, cluster: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create *obj* (status may be set); raises :class:`FakeApiError` 409 if it exists."""
        spec = self._store.spec_for_object(obj)
        self._ensure_bound(spec, cluster)
        namespace = (obj.get("metadata") or {}).get("namespace", "") if spec.namespaced else ""
        if spec.namespaced and not namespace:
            raise ValueError("a namespaced object needs metadata.namespace")
        obj = copy_json(obj)
        obj.setdefault("metadata", {}).pop("resourceVersion", None)
        created, _ = self._store.create(spec, cluster, namespace, obj, strategy=False)
        return copy_json(created)

    def update(self, *, cluster: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace an object wholesale (status included); generation follows the CRD strategy."""
        spec = self._store.spec_for_object(obj)
        meta = obj.get("metadata") or {}
        key: Key = (
            cluster,
            meta.get("namespace", "") if spec.namespaced else "",
            meta.get("name", ""),
        )
        obj = copy_json(obj)
        obj.setdefault("metadata", {}).pop("resourceVersion", None)
        updated, _ = self._store.update(spec, key, obj, strategy=False, require_rv=False)
        return copy_json(updated)

    def delete(self, *, cluster: str, namespace: str, name: str, resource: str = "widgets") -> None:
        """Remove an object now, finalizers or not; raises :class:`FakeApiError` 404 if absent."""
        spec = self._store.spec_by_plural(resource)
        key: Key = (cluster, namespace if spec.namespaced else "", name)
        if self._store.get(spec, key) is None:
            raise not_found_error(spec.group, spec.plural, name)
        self._store.commit_delete(spec, key)

    def get(
        self, *, cluster: str, namespace: str, name: str, resource: str = "widgets"
    ) -> dict[str, Any] | None:
        spec = self._store.spec_by_plural(resource)
        stored = self._store.get(spec, (cluster, namespace if spec.namespaced else "", name))
        return None if stored is None else copy_json(stored.obj)

    def bulk_load(self, *, cluster: str, objects: Iterable[dict[str, Any]]) -> None:
        """Create many objects fast (one encode each, one sort); for large benchmark stores."""
        created = now_rfc3339()
        batches: dict[ResourceSpec, list[tuple[Key, JSON]]] = {}
        for source in objects:
            spec = self._store.spec_for_object(source)
            obj = copy_json(source)
            meta = obj.setdefault("metadata", {})
            namespace = meta.get("namespace", "") if spec.namespaced else ""
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=created, generation=1)
            meta.setdefault("annotations", {})["kcp.io/cluster"] = cluster
            batches.setdefault(spec, []).append(((cluster, namespace, meta["name"]), obj))
        for spec, items in batches.items():
            self._ensure_bound(spec, cluster)
            self._store.bulk_put(spec, items)

    def bind(self, *, cluster: str) -> dict[str, Any]:
        """Give *cluster* an APIBinding to this export (a no-op if it has one)."""
        for stored in self._store.objects(APIBINDINGS, cluster):
            if binds_export(stored.obj, self.export_name):
                return copy_json(stored.obj)
        binding = {
            "apiVersion": APIBINDINGS.api_version,
            "kind": APIBINDINGS.kind,
            "metadata": {"name": self.export_name},
            "spec": {
                "reference": {"export": {"path": self.export_cluster, "name": self.export_name}}
            },
            "status": {
                "phase": "Bound",
                "apiExportClusterName": self.export_cluster,
                "boundResources": [
                    {"group": s.group, "resource": s.plural, "storageVersions": [s.version]}
                    for s in self._store.specs
                    if s is not APIBINDINGS
                ],
            },
        }
        created, _ = self._store.create(APIBINDINGS, cluster, "", binding, strategy=False)
        return copy_json(created)

    def _ensure_bound(self, spec: ResourceSpec, cluster: str) -> None:
        if spec is not APIBINDINGS and not self.is_bound(cluster):
            self.bind(cluster=cluster)

    def is_bound(self, cluster: str) -> bool:
        """Whether *cluster* has an APIBinding to this export."""
        return any(
            binds_export(s.obj, self.export_name) for s in self._store.objects(APIBINDINGS, cluster)
        )

    # --- HTTP plumbing -------------------------------------------------------------------------

    @web.middleware
    async def _faults_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        faults = self.faults
        faults.requests.append(
            RecordedRequest(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                headers=CIMultiDictProxy(CIMultiDict(request.headers)),
                body=await request.read(),
            )
        )
        if faults.delay:
            await asyncio.sleep(faults.delay)
        if faults.unreachable and request.transport is not None:
            request.transport.abort()
            return web.Response()
        if faults.status_code is not None:
            return error_response(fault_error(faults.status_code))
        return await handler(request)

    async def _on_shutdown(self, _app: web.Application) -> None:
        self._handlers.closing = True
        self._store.close_watchers()


@contextlib.asynccontextmanager
async def start_fake_upstream(
    fake: FakeUpstream | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[tuple[FakeUpstream, str]]:
    """Serve *fake* (default: a new :class:`FakeUpstream`) on *host*:*port* (0: a free port).

    Yields ``(fake, base_url)`` where *base_url* is the virtual workspace URL an
    APIExportEndpointSlice would list, e.g. ``http://127.0.0.1:PORT/services/apiexport/ID/NAME``.
    """
    fake = fake if fake is not None else FakeUpstream()
    # Handler cancellation ends a watch as soon as its client disconnects.
    runner = web.AppRunner(
        fake.app, shutdown_timeout=5.0, handler_cancellation=True, access_log=None
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        scheme = "https" if ssl_context is not None else "http"
        yield fake, f"{scheme}://{bound_host}:{bound_port}{fake.base_path}"
    finally:
        await runner.cleanup()


def demo_objects(count: int, *, clusters: int, namespaces: int) -> dict[str, list[JSON]]:
    """Widgets for benchmarks, by cluster: env=prod|dev and region=eu|us alternate."""
    by_cluster: dict[str, list[JSON]] = {f"cluster-{c}": [] for c in range(clusters)}
    for i in range(count):
        by_cluster[f"cluster-{i % clusters}"].append(
            {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {
                    "name": f"widget-{i:06d}",
                    "namespace": f"ns-{(i // clusters) % namespaces}",
                    "labels": {"env": ("prod", "dev")[i % 2], "region": ("eu", "us")[(i // 2) % 2]},
                },
                "spec": {"size": i % 100, "color": ("red", "green", "blue")[i % 3]},
            }
        )
    return by_cluster


async def _serve(args: argparse.Namespace) -> None:
    fake = FakeUpstream(
        gzip=args.gzip, bookmark_interval=args.bookmark_interval, history_size=args.history_size
    )
    for cluster, objects in demo_objects(
        args.objects, clusters=args.clusters, namespaces=args.namespaces
    ).items():
        fake.bulk_load(cluster=cluster, objects=objects)
    if args.user:
        # kcp's review endpoints too, so that a vwserver in front of this fake can authenticate
        # and authorize its callers (benchmarks measure the proxy with its guard on).
        token, _, grant = args.user.partition("@")
        cluster, _, slice_name = grant.partition("/")
        auth = FakeAuth()
        auth.add_user(token, "bench-user")
        auth.grant(cluster=cluster, slice_name=slice_name, user="bench-user")
        auth.install(fake.app)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with start_fake_upstream(fake, host=args.host, port=args.port) as (_, url):
        print(url, flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a fake kcp APIExport virtual workspace.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--objects", type=int, default=10_000, help="widgets to preload")
    parser.add_argument(
        "--user",
        metavar="TOKEN@CLUSTER/SLICE",
        help="also answer TokenReviews/SubjectAccessReviews: TOKEN may use that slice",
    )
    parser.add_argument("--clusters", type=int, default=4)
    parser.add_argument("--namespaces", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="gzip LIST responses")
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    parser.add_argument("--history-size", type=int, default=10_000)
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
