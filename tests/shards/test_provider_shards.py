"""The multicluster-runtime provider (``clients/go/provider``, ``vwprovider``) through a slice
whose consumers live on two shards (issue #24 point 5).

The slice lives in ``root:slices`` (second shard) over the Widget export (root shard) and lists
one ``/shards/<id>`` endpoint per shard. ``filteredapiexport`` hands multicluster-provider's
generic provider every URL of ``status.endpoints`` (as kcp's apiexport provider does with an
APIExportEndpointSlice): it watches ``<endpoint>/clusters/*/…/apibindings`` at each, so it must
engage ``root:consumer-a`` through the root shard's endpoint and ``root:consumer-b`` through the
second shard's, and reconcile there exactly the slice's objects — the same names in both
consumers are two objects, and objects outside the slice on either shard are never reconciled.

vwserver is served over HTTPS with a CA of its own (``TrustedConfig`` needs one) and without
the Guard (the shards suite's server); the provider reads the slice from kcp through the
front-proxy as kcp-admin and sends the same token to vwserver.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import trustme

from devenv.bootstrap import Workspace, apply_retrying, poll
from devenv.shards import ROOT_SHARD, SECOND_SHARD, SHARD_NAMES
from tests.e2e.controller_env import Served, unique
from tests.e2e.test_provider_kcp import (
    API,
    BINDINGS,
    FINALIZER,
    PHASE,
    engaged,
    taken_on,
    untouched,
    widget,
)
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import (
    another_export,
    call,
    endpoints_by_shard,
    export_binding,
    serving_slices,
    suite_slice,
)
from tests.support.go_clients import GoClient, clients
from tests.support.widgets import remove_namespace

TIMEOUT = 90.0  # any one wait: engagement, a reconcile landing in kcp

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Tls:
    server: ssl.SSLContext
    ca_file: Path


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    ca = trustme.CA()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    path = tmp_path_factory.mktemp("provider-shards") / "vwserver-ca.crt"
    ca.cert_pem.write_to_path(str(path))
    return Tls(ctx, path)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(sharded_world: ShardedWorld, tls: Tls) -> AsyncIterator[Served]:
    async with serving_slices(sharded_world, ssl_context=tls.server) as served:
        assert served.base.startswith("https://")
        yield served


async def bound_on_shards(w: ShardedWorld) -> dict[str, str]:
    """Logical clusters with a Ready APIBinding to the export, by the shard whose kcp VW lists
    them (each shard's VW shows the bindings on that shard)."""
    out = {}
    async with w.bed.front.http_session(timeout=30) as session:
        for shard in SHARD_NAMES:
            code, body = await call(session, "GET", f"{w.vw_url(shard)}/clusters/*/{BINDINGS}")
            assert code == 200, body
            for item in body["items"]:
                conditions = (item.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    out[item["metadata"]["annotations"]["kcp.io/cluster"]] = shard
    return out


def provider_args(w: ShardedWorld, name: str, tls: Tls, tmp: Path) -> list[str]:
    """``vwprovider``'s flags for slice ``name`` of ``root:slices``, as kcp-admin (the
    front-proxy's token, also sent to vwserver), trusting vwserver's CA."""
    kubeconfig = tmp / "provider.kubeconfig"
    w.bed.front.write_admin_kubeconfig(kubeconfig, server=w.slices.url)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--slice={name}",
        f"--vwserver-ca={tls.ca_file}",
        f"--finalizer={FINALIZER}",
        f"--status-phase={PHASE}",
        "--retry-interval=1s",
        "-v=1",
    ]


async def kcp_write(w: ShardedWorld, method: str, ws: Workspace, path: str, body: Any) -> None:
    async with w.bed.front.http_session(timeout=30) as session:
        if method == "PATCH":
            headers = {"Content-Type": "application/merge-patch+json"}
            async with session.patch(f"{ws.url}/{path}", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
        else:
            code, answer = await call(session, method, f"{ws.url}/{path}", body)
            assert code in (200, 201, 202), answer


async def kcp_widgets(w: ShardedWorld, ws: Workspace, namespace: str) -> dict[str, Any]:
    async with w.bed.front.http_session(timeout=30) as session:
        code, body = await call(session, "GET", f"{ws.url}/{API}/namespaces/{namespace}/widgets")
        assert code == 200, body
        return {i["metadata"]["name"]: i for i in body["items"]}


async def test_the_provider_engages_both_shards_and_reconciles_exactly_the_slice(
    sharded_world: ShardedWorld,
    served: Served,
    tls: Tls,
    go_provider: Path,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    w = sharded_world
    front = w.bed.front
    name, labels, endpoints = await suite_slice(w, served, "prov")
    consumers = {s: w.consumer_on(s) for s in SHARD_NAMES}
    namespace = unique("prov")
    outside = {
        "out-dev": {"env": "dev", "suite": name},  # relabelled into the slice later
        "out-foreign": {"env": "prod"},  # env=prod but not this slice's suite: never in it
    }
    args = provider_args(w, name, tls, tmp_path)
    for ws in consumers.values():
        await front.kubectl("create", "namespace", namespace, server=ws.url)
    collection = f"{API}/namespaces/{namespace}/widgets"
    try:
        for ws in consumers.values():
            for obj in ("in-a", "in-b"):
                await kcp_write(w, "POST", ws, collection, widget(obj, namespace, labels))
            for obj, other in outside.items():
                await kcp_write(w, "POST", ws, collection, widget(obj, namespace, other))
        async with clients() as add:
            client = add(await GoClient.start(go_provider, "provider", args, tmp_path))
            expected = await bound_on_shards(w)
            assert {ws.cluster: s for s, ws in consumers.items()}.items() <= expected.items()
            await client.wait_until(
                "every bound workspace of both shards engaged",
                lambda: engaged(client) == set(expected),
                within=TIMEOUT,
            )

            async def taken(names: Iterable[str], where: Iterable[Workspace]) -> bool | None:
                for ws in where:
                    items = await kcp_widgets(w, ws, namespace)
                    if not all(taken_on(items.get(n)) for n in names):
                        return None
                return True

            everywhere = list(consumers.values())
            await poll(
                "in-a, in-b taken on, on both shards",
                lambda: taken(["in-a", "in-b"], everywhere),
                within=TIMEOUT,
            )
            for ws in everywhere:
                await kcp_write(w, "POST", ws, collection, widget("late", namespace, labels))
            await poll("late taken on", lambda: taken(["late"], everywhere), within=TIMEOUT)
            second = consumers[SECOND_SHARD]
            await kcp_write(
                w, "PATCH", second, f"{collection}/out-dev", {"metadata": {"labels": labels}}
            )
            await poll(
                "out-dev taken on, on the second shard",
                lambda: taken(["out-dev"], [second]),
                within=TIMEOUT,
            )
            await kcp_write(w, "DELETE", second, f"{collection}/in-a", None)

            async def released() -> bool | None:
                return True if "in-a" not in await kcp_widgets(w, second, namespace) else None

            await poll("in-a released on the second shard", released, within=TIMEOUT)
            codes = {client.name: await client.stop()}
        truth = {s: await kcp_widgets(w, ws, namespace) for s, ws in consumers.items()}
    finally:
        await remove_namespace(front, list(consumers.values()), namespace)

    assert codes == {"provider": 0}, codes
    # every cluster was engaged through the endpoint of the shard it lives on
    for e in client.events("engaged"):
        shard = expected[e["cluster"]]
        assert e["server"] == f"{endpoints[shard]}/clusters/{e['cluster']}", e
    # kcp: the slice's objects carry finalizer and status, the others nothing, on both shards
    for s, items in truth.items():
        assert "in-a" not in items if s == SECOND_SHARD else taken_on(items["in-a"]), items
        assert taken_on(items["in-b"]) and taken_on(items["late"]), items
        assert untouched(items["out-foreign"]), items["out-foreign"]
        out_dev = items["out-dev"]
        assert taken_on(out_dev) if s == SECOND_SHARD else untouched(out_dev), out_dev
    # the reconciler read only the slice's objects, each under its own cluster
    clusters = {ws.cluster: s for s, ws in consumers.items()}
    read = [line for line in client.events("reconcile") if "labels" in line]
    for line in read:
        assert {k: line["labels"].get(k) for k in labels} == labels, line
        assert line["objectCluster"] == line["cluster"], line
    assert {(line["cluster"], line["name"]) for line in read} == {
        (ws.cluster, n) for ws in consumers.values() for n in ("in-a", "in-b", "late")
    } | {(consumers[SECOND_SHARD].cluster, "out-dev")}
    errors = [line["error"] for line in client.events("reconcile") if "error" in line]
    assert all("the object has been modified" in e for e in errors), errors
    # every write went to the endpoint of the object's shard, to one cluster
    writes = [r for r in client.events("request") if r["method"] in ("POST", "PUT", "PATCH")]
    assert writes
    for r in writes:
        hits = [
            c for c in clusters if r["url"].startswith(f"{endpoints[clusters[c]]}/clusters/{c}/")
        ]
        assert hits, r
    assert not [r for r in client.events("request") if "/services/apiexport/" in r["url"]]
    observe(
        f"engaged {len(expected)} workspaces on {len(set(expected.values()))} shards; "
        f"{len(read)} reconciles read an object ({len(errors)} conflicts), "
        f"{len(writes)} writes through the two endpoints"
    )


async def test_the_provider_follows_the_slice_as_a_shard_joins_and_leaves(
    sharded_world: ShardedWorld,
    served: Served,
    tls: Tls,
    go_provider: Path,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    """A second export, bound first in a workspace on the root shard only: the slice has one
    endpoint (the plain URL). A binding on the second shard makes it two ``/shards/<id>`` URLs —
    the root shard's cluster moves to a new URL — and deleting that binding makes it one plain
    URL again. Through both changes the provider engages exactly the clusters bound on the
    slice's shards, and keeps reconciling the root shard's cluster (through whichever URL the
    slice lists for it now)."""
    w = sharded_world
    front = w.bed.front
    export = await another_export(w, "joins")
    binding = json.dumps(export_binding(w, export))
    spaces = {s: await w.bed.create_workspace(unique(f"joins-{s}"), shard=s) for s in SHARD_NAMES}
    root, second = spaces[ROOT_SHARD], spaces[SECOND_SHARD]
    await apply_retrying(front, root.url, binding, within=60)
    name = unique("joins")
    labels = {"env": "prod", "suite": name}
    await served.create_slice(w.slices, name, selector={"matchLabels": labels}, export_name=export)
    (plain,) = (await endpoints_by_shard(w, served, name, count=1, export=export)).values()
    namespace = "team"
    args = provider_args(w, name, tls, tmp_path)

    async def taken(ws: Workspace, obj: str) -> bool | None:
        return True if taken_on((await kcp_widgets(w, ws, namespace)).get(obj)) else None

    async def take_on(obj: str, where: dict[str, Workspace]) -> None:
        """Create ``obj`` in the slice in each workspace; until the provider has taken it on."""
        for ws in where.values():
            doc = json.dumps(widget(obj, namespace, labels))
            await apply_retrying(front, ws.url, doc, within=60)
        for s, ws in where.items():
            await poll(f"{obj} taken on, on {s}", functools.partial(taken, ws, obj), within=TIMEOUT)

    try:
        for ws in spaces.values():
            await front.kubectl("create", "namespace", namespace, server=ws.url)
        async with clients() as add:
            client = add(await GoClient.start(go_provider, "provider", args, tmp_path))
            await client.wait_until(
                "the root shard's workspace engaged",
                lambda: engaged(client) == {root.cluster},
                within=TIMEOUT,
            )
            await take_on("one", {ROOT_SHARD: root})

            # the second shard joins: two /shards/<id> endpoints
            await apply_retrying(front, second.url, binding, within=60)
            two = await endpoints_by_shard(w, served, name, count=2, within=90, export=export)
            await client.wait_until(
                "both shards' workspaces engaged",
                lambda: engaged(client) == {root.cluster, second.cluster},
                within=TIMEOUT,
            )
            await take_on("two", spaces)

            # ... and leaves: one plain endpoint again
            await front.kubectl("delete", "apibinding", export, server=second.url)
            await endpoints_by_shard(w, served, name, count=1, within=90, export=export)
            await client.wait_until(
                "only the root shard's workspace engaged",
                lambda: engaged(client) == {root.cluster},
                within=TIMEOUT,
            )
            await take_on("three", {ROOT_SHARD: root})
            codes = {client.name: await client.stop()}
    finally:
        await remove_namespace(front, list(spaces.values()), namespace)
        for ws in spaces.values():
            await front.kubectl(
                "delete", "workspace", ws.name, "--wait=false", "--ignore-not-found",
                server=front.cluster_url("root"), check=False,
            )  # fmt: skip

    assert codes == {"provider": 0}, codes
    servers = {(e["cluster"], e["server"]) for e in client.events("engaged")}
    assert (root.cluster, f"{plain}/clusters/{root.cluster}") in servers, servers
    assert (root.cluster, f"{two[ROOT_SHARD]}/clusters/{root.cluster}") in servers, servers
    assert {s for c, s in servers if c == second.cluster} == {
        f"{two[SECOND_SHARD]}/clusters/{second.cluster}"
    }, servers
    observe(
        f"engagements: {len(client.events('engaged'))}, disengagements: "
        f"{len(client.events('disengaged'))}, through {len({s for _, s in servers})} URLs"
    )
