"""The syncer (``vwserver sync``, issue #6) against real kcp.

Setup, once per module on the session's kcp, with workspace names unique to this run: a provider
exporting the MongoDBCommunity-like API of ``config/syncer/provider.yaml``, two consumers binding
it, and a *downstream* workspace holding the plain CRD of ``config/syncer/downstream-crd.yaml`` —
the downstream "cluster". A small test operator (an asyncio task) plays the MongoDB operator
there: it puts its own finalizer on every copy (so deletion has to wait for it), sets
``status.phase=Running``, the version, the member count and an internal ``mongoUri``, and releases
its finalizer a moment after a copy is deleted.

Syncers run in-process (:class:`vwserver.syncer.runner.Syncer`) with leader election on. The
region tests put vwserver's filtering proxy in front of the export with static routes for
``region=eu`` and ``region=us`` slices, as tests/e2e/test_proxy_kcp.py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import (
    Workspace,
    apply_retrying,
    get_field,
    poll,
    wait_workspace_ready,
)
from devenv.kcp import KcpInstance
from devenv.kubeapi import KubeAPIServer
from tests.e2e.controller_env import until
from tests.e2e.credentials import (
    exec_runs,
    in_cluster,
    service_account_token,
    write_exec_kubeconfig,
)
from tests.support.rest import RestCalls
from tests.support.serve import NO_AUTH, serve_app
from tests.support.watches import recording
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app
from vwserver.syncer.config import parse_syncer_config
from vwserver.syncer.naming import (
    ANN_CLUSTER,
    LABEL_SYNCER,
    downstream_namespace,
    finalizer,
)
from vwserver.syncer.runner import Syncer

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "config" / "syncer"
EXPORT = "mongodbcommunity.mongodb.com"
API = "apis/mongodbcommunity.mongodb.com/v1"
PLURAL = "mongodbcommunity"
OPERATOR_FINALIZER = "mongodb.example.io/operator"
PREFIX = "kcp-"
WAIT = 45.0  # seconds for one expected convergence
SETUP = 120.0

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# The env


@dataclass
class SyncWorld(RestCalls):
    kcp: KcpInstance
    provider: Workspace
    consumers: dict[str, Workspace]
    downstream: Workspace
    """The downstream cluster: a kcp workspace, or a real kube-apiserver (see ``_setup``)."""
    vw_url: str
    dir: Path
    session: aiohttp.ClientSession
    #: The downstream's admin session when it is not kcp (a kube-apiserver's client certificate).
    down_session: aiohttp.ClientSession | None = None

    def session_for(self, url: str) -> aiohttp.ClientSession:
        if self.down_session is not None and url.startswith(self.downstream.url + "/"):
            return self.down_session
        return self.session

    # URLs --------------------------------------------------------------------------------------

    def up_url(self, ws: Workspace, namespace: str, name: str = "", sub: str = "") -> str:
        url = f"{self.kcp.url}/clusters/{ws.path}/{API}/namespaces/{namespace}/{PLURAL}"
        return "/".join(p for p in (url, name, sub) if p)

    def down_url(self, namespace: str | None = None, name: str = "", sub: str = "") -> str:
        ns = f"/namespaces/{namespace}" if namespace else ""
        url = f"{self.downstream.url}/{API}{ns}/{PLURAL}"
        return "/".join(p for p in (url, name, sub) if p)

    def down_ns(self, ws: Workspace, namespace: str = "default") -> str:
        return downstream_namespace(ws.cluster, namespace, prefix=PREFIX)

    # plain REST -------------------------------------------------------------------------------

    async def patch(self, url: str, patch: Any) -> dict[str, Any]:
        status, body = await self.call("PATCH", url, patch, ctype="application/merge-patch+json")
        assert status == 200, f"PATCH {url}: {status} {body}"
        result: dict[str, Any] = body
        return result

    async def create(self, ws: Workspace, name: str, **labels: str) -> dict[str, Any]:
        obj = mongo(name, labels=labels)
        status, body = await self.call("POST", self.up_url(ws, "default"), obj)
        assert status == 201, f"create {name}: {status} {body}"
        result: dict[str, Any] = body
        return result

    async def delete(self, url: str) -> None:
        status, body = await self.call("DELETE", url)
        assert status in (200, 202, 404), f"DELETE {url}: {status} {body}"

    async def purge(self, ws: Workspace, name: str) -> None:
        """Remove an upstream object whatever finalizers it carries (test cleanup)."""
        url = self.up_url(ws, "default", name)
        if await self.get(url) is not None:
            await self.call(
                "PATCH",
                url,
                {"metadata": {"finalizers": None}},
                ctype="application/merge-patch+json",
            )
            await self.delete(url)

    def syncer_config(
        self,
        name: str,
        *,
        urls: list[str] | None = None,
        upstream_kubeconfig: str = "kcp.kubeconfig",
        **extra: Any,
    ) -> Any:
        upstream: dict[str, Any] = {"kubeconfig": upstream_kubeconfig}
        if urls is not None:
            upstream["urls"] = urls
        else:
            upstream["endpointSlice"] = {
                "kind": "APIExportEndpointSlice",
                "workspace": self.provider.path,
                "name": EXPORT,
            }
            upstream["refreshSeconds"] = 5
        raw = {
            "name": name,
            "upstream": upstream,
            "downstream": {"kubeconfig": "downstream.kubeconfig"},
            "resources": [
                {
                    "group": "mongodbcommunity.mongodb.com",
                    "version": "v1",
                    "resource": PLURAL,
                    "kind": "MongoDBCommunity",
                    "statusExclude": ["mongoUri"],
                }
            ],
            "namespacePrefix": PREFIX,
            "resyncSeconds": 5,
            "leaderElection": {
                "namespace": "vwserver-syncer",
                "leaseDurationSeconds": 4,
                "renewDeadlineSeconds": 3,
                "retryPeriodSeconds": 0.5,
            },
            "health": {"port": 0},
            **extra,
        }
        return parse_syncer_config(raw, base_dir=self.dir)


def mongo(name: str, *, labels: dict[str, str], version: str = "6.0.5") -> dict[str, Any]:
    return {
        "apiVersion": "mongodbcommunity.mongodb.com/v1",
        "kind": "MongoDBCommunity",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"members": 3, "type": "ReplicaSet", "version": version},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def eventually(
    what: str, probe: Callable[[], Awaitable[T | None]], *, within: float = WAIT
) -> T:
    return await until(what, probe, within=within, interval=0.3)


async def _setup(
    kcp: KcpInstance,
    directory: Path,
    session: aiohttp.ClientSession,
    *,
    kubeapi: tuple[KubeAPIServer, aiohttp.ClientSession] | None = None,
) -> SyncWorld:
    """The world on ``kcp``; its downstream cluster is a new workspace, or, with ``kubeapi``,
    that kube-apiserver (and its admin session): then ``downstream`` is its stand-in
    (:meth:`~devenv.kubeapi.KubeAPIServer.as_workspace`)."""
    tag = uuid.uuid4().hex[:5]
    roles = ("provider", "a", "b") if kubeapi else ("provider", "a", "b", "down")
    names = {r: f"sync-{tag}-{r}" for r in roles}
    docs = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "tenancy.kcp.io/v1alpha1",
                    "kind": "Workspace",
                    "metadata": {"name": n},
                }
                for n in names.values()
            ],
        }
    )
    await apply_retrying(kcp, kcp.cluster_url("root"), docs, within=SETUP)
    ready = await asyncio.gather(
        *(wait_workspace_ready(kcp, n, within=SETUP) for n in names.values())
    )
    ws = dict(zip(names, ready, strict=True))
    provider = ws["provider"]
    await apply_retrying(kcp, provider.url, MANIFESTS / "provider.yaml", within=SETUP)
    await poll(
        "APIExport identity",
        lambda: get_field(kcp, provider.url, "apiexport", EXPORT, "status", "identityHash"),
        within=SETUP,
    )
    binding = (MANIFESTS / "consumer.yaml").read_text().replace("root:sync-provider", provider.path)
    for role in ("a", "b"):
        await apply_retrying(kcp, ws[role].url, binding, within=SETUP)
    for role in ("a", "b"):

        async def bound(server: str = ws[role].url) -> bool | None:
            phase = await get_field(kcp, server, "apibinding", EXPORT, "status", "phase")
            return True if phase == "Bound" else None

        await poll(f"binding in {ws[role].path}", bound, within=SETUP)
    if kubeapi is None:
        downstream = ws["down"]
        await apply_retrying(kcp, downstream.url, MANIFESTS / "downstream-crd.yaml", within=SETUP)
        kcp.write_admin_kubeconfig(directory / "downstream.kubeconfig", server=downstream.url)
    else:
        server, _ = kubeapi
        downstream = server.as_workspace()
        crd = MANIFESTS / "downstream-crd.yaml"
        await server.kubectl("apply", "--server-side", "--validate=strict", "-f", str(crd))
        shutil.copyfile(server.kubeconfig, directory / "downstream.kubeconfig")

    async def endpoint() -> str | None:
        endpoints = await get_field(
            kcp, provider.url, "apiexportendpointslice", EXPORT, "status", "endpoints"
        )
        return next((e["url"] for e in endpoints or [] if e.get("url")), None)

    vw_url = await poll("endpoint slice URL", endpoint, within=SETUP)
    kcp.write_admin_kubeconfig(directory / "kcp.kubeconfig", server=kcp.url)
    env = SyncWorld(
        kcp=kcp,
        provider=provider,
        consumers={"a": ws["a"], "b": ws["b"]},
        downstream=downstream,
        vw_url=vw_url,
        dir=directory,
        session=session,
        down_session=None if kubeapi is None else kubeapi[1],
    )

    async def serving() -> bool | None:
        urls = [f"{vw_url}/clusters/*/{API}/{PLURAL}", env.down_url()] + [
            f"{vw_url}/clusters/{c.cluster}/{API}/{PLURAL}" for c in env.consumers.values()
        ]
        for url in urls:
            status, _ = await env.call("GET", url)
            if status != 200:
                return None
        # kcp's discovery lags behind a new CRD (an empty APIResourceList for a few seconds);
        # a syncer checks its resources against discovery before it syncs
        status, body = await env.call("GET", f"{downstream.url}/{API}")
        ok = status == 200 and isinstance(body, dict)
        names = [r.get("name") for r in body.get("resources") or []] if ok else []
        return True if PLURAL in names else None

    await poll("VW, downstream CRD and its discovery serving", serving, within=SETUP)
    return env


# --------------------------------------------------------------------------------------------
# The test operator


@dataclass
class FakeMongoOperator:
    """Plays the MongoDB operator in the downstream workspace (polling, no informer: it must
    not share code, or bugs, with the syncer)."""

    env: SyncWorld
    release_after: float = 1.0
    deleting_since: dict[str, float] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, AssertionError, TimeoutError):
                await self.step()
            await asyncio.sleep(0.3)

    async def step(self) -> None:
        listing = await self.env.get(self.env.down_url())
        assert listing is not None
        for obj in listing.get("items") or []:
            meta = obj["metadata"]
            url = self.env.down_url(meta["namespace"], meta["name"])
            finalizers = list(meta.get("finalizers") or [])
            if meta.get("deletionTimestamp"):
                since = self.deleting_since.setdefault(meta["uid"], time.monotonic())
                if (
                    OPERATOR_FINALIZER in finalizers
                    and time.monotonic() - since > self.release_after
                ):
                    rest = [f for f in finalizers if f != OPERATOR_FINALIZER]
                    await self.env.call(
                        "PATCH",
                        url,
                        {
                            "metadata": {
                                "finalizers": rest,
                                "resourceVersion": meta["resourceVersion"],
                            }
                        },
                        ctype="application/merge-patch+json",
                    )
                continue
            if OPERATOR_FINALIZER not in finalizers:
                await self.env.call(
                    "PATCH",
                    url,
                    {
                        "metadata": {
                            "finalizers": [*finalizers, OPERATOR_FINALIZER],
                            "resourceVersion": meta["resourceVersion"],
                        }
                    },
                    ctype="application/merge-patch+json",
                )
                continue
            spec = obj.get("spec") or {}
            status = {
                "phase": "Running",
                "version": spec.get("version"),
                "currentMongoDBMembers": spec.get("members"),
                "mongoUri": f"mongodb://{meta['name']}-svc.{meta['namespace']}.svc:27017",
            }
            if any((obj.get("status") or {}).get(k) != v for k, v in status.items()):
                await self.env.call(
                    "PATCH",
                    f"{url}/status",
                    {"status": status},
                    ctype="application/merge-patch+json",
                )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(
    kcp: KcpInstance, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SyncWorld]:
    async with kcp.http_session(timeout=30) as session:
        sync_world = await _setup(kcp, tmp_path_factory.mktemp("syncer"), session)
        operator = asyncio.create_task(FakeMongoOperator(sync_world).run())
        try:
            yield sync_world
        finally:
            operator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await operator


@contextlib.asynccontextmanager
async def running(
    env: SyncWorld,
    config: Any,
    *,
    identity: str | None = None,
    wait_synced: bool = True,
    service_account_dir: Path | None = None,
) -> AsyncIterator[Syncer]:
    """A syncer running in-process until the block ends (stopped gracefully, checked);
    ``service_account_dir``: where ``inCluster`` reads the ServiceAccount."""
    more = {} if service_account_dir is None else {"service_account_dir": service_account_dir}
    syncer = Syncer(config, base_dir=env.dir, identity=identity, **more)
    stop = asyncio.Event()
    task = asyncio.create_task(syncer.run(stop), name=f"syncer {config.name}")
    try:
        if wait_synced:
            await eventually(
                f"syncer {config.name} synced",
                lambda: _done_or(task, syncer.synced),
                within=WAIT,
            )
        yield syncer
    finally:
        stop.set()
        try:
            async with asyncio.timeout(20):
                await task  # a crashed syncer fails the test here
        except TimeoutError:
            # A graceful stop that hangs is a bug: show where every pending task waits.
            pending = [t for t in asyncio.all_tasks() if not t.done()]
            stacks = "\n".join(
                f"{t.get_name()}: "
                + " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in t.get_stack(limit=6))
                for t in pending
            )
            raise AssertionError(
                f"syncer {config.name} did not stop within 20 s; pending tasks:\n{stacks}"
            ) from None


async def _done_or(task: asyncio.Task[None], value: bool) -> bool:
    if task.done():
        task.result()
        raise AssertionError("the syncer stopped by itself")
    return value


async def downstream_copy(env: SyncWorld, ws: Workspace, name: str) -> dict[str, Any] | None:
    return await env.get(env.down_url(env.down_ns(ws), name))


async def upstream_status(
    env: SyncWorld, ws: Workspace, name: str, **expected: Any
) -> dict[str, Any] | None:
    obj = await env.get(env.up_url(ws, "default", name))
    status = (obj or {}).get("status") or {}
    return obj if all(status.get(k) == v for k, v in expected.items()) else None


def synced_condition(obj: dict[str, Any]) -> dict[str, Any]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Synced"), {})


# --------------------------------------------------------------------------------------------
# Down, up, deletion


async def test_down_up_spec_and_clean_deletion(env: SyncWorld) -> None:
    """Create in kcp → downstream copy (derived namespace, link metadata, user labels only) →
    the operator's status comes back without the internal mongoUri; a spec change and a label
    removal propagate; delete → the kcp object waits for the downstream copy (which waits for
    the operator's finalizer) and then goes."""
    ws = env.consumers["a"]
    name = unique("orders")
    async with running(env, env.syncer_config("main")):
        created = await env.create(ws, name, team="payments", tier="gold")
        uid = created["metadata"]["uid"]
        copy = await eventually("downstream copy", lambda: downstream_copy(env, ws, name))
        meta = copy["metadata"]
        assert meta["namespace"] == env.down_ns(ws)
        assert len(meta["namespace"]) <= 63
        assert meta["labels"][LABEL_SYNCER] == "main"
        assert meta["labels"]["team"] == "payments"
        assert meta["annotations"]["sync.edge-connect.eu/uid"] == uid
        assert meta["annotations"][ANN_CLUSTER] == ws.cluster
        assert meta["annotations"]["sync.edge-connect.eu/namespace"] == "default"
        # kcp's own annotation on the copy is the downstream workspace's, never the source's
        assert meta["annotations"]["kcp.io/cluster"] == env.downstream.cluster
        assert copy["spec"] == {"members": 3, "type": "ReplicaSet", "version": "6.0.5"}
        namespace = await env.get(
            f"{env.kcp.url}/clusters/{env.downstream.path}/api/v1/namespaces/{meta['namespace']}"
        )
        assert namespace is not None
        assert namespace["metadata"]["annotations"][ANN_CLUSTER] == ws.cluster

        up = await eventually(
            "status up", lambda: upstream_status(env, ws, name, phase="Running", version="6.0.5")
        )
        assert "mongoUri" not in up["status"]  # statusExclude
        assert up["status"]["currentMongoDBMembers"] == 3
        assert synced_condition(up)["status"] == "True"
        assert finalizer("main") in up["metadata"]["finalizers"]
        down = await downstream_copy(env, ws, name)
        assert down is not None and down["status"]["mongoUri"].startswith("mongodb://")

        await env.patch(
            env.up_url(ws, "default", name),
            {"spec": {"version": "7.0.2"}, "metadata": {"labels": {"tier": None}}},
        )
        await eventually("new version up", lambda: upstream_status(env, ws, name, version="7.0.2"))
        down = await downstream_copy(env, ws, name)
        assert down is not None
        assert down["spec"]["version"] == "7.0.2"
        assert "tier" not in down["metadata"]["labels"]  # removed with server-side apply

        await env.delete(env.up_url(ws, "default", name))
        terminating = await env.get(env.up_url(ws, "default", name))
        assert terminating is not None and terminating["metadata"].get("deletionTimestamp")

        async def order() -> bool | None:
            copy = await downstream_copy(env, ws, name)
            up = await env.get(env.up_url(ws, "default", name))
            # the kcp object may never disappear before its downstream copy
            assert not (up is None and copy is not None), "kcp object gone before downstream"
            return True if up is None and copy is None else None

        await eventually("downstream gone, then the kcp object", order)


async def test_same_namespace_and_name_in_two_consumers(env: SyncWorld) -> None:
    """``default/<name>`` in two workspaces: two downstream objects in two namespaces, each with
    its own spec; deleting one leaves the other."""
    a, b = env.consumers["a"], env.consumers["b"]
    name = unique("twin")
    async with running(env, env.syncer_config("main")):
        await env.create(a, name)
        obj_b = mongo(name, labels={}, version="5.0.1")
        status, body = await env.call("POST", env.up_url(b, "default"), obj_b)
        assert status == 201, body
        copy_a = await eventually("copy a", lambda: downstream_copy(env, a, name))
        copy_b = await eventually("copy b", lambda: downstream_copy(env, b, name))
        assert copy_a["metadata"]["namespace"] != copy_b["metadata"]["namespace"]
        assert (copy_a["spec"]["version"], copy_b["spec"]["version"]) == ("6.0.5", "5.0.1")
        await eventually("b up", lambda: upstream_status(env, b, name, version="5.0.1"))
        await env.delete(env.up_url(a, "default", name))
        await eventually("a gone", lambda: _gone(env, a, name))
        assert await downstream_copy(env, b, name) is not None
        await env.delete(env.up_url(b, "default", name))
        await eventually("b gone", lambda: _gone(env, b, name))


async def _gone(env: SyncWorld, ws: Workspace, name: str) -> bool:
    return (
        await env.get(env.up_url(ws, "default", name)) is None
        and await downstream_copy(env, ws, name) is None
    )


async def test_sync_errors_are_conditions_on_the_kcp_object(env: SyncWorld) -> None:
    """A downstream namespace that exists but was not made by a syncer is never used: the kcp
    object shows ``Synced=False`` with reason ``NotOwned`` and the namespace in the message;
    once the namespace is marked as the source's, the object syncs and the condition clears."""
    ws = env.consumers["b"]
    namespace_name = unique("squat")
    # A namespace in consumer b whose derived downstream namespace we occupy first.
    await env.kcp.kubectl("create", "namespace", namespace_name, server=ws.url)
    target = downstream_namespace(ws.cluster, namespace_name, prefix=PREFIX)
    ns_url = f"{env.kcp.url}/clusters/{env.downstream.path}/api/v1/namespaces"
    status, body = await env.call(
        "POST", ns_url, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": target}}
    )
    assert status == 201, body
    obj = mongo("db", labels={})
    obj["metadata"]["namespace"] = namespace_name
    async with running(env, env.syncer_config("main")) as syncer:
        status, body = await env.call("POST", env.up_url(ws, namespace_name), obj)
        assert status == 201, body

        async def failed() -> dict[str, Any] | None:
            up = await env.get(env.up_url(ws, namespace_name, "db"))
            cond = synced_condition(up or {})
            return cond if cond.get("status") == "False" else None

        condition = await eventually("Synced=False", failed)
        assert condition["reason"] == "NotOwned"
        assert target in condition["message"]
        assert b'reason="NotOwned"' in syncer.metrics_text()
        await env.patch(
            f"{ns_url}/{target}",
            {
                "metadata": {
                    "annotations": {
                        ANN_CLUSTER: ws.cluster,
                        "sync.edge-connect.eu/namespace": namespace_name,
                    }
                }
            },
        )

        async def healed() -> bool:
            up = await env.get(env.up_url(ws, namespace_name, "db"))
            return synced_condition(up or {}).get("status") == "True"

        await eventually("Synced=True", healed)
        await env.delete(env.up_url(ws, namespace_name, "db"))
        await eventually(
            "deleted",
            lambda: _absent(env, env.up_url(ws, namespace_name, "db")),
        )


async def _absent(env: SyncWorld, url: str) -> bool:
    return await env.get(url) is None


# --------------------------------------------------------------------------------------------
# Several syncers on filtered endpoints


@contextlib.asynccontextmanager
async def _regions(env: SyncWorld, *, cache: bool) -> AsyncIterator[dict[str, str]]:
    """vwserver's proxy in front of the export: slices ``eu`` (region=eu) and ``us``, served
    from the shared watch cache (the default) or all through to kcp."""
    auth = await load_kubeconfig(env.kcp.kubeconfig, context=env.kcp.admin_context)
    routes = Routes(
        RouteTable(
            Route(
                cluster=env.provider.cluster,
                name=region,
                selector=Selector.parse(f"region={region}"),
                upstream_url=env.vw_url,
            )
            for region in ("eu", "us")
        )
    )
    async with contextlib.AsyncExitStack() as stack:
        registry = None
        if cache:
            client = await stack.enter_async_context(KubeClient(auth=auth))
            registry = CacheRegistry(client=client, clock=SystemClock())
            stack.push_async_callback(registry.aclose)
        app = build_app(
            routes=routes, upstream=UpstreamClient(auth=auth), guard=NO_AUTH, cache=registry
        )
        base = await stack.enter_async_context(serve_app(app))
        yield {
            region: f"{base}/services/filtered-apiexport/{env.provider.cluster}/{region}"
            for region in ("eu", "us")
        }


@pytest_asyncio.fixture(loop_scope="session")
async def region_urls(env: SyncWorld) -> AsyncIterator[dict[str, str]]:
    async with _regions(env, cache=True) as urls:
        yield urls


@pytest_asyncio.fixture(loop_scope="session")
async def passthrough_region_urls(env: SyncWorld) -> AsyncIterator[dict[str, str]]:
    async with _regions(env, cache=False) as urls:
        yield urls


async def test_two_syncers_split_by_region(env: SyncWorld, region_urls: dict[str, str]) -> None:
    """Syncers ``eu`` and ``us`` on the two filtered endpoints each sync only their objects and
    put only their own finalizer on them."""
    ws = env.consumers["a"]
    eu_name, us_name, none_name = unique("eu"), unique("us"), unique("none")
    async with (
        running(env, env.syncer_config("eu", urls=[region_urls["eu"]])),
        running(env, env.syncer_config("us", urls=[region_urls["us"]])),
    ):
        await env.create(ws, eu_name, region="eu")
        await env.create(ws, us_name, region="us")
        await env.create(ws, none_name)
        for name, owner in ((eu_name, "eu"), (us_name, "us")):
            copy = await eventually(name, lambda n=name: downstream_copy(env, ws, n))
            assert copy["metadata"]["labels"][LABEL_SYNCER] == owner
            up = await eventually(
                f"{name} running", lambda n=name: upstream_status(env, ws, n, phase="Running")
            )
            assert [f for f in up["metadata"]["finalizers"] if "syncer-" in f] == [finalizer(owner)]
        assert await downstream_copy(env, ws, none_name) is None
        none = await env.get(env.up_url(ws, "default", none_name))
        assert none is not None and not none["metadata"].get("finalizers")
        for name in (eu_name, us_name, none_name):
            await env.delete(env.up_url(ws, "default", name))
        for name in (eu_name, us_name, none_name):
            await eventually(f"{name} gone", lambda n=name: _gone(env, ws, n))


# --------------------------------------------------------------------------------------------
# The known hard case: relabelled out of the view while holding the finalizer


async def test_relabel_out_of_view_cleans_up_and_reports_stuck_finalizer(
    env: SyncWorld, passthrough_region_urls: dict[str, str]
) -> None:
    """What happens on slices served all through to kcp (``cache: false``: no holds, see
    vwserver.holds) when a consumer moves an object from ``region=eu`` to ``region=us``:

    1. the ``eu`` syncer's filtered watch delivers DELETED (the object left the slice) while the
       object still carries ``sync.edge-connect.eu/syncer-eu``;
    2. ``eu`` deletes its downstream copy and reports the stuck finalizer: warning log, gauge
       ``vwserver_syncer_stuck_finalizers``, ``/debug/stuck``, and a Warning Event
       ``FinalizerStuck`` in the downstream namespace — it cannot write to the kcp object, which
       its endpoint no longer shows (GET/PATCH answer 404 there);
    3. ``us`` sees the object now, but ``eu``'s finalizer comes first: to ``us`` it is another
       syncer's object (it cannot tell a stale claim from a live one), so it only reports it as
       contested — no finalizer, no copy, no status;
    4. removing ``eu``'s finalizer by hand (as for any stuck finalizer) hands the object over:
       ``us`` adds its finalizer and syncs it, and a later deletion completes.
    """
    region_urls = passthrough_region_urls
    ws = env.consumers["b"]
    name = unique("mover")
    eu_config = env.syncer_config("eu", urls=[region_urls["eu"]])
    async with (
        running(env, eu_config) as eu,
        running(env, env.syncer_config("us", urls=[region_urls["us"]])) as us,
    ):
        try:
            await env.create(ws, name, region="eu")
            await eventually("eu copy", lambda: _copy_owned_by(env, ws, name, "eu"))
            await env.patch(
                env.up_url(ws, "default", name), {"metadata": {"labels": {"region": "us"}}}
            )
            # 2. reported
            await eventually("stuck reported", lambda: _stuck(eu, name))
            assert b"vwserver_syncer_stuck_finalizers" in eu.metrics_text()
            assert eu.health_url is not None
            async with aiohttp.ClientSession() as plain:
                async with plain.get(f"{eu.health_url}/debug/stuck") as resp:
                    stuck = await resp.json()
                async with plain.get(f"{eu.health_url}/metrics") as resp:
                    metrics = await resp.text()
            assert [s["name"] for s in stuck] == [name]
            assert (
                'vwserver_syncer_stuck_finalizers{resource="mongodbcommunity.mongodbcommunity.mongodb.com"} 1.0'
                in metrics
            )
            events = await env.get(
                f"{env.kcp.url}/clusters/{env.downstream.path}/api/v1/namespaces/"
                f"{env.down_ns(ws)}/events"
            )
            assert any(
                e["reason"] == "FinalizerStuck" and e["involvedObject"]["name"] == name
                for e in (events or {}).get("items", [])
            )
            # 3. us stands back from eu's object
            await eventually("us reports it contested", lambda: _contested(us, name, owner="eu"))
            await eventually("eu's copy gone", lambda: _no_copy(env, ws, name))
            up = await env.get(env.up_url(ws, "default", name))
            assert up is not None
            assert [f for f in up["metadata"]["finalizers"] if "syncer-" in f] == [finalizer("eu")]
            # 4. eu's finalizer removed by hand: us adopts the object
            await env.patch(
                env.up_url(ws, "default", name),
                {
                    "metadata": {
                        "finalizers": [
                            f for f in up["metadata"]["finalizers"] if f != finalizer("eu")
                        ],
                        "resourceVersion": up["metadata"]["resourceVersion"],
                    }
                },
            )
            await eventually("us copy", lambda: _copy_owned_by(env, ws, name, "us"))
            assert not await _contested(us, name, owner="eu")
            await env.delete(env.up_url(ws, "default", name))
            await eventually("gone", lambda: _gone(env, ws, name))
        finally:
            await env.purge(ws, name)


async def _contested(syncer: Syncer, name: str, *, owner: str) -> bool:
    return any(
        c.key.name == name and c.owner == owner
        for controller in syncer.controllers
        for c in controller.contested()
    )


async def _copy_owned_by(env: SyncWorld, ws: Workspace, name: str, owner: str) -> bool:
    copy = await downstream_copy(env, ws, name)
    return (
        copy is not None
        and copy["metadata"]["labels"].get(LABEL_SYNCER) == owner
        and not copy["metadata"].get("deletionTimestamp")
    )


async def _no_copy(env: SyncWorld, ws: Workspace, name: str) -> bool:
    return await downstream_copy(env, ws, name) is None


async def _stuck(syncer: Syncer, name: str) -> bool:
    return any(s["name"] == name for s in syncer.stuck_objects())


async def test_relabel_out_of_view_releases_the_finalizer(
    env: SyncWorld, region_urls: dict[str, str]
) -> None:
    """The goal: after the object moved from ``region=eu`` to ``region=us``, the ``eu`` syncer
    eventually removes its finalizer (its downstream copy being gone)."""
    ws = env.consumers["a"]
    name = unique("released")
    async with running(env, env.syncer_config("eu", urls=[region_urls["eu"]])):
        try:
            await env.create(ws, name, region="eu")
            await eventually("eu copy", lambda: _copy_owned_by(env, ws, name, "eu"))
            await env.patch(
                env.up_url(ws, "default", name), {"metadata": {"labels": {"region": "us"}}}
            )

            async def released() -> bool:
                up = await env.get(env.up_url(ws, "default", name))
                return up is not None and finalizer("eu") not in up["metadata"].get(
                    "finalizers", []
                )

            await eventually("eu's finalizer released", released, within=15)
        finally:
            await env.purge(ws, name)


async def test_relabel_hands_over_downstream_in_order(
    env: SyncWorld, region_urls: dict[str, str]
) -> None:
    """Syncers ``eu`` and ``us`` on the cached region slices, an object moved from
    ``region=eu`` to ``region=us``: ``eu`` deletes its downstream copy and releases its
    finalizer, and only then does ``us`` take the object on and create its copy. Read from the
    watches of the downstream copy (eu's DELETED before us's ADDED) and of the kcp object (no
    version ever carries both syncers' finalizers; eu's is gone before us's arrives)."""
    ws = env.consumers["b"]
    name = unique("handover")
    only = {"fieldSelector": f"metadata.name={name}"}
    async with (
        running(env, env.syncer_config("eu", urls=[region_urls["eu"]])),
        running(env, env.syncer_config("us", urls=[region_urls["us"]])),
        recording(env.session, env.up_url(ws, "default"), **only) as upstream,
        recording(env.session, env.down_url(env.down_ns(ws)), **only) as downstream,
    ):
        try:
            await env.create(ws, name, region="eu")
            await eventually("eu copy", lambda: _copy_owned_by(env, ws, name, "eu"))
            await env.patch(
                env.up_url(ws, "default", name), {"metadata": {"labels": {"region": "us"}}}
            )
            await eventually("us copy", lambda: _copy_owned_by(env, ws, name, "us"))
            await downstream.wait_for(
                "us's copy on the downstream watch",
                lambda: next((e for e in downstream.events if _owner(e) == "us"), None),
                within=WAIT,
            )
            up = await env.get(env.up_url(ws, "default", name))
            assert up is not None
            await upstream.wait_for(
                "the kcp object's last version on its watch",
                lambda: True if upstream.reached(int(up["metadata"]["resourceVersion"])) else None,
                within=WAIT,
            )
        finally:
            await env.purge(ws, name)
    down = [(e["type"], _owner(e)) for e in downstream.events]
    eu_deleted = down.index(("DELETED", "eu"))
    us_added = down.index(("ADDED", "us"))
    assert eu_deleted < us_added, down
    assert all(owner == "eu" for _, owner in down[:eu_deleted]), down
    versions = [e["object"]["metadata"] for e in upstream.events if e["type"] != "DELETED"]
    fins = [(int(m["resourceVersion"]), set(m.get("finalizers") or [])) for m in versions]
    assert not any({finalizer("eu"), finalizer("us")} <= f for _, f in fins), fins
    # every version with eu's finalizer comes before every version with us's
    last_eu = max(rv for rv, f in fins if finalizer("eu") in f)
    first_us = min(rv for rv, f in fins if finalizer("us") in f)
    assert last_eu < first_us, fins


def _owner(event: dict[str, Any]) -> str | None:
    """The syncer whose downstream copy a watch event carries."""
    labels: dict[str, str] = event["object"]["metadata"].get("labels") or {}
    return labels.get(LABEL_SYNCER)


# --------------------------------------------------------------------------------------------
# Restarts and replicas


async def test_restart_in_the_middle_of_changes_converges(env: SyncWorld) -> None:
    """Changes go on while the syncer is stopped mid-way and restarted: in the end every live
    kcp object has exactly one downstream copy with its current spec, deleted ones are gone in
    both places, and nothing is left over."""
    ws = env.consumers["a"]
    names = [unique("r") for _ in range(6)]
    config = env.syncer_config("restart")
    async with running(env, config):
        for name in names[:3]:
            await env.create(ws, name)
        await eventually("first copies", lambda: _all_copied(env, ws, names[:3]))
        # keep changing while the syncer is being stopped
        for name in names[3:]:
            await env.create(ws, name)
        await env.patch(env.up_url(ws, "default", names[0]), {"spec": {"version": "8.0.0"}})
    # stopped: more changes
    await env.delete(env.up_url(ws, "default", names[1]))  # waits for our finalizer
    await env.patch(env.up_url(ws, "default", names[2]), {"spec": {"members": 5}})
    late = unique("late")
    await env.create(ws, late)
    live = [names[0], names[2], *names[3:], late]
    async with running(env, config):

        async def converged() -> bool:
            listing = await env.get(env.down_url(env.down_ns(ws)))
            copies = {
                i["metadata"]["name"]: i
                for i in (listing or {}).get("items", [])
                if i["metadata"]["labels"].get(LABEL_SYNCER) == "restart"
                and not i["metadata"].get("deletionTimestamp")
            }
            if set(copies) != set(live):
                return False
            return (
                copies[names[0]]["spec"]["version"] == "8.0.0"
                and copies[names[2]]["spec"]["members"] == 5
                and await env.get(env.up_url(ws, "default", names[1])) is None
            )

        await eventually("converged", converged)
        for name in live:
            await env.delete(env.up_url(ws, "default", name))
        for name in live:
            await eventually(f"{name} gone", lambda n=name: _gone(env, ws, n))


async def _all_copied(env: SyncWorld, ws: Workspace, names: list[str]) -> bool:
    for name in names:
        if await downstream_copy(env, ws, name) is None:
            return False
    return True


async def test_leader_election_one_writer_and_takeover(env: SyncWorld) -> None:
    """Two replicas of one syncer: one leads, the other is a ready standby that writes nothing;
    when the leader stops it releases the Lease, and the standby takes over at once and syncs."""
    ws = env.consumers["b"]
    config = env.syncer_config("ha")
    first, second = unique("ha1"), unique("ha2")
    async with contextlib.AsyncExitStack() as stack_two:
        async with contextlib.AsyncExitStack() as stack_one:
            one = await stack_one.enter_async_context(running(env, config, identity="replica-1"))
            two = await stack_two.enter_async_context(
                running(env, config, identity="replica-2", wait_synced=False)
            )
            assert one.elector is not None and one.elector.is_leader
            await asyncio.sleep(2)  # several retry periods
            assert two.elector is not None and not two.elector.is_leader
            assert two.readiness() == []  # a standby is ready
            assert not two.controllers  # and runs no controller
            await env.create(ws, first)
            await eventually("synced by replica-1", lambda: downstream_copy(env, ws, first))
        # replica-1 stopped and released the lease: replica-2 takes over well before expiry
        started = time.monotonic()
        await eventually("replica-2 leads and is synced", lambda: _value(two.synced), within=10)
        assert time.monotonic() - started < 4  # leaseDurationSeconds
        lease = await env.get(
            f"{env.kcp.url}/clusters/{env.downstream.path}/apis/coordination.k8s.io/v1/"
            "namespaces/vwserver-syncer/leases/vwserver-syncer-ha"
        )
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-2"
        await env.create(ws, second)
        await eventually("synced by replica-2", lambda: downstream_copy(env, ws, second))
        for name in (first, second):
            await env.delete(env.up_url(ws, "default", name))
        for name in (first, second):
            await eventually(f"{name} gone", lambda n=name: _gone(env, ws, n))


async def _value(value: bool) -> bool:
    return value


# --------------------------------------------------------------------------------------------
# Credentials as deployments have them: in-cluster ServiceAccount, exec plugins


async def _round_trip(env: SyncWorld, ws: Workspace, prefix: str) -> None:
    """An object goes down, its status comes up, deleting it cleans up both sides."""
    name = unique(prefix)
    await env.create(ws, name)
    await eventually("downstream copy", lambda: downstream_copy(env, ws, name))
    await eventually("status up", lambda: upstream_status(env, ws, name, phase="Running"))
    await env.delete(env.up_url(ws, "default", name))
    await eventually("gone", lambda: _gone(env, ws, name))


async def test_in_cluster_downstream(
    env: SyncWorld, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The syncer as a Deployment in its downstream cluster: ``downstream: {inCluster: true}``,
    i.e. ``KUBERNETES_SERVICE_HOST``/``_PORT`` and a ServiceAccount token and CA on disk. Every
    downstream request (objects, namespaces, the Lease) carries the ServiceAccount's token."""
    token = await service_account_token(env.kcp, workspace_url=env.downstream.url, name="syncer")
    async with in_cluster(
        api_url=env.downstream.url, ca_file=env.kcp.ca_file, token=token, directory=tmp_path
    ) as pod:
        for key, value in pod.environ.items():
            monkeypatch.setenv(key, value)
        config = env.syncer_config("main", downstream={"inCluster": True})
        async with running(env, config, service_account_dir=pod.service_account_dir):
            await _round_trip(env, env.consumers["a"], "incluster")
    assert pod.seen_tokens, "the syncer never reached the in-cluster API server"
    assert set(pod.seen_tokens) == {token}


async def test_exec_plugin_upstream(env: SyncWorld) -> None:
    """kcp credentials from an exec plugin (as OIDC helpers and cloud CLIs give them)."""
    write_exec_kubeconfig(env.kcp, server=env.kcp.url, directory=env.dir)
    config = env.syncer_config("main", upstream_kubeconfig="exec.kubeconfig")
    before = exec_runs(env.dir)
    async with running(env, config):
        await _round_trip(env, env.consumers["b"], "exec")
    assert exec_runs(env.dir) > before
