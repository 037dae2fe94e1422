"""Fixtures: a real fake upstream (aiohttp server) and a real vwserver in front of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.support.go_binaries import helm, pytest_collection_finish
from tests.support.serve import NO_AUTH, serve_app
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app

__all__ = ["helm", "pytest_collection_finish"]

SLICE_CLUSTER = "slicews"
CLUSTERS = ("c1", "c2")
PROXY_TOKEN = "vwserver-own-token"


def widget(name: str, *, ns: str = "ns1", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
        "spec": {"size": 1, "secret": f"spec-of-{name}"},
    }


@dataclass
class Env:
    fake: FakeUpstream
    upstream_base: str
    proxy_base: str
    session: aiohttp.ClientSession
    routes: Routes

    def slice_url(self, name: str = "prod", cluster: str = "*") -> str:
        prefix = f"{self.proxy_base}/services/filtered-apiexport/{SLICE_CLUSTER}"
        return f"{prefix}/{name}/clusters/{cluster}"

    def widgets(self, name: str = "prod", cluster: str = "c1", ns: str | None = "ns1") -> str:
        base = self.slice_url(name, cluster) + "/apis/example.io/v1alpha1"
        return f"{base}/namespaces/{ns}/widgets" if ns else f"{base}/widgets"

    async def get_json(self, url: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.session.get(url, **kwargs) as r:
            return r.status, json.loads(await r.read())


def routes_for(upstream_url: str) -> RouteTable:
    return RouteTable(
        [
            Route(
                cluster=SLICE_CLUSTER,
                name="prod",
                selector=Selector.from_label_selector({"matchLabels": {"env": "prod"}}),
                upstream_url=upstream_url,
            ),
            Route(
                cluster=SLICE_CLUSTER,
                name="eu-not-dev",
                selector=Selector.from_label_selector(
                    {
                        "matchLabels": {"region": "eu"},
                        "matchExpressions": [
                            {"key": "env", "operator": "NotIn", "values": ["dev"]}
                        ],
                    }
                ),
                upstream_url=upstream_url,
            ),
            Route(
                cluster=SLICE_CLUSTER,
                name="broken",
                selector=Selector.parse("env=prod"),
                upstream_url=upstream_url,
                not_ready="APIExport root:nowhere/widgets.example.io not found",
            ),
        ]
    )


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with start_fake_upstream(FakeUpstream(bookmark_interval=0.2, history_size=20)) as (
        fake,
        vw_url,
    ):
        for cluster in CLUSTERS:
            for i, (env_, region) in enumerate(
                [("prod", "eu"), ("dev", "eu"), ("prod", "us"), ("dev", "us"), ("prod", "eu")]
            ):
                fake.create(
                    cluster=cluster,
                    obj=widget(f"w{i}", ns="ns1" if i < 3 else "ns2", env=env_, region=region),
                )
        routes = Routes(routes_for(vw_url))
        origin = vw_url.removesuffix(fake.base_path)
        app = build_app(
            routes=routes,
            upstream=UpstreamClient(auth=ClientAuth(server=origin, token=PROXY_TOKEN)),
            page_size=2,
            guard=NO_AUTH,
        )
        async with (
            serve_app(app) as proxy,
            aiohttp.ClientSession(read_bufsize=2**23) as session,
        ):
            yield Env(fake, vw_url, proxy, session, routes)
