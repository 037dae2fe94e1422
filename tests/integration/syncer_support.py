"""What the syncer's integration tests run against: real local servers, no mocks.

* :func:`upstream_fake` — kcp's APIExport virtual workspace (:mod:`fakekcp`) with Widgets.
* :func:`downstream_fake` — a downstream "cluster": a second fake serving Widgets and Leases on
  ``<base>/clusters/down``, plus the core namespace and event endpoints the syncer uses there
  (the fake models only ``/apis``; these few routes are more explicit than its catch-all, so
  aiohttp's router picks them first).

The TCP relay the tests put in front of the downstream cluster (switched between forwarding and
refusing) is :class:`tests.support.relay.Relay`.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from fakekcp.store import ResourceSpec
from fakekcp.upstream import FakeUpstream, start_fake_upstream

DOWN_CLUSTER = "down"
WIDGETS = ResourceSpec()  # example.io/v1alpha1 widgets, namespaced, status subresource
#: Core Secrets: related objects (served by kcp's VW for an accepted permission claim).
SECRETS = ResourceSpec(
    group="", version="v1", plural="secrets", kind="Secret", status_subresource=False
)
LEASES = ResourceSpec(
    group="coordination.k8s.io",
    version="v1",
    plural="leases",
    kind="Lease",
    status_subresource=False,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def widget(name: str, *, ns: str = "ns1", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
        "spec": {"size": 1},
    }


def write_kubeconfig(path: Path, server: str, *, token: str = "t", ca: Path | None = None) -> None:
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )


@contextlib.asynccontextmanager
async def upstream_fake(
    *, ssl_context: Any = None, **kwargs: Any
) -> AsyncIterator[tuple[FakeUpstream, str]]:
    """The upstream VW and its URL (``…/services/apiexport/<id>/<export>``)."""
    fake = FakeUpstream(bookmark_interval=0.2, **kwargs)
    async with start_fake_upstream(fake, ssl_context=ssl_context) as (_, url):
        yield fake, url


class Namespaces:
    """The core namespace endpoints (get, list, create, delete) and events (create)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []

    def install(self, app: web.Application, prefix: str) -> None:
        collection = f"{prefix}/api/v1/namespaces"
        app.router.add_get(collection, self._list)
        app.router.add_post(collection, self._create)
        app.router.add_get(collection + "/{name}", self._get)
        app.router.add_delete(collection + "/{name}", self._delete)
        app.router.add_post(collection + "/{name}/events", self._event)

    async def _list(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "NamespaceList", "metadata": {}, "items": list(self.objects.values())}
        )

    async def _get(self, request: web.Request) -> web.Response:
        obj = self.objects.get(request.match_info["name"])
        if obj is None:
            return _status(404, "NotFound", f'namespaces "{request.match_info["name"]}" not found')
        return web.json_response(obj)

    async def _create(self, request: web.Request) -> web.Response:
        obj = await request.json()
        name = obj["metadata"]["name"]
        if name in self.objects:
            return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
        obj["metadata"]["uid"] = f"ns-{len(self.objects)}"
        self.objects[name] = obj
        return web.json_response(obj, status=201)

    async def _delete(self, request: web.Request) -> web.Response:
        obj = self.objects.pop(request.match_info["name"], None)
        if obj is None:
            return _status(404, "NotFound", "not found")
        return web.json_response(obj)

    async def _event(self, request: web.Request) -> web.Response:
        self.events.append(await request.json())
        return web.json_response({}, status=201)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)


@contextlib.asynccontextmanager
async def downstream_fake(
    *, resources: tuple[ResourceSpec, ...] = (), managed_fields: bool = False
) -> AsyncIterator[tuple[FakeUpstream, Namespaces, int, str]]:
    """The downstream cluster: ``(fake, namespaces, port, path)`` — its server URL is
    ``http://127.0.0.1:<port><path>`` (or a relay's port in front of it); ``resources``: served
    besides Widgets and Leases; ``managed_fields``: the fake writes them
    (:mod:`fakekcp.managed`)."""
    fake = FakeUpstream(
        resources=[WIDGETS, LEASES, *resources],
        bookmark_interval=0.2,
        managed_fields=managed_fields,
    )
    fake.bind(cluster=DOWN_CLUSTER)
    prefix = f"{fake.base_path}/clusters/{DOWN_CLUSTER}"
    namespaces = Namespaces()
    namespaces.install(fake.app, prefix)
    async with start_fake_upstream(fake) as (_, url):
        port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        yield fake, namespaces, port, prefix
