"""A provider controller on multicluster-runtime through a slice, against real kcp.

``clients/go/provider`` builds ``vwprovider`` (see ``tests/e2e/conftest.py``): kcp's
multicluster-provider v0.8.0 generic provider on a FilteredAPIExportEndpointSlice (package
``filteredapiexport``) in a multicluster-runtime manager, with a reconciler that adds a
finalizer, sets ``status.phase`` and removes the finalizer once the object is deleted. It prints
JSON lines: every HTTP request (to kcp and to vwserver), every cluster engaged and disengaged,
every reconcile.

Setup (module): vwserver in kcp mode (``controller_env.serving``: proxy + embedded controller, so
slices get ``status.endpoints``) over HTTPS with a CA of its own (trustme) and the Guard;
vwserver's API bound in ``root:provider``, where each test creates its slice over the demo
export (the export's own workspace: consent implied). The provider's identity is a
ServiceAccount of ``root:provider`` with nothing but the shipped grants, adapted to the slice:
``manifests/rbac/provider-reads-slice.yaml`` (read the slice) and ``example-slice-user.yaml``
(its content). Its rest config is kcp's kubeconfig plus vwserver's CA
(``filteredapiexport.TrustedConfig``).

Each slice selects ``env=prod`` and a label unique to the test (``suite=<slice>``), so the
provider never touches the demo's widgets or another test's objects.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import trustme
import yaml

from devenv.bootstrap import DEMO_DIR, Bootstrap, Workspace, apply_retrying, poll
from devenv.kcp import KcpInstance
from devenv.slices import rbac_docs, wait_slice_ready
from tests.e2e.controller_env import Served, create_workspace, serving, unique
from tests.support.go_clients import GoClient, clients
from tests.support.widgets import remove_namespace
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import Guard
from vwserver.auth.tokens import TokenReviewer
from vwserver.holds import is_holder_label
from vwserver.k8s.client import KubeClient

API = "apis/example.io/v1alpha1"
FINALIZER = "example.io/vwprovider"
PHASE = "Reconciled"
TIMEOUT = 45.0  # any one wait: engagement, a reconcile landing in kcp, a grant taking effect
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
BINDINGS = "apis/apis.kcp.io/v1alpha1/apibindings"


@dataclass
class Env:
    served: Served
    kcp: KcpInstance
    world: Bootstrap
    vwserver_ca: Path
    ssl: ssl.SSLContext
    """Trusts vwserver's serving CA (for the tests' own requests through a slice)."""
    tmp: Path


def _guard(client: KubeClient) -> Guard:
    # short negative caches: a grant applied during a test takes effect within a second
    return Guard(
        tokens=TokenReviewer(client=client, negative_ttl=1.0),
        access=AccessReviewer(client=client, deny_ttl=1.0),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(
    kcp: KcpInstance, world: Bootstrap, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("provider")
    ca = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    ca.cert_pem.write_to_path(str(tmp / "vwserver-ca.crt"))
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    async with serving(
        kcp,
        world,
        bind_in=(world.provider,),
        resync=5.0,
        guard=_guard,
        ssl_context=server_ctx,
        cache=True,
    ) as served:
        assert served.base.startswith("https://")
        yield Env(served, kcp, world, tmp / "vwserver-ca.crt", client_ctx, tmp)


# --------------------------------------------------------------------------------------------
# The provider's identity, its grants and its slice


@dataclass
class Provider:
    """A slice in root:provider and a ServiceAccount there that will run the provider."""

    env: Env
    slice: str
    sa: str
    token: str
    kubeconfig: Path
    endpoint: str = ""

    @property
    def subject(self) -> dict[str, str]:
        return {"kind": "ServiceAccount", "name": self.sa, "namespace": "default"}

    @property
    def labels(self) -> dict[str, str]:
        """The slice's selector: ``env=prod`` and this test's own label."""
        return {"env": "prod", "suite": self.slice}

    def grant(self, manifest: str, suffix: str) -> str:
        """A shipped RBAC example for this slice and ServiceAccount."""
        role, binding = rbac_docs(manifest)
        name = f"slice-{self.slice}-{suffix}"
        role["metadata"]["name"] = binding["metadata"]["name"] = binding["roleRef"]["name"] = name
        role["rules"][0]["resourceNames"] = [self.slice]
        binding["subjects"] = [self.subject]
        return yaml.safe_dump_all([role, binding])

    async def grant_read(self) -> None:
        ws = self.env.world.provider
        doc = self.grant("provider-reads-slice.yaml", "reader")
        await apply_retrying(self.env.kcp, ws.url, doc, within=TIMEOUT)

    async def grant_content(self) -> None:
        ws = self.env.world.provider
        doc = self.grant("example-slice-user.yaml", "content")
        await apply_retrying(self.env.kcp, ws.url, doc, within=TIMEOUT)

    def args(self, *, retry: str, finalizer: str = FINALIZER) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--slice={self.slice}",
            f"--vwserver-ca={self.env.vwserver_ca}",
            f"--finalizer={finalizer}",
            f"--status-phase={PHASE}",
            f"--retry-interval={retry}",
            "-v=1",
        ]

    def url(self, cluster: str, path: str = "") -> str:
        return f"{self.endpoint}/clusters/{cluster}{path}"

    def session(self) -> aiohttp.ClientSession:
        """HTTP as the provider's identity, trusting vwserver's CA."""
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.env.ssl),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=aiohttp.ClientTimeout(total=30),
        )


@pytest_asyncio.fixture(loop_scope="session")
async def provider(env: Env) -> AsyncIterator[Provider]:
    """A ready slice (endpoint known) and a ServiceAccount without any grant yet."""
    kcp, ws = env.kcp, env.world.provider
    name = unique("prov")
    sa = unique("vwprovider")
    await kcp.kubectl("create", "serviceaccount", sa, "-n", "default", server=ws.url)
    token = (
        await kcp.kubectl("create", "token", sa, "-n", "default", "--duration=1h", server=ws.url)
    ).stdout.strip()
    kubeconfig = env.tmp / f"{sa}.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "kcp",
                        "cluster": {"server": ws.url, "certificate-authority": str(kcp.ca_file)},
                    }
                ],
                "users": [{"name": sa, "user": {"token": token}}],
                "contexts": [{"name": "provider", "context": {"cluster": "kcp", "user": sa}}],
                "current-context": "provider",
            }
        )
    )
    p = Provider(env, name, sa, token, kubeconfig)
    try:
        await env.served.create_slice(ws, name, selector={"matchLabels": p.labels})
        status = await wait_slice_ready(kcp, ws, name, within=TIMEOUT)
        (endpoint,) = status["endpoints"]
        p.endpoint = endpoint["url"]
        assert p.endpoint.startswith(env.served.base), p.endpoint
        yield p
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            for suffix in ("reader", "content"):
                await kcp.kubectl(
                    "delete", kind, f"slice-{name}-{suffix}", "--ignore-not-found",
                    server=ws.url, check=False,
                )  # fmt: skip
        await kcp.kubectl(
            "delete", "filteredapiexportendpointslice", name, "--ignore-not-found",
            server=ws.url, check=False,
        )  # fmt: skip
        await kcp.kubectl(
            "delete", "serviceaccount", sa, "-n", "default", "--ignore-not-found",
            server=ws.url, check=False,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Reading the provider's output, and kcp


def requests_to(client: GoClient, prefix: str) -> list[dict[str, Any]]:
    return [r for r in client.events("request") if r["url"].startswith(prefix)]


def refused_by(client: GoClient, prefix: str) -> bool:
    """Whether a request of ``client`` under ``prefix`` was answered 403."""
    return any(r.get("status") == 403 for r in requests_to(client, prefix))


def engaged(client: GoClient) -> set[str]:
    """Clusters engaged now (a restart may report a re-engagement before the old one's end)."""
    count: dict[str, int] = {}
    for e in client.events("engaged", "disengaged"):
        count[e["cluster"]] = count.get(e["cluster"], 0) + (1 if e["event"] == "engaged" else -1)
    return {c for c, n in count.items() if n > 0}


async def bound_clusters(env: Env) -> set[str]:
    """Logical clusters with a Ready APIBinding to the export, as kcp's own VW lists them."""
    async with (
        env.kcp.http_session(timeout=30) as session,
        session.get(f"{env.world.vw_url}/clusters/*/{BINDINGS}") as resp,
    ):
        assert resp.status == 200, await resp.text()
        items = (await resp.json())["items"]
    return {
        item["metadata"]["annotations"]["kcp.io/cluster"]
        for item in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in item.get("status", {}).get("conditions", [])
        )
    }


async def eventually(what: str, probe: Callable[[], Any], *, within: float = TIMEOUT) -> Any:
    async def value() -> Any:
        result = await probe()
        return result if result else None

    return await poll(what, value, within=within, interval=0.25)


def widget(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"size": 1, "color": "red"},
    }


async def kcp_write(env: Env, method: str, ws: Workspace, path: str, body: Any = None) -> None:
    """A write directly in kcp, as kcp-admin (not through vwserver)."""
    headers = MERGE_PATCH if method == "PATCH" else {"Content-Type": "application/json"}
    data = json.dumps(body) if body is not None else None
    async with (
        env.kcp.http_session(timeout=30) as session,
        session.request(method, f"{ws.url}/{path}", data=data, headers=headers) as resp,
    ):
        assert resp.status in (200, 201, 202), f"{method} {path}: {resp.status} {await resp.text()}"


async def kcp_widgets(env: Env, ws: Workspace, namespace: str) -> dict[str, dict[str, Any]]:
    async with (
        env.kcp.http_session(timeout=30) as session,
        session.get(f"{ws.url}/{API}/namespaces/{namespace}/widgets") as resp,
    ):
        assert resp.status == 200, await resp.text()
        return {i["metadata"]["name"]: i for i in (await resp.json())["items"]}


def taken_on(item: Mapping[str, Any] | None) -> bool:
    """The reconciler's finalizer and status are on the object."""
    return (
        item is not None
        and FINALIZER in item["metadata"].get("finalizers", [])
        and item.get("status", {}).get("phase") == PHASE
    )


def untouched(item: Mapping[str, Any]) -> bool:
    return not item["metadata"].get("finalizers") and "phase" not in item.get("status", {})


async def make_namespace(env: Env, workspaces: Iterable[Workspace], name: str) -> None:
    for ws in workspaces:
        await env.kcp.kubectl("create", "namespace", name, server=ws.url)


# --------------------------------------------------------------------------------------------
# The tests


async def test_provider_needs_its_grants_and_retries_an_endpoint_that_failed_first(
    env: Env, provider: Provider, go_provider: Path, tmp_path: Path, observe: Callable[[str], None]
) -> None:
    """The three things that trip providers up, in the order a new provider meets them. Two
    providers start before the ServiceAccount has any grant: one with the retry of
    ``filteredapiexport`` (probe every second), one without (plain multicluster-provider v0.8.0).

    1. Without read access to the slice, kcp refuses both their slice informers (403): nothing
       is engaged. After ``provider-reads-slice.yaml`` both read the slice and try its endpoint —
       over TLS, trusting vwserver's CA through ``TrustedConfig`` — and vwserver refuses them
       (403: no content grant yet).
    2. After the content grant, the retrying provider engages every workspace bound to the
       export; the other one never comes back to the endpoint (v0.8.0's limit).
    3. A third provider, given kcp's CA where vwserver's belongs, reads the slice but never gets
       past vwserver's certificate, however often it retries."""
    kcp_slices = f"{env.world.provider.url}/apis/sync.edge-connect.eu/v1alpha1/"
    async with clients() as add:
        retrying = add(
            await GoClient.start(go_provider, "provider-retry", provider.args(retry="1s"), tmp_path)
        )
        plain = add(
            await GoClient.start(
                go_provider,
                "provider-no-retry",
                provider.args(retry="-1s", finalizer="example.io/vwprovider-plain"),
                tmp_path,
            )
        )
        untrusting = add(
            await GoClient.start(
                go_provider,
                "provider-wrong-ca",
                [
                    *provider.args(retry="1s", finalizer="example.io/vwprovider-wrong-ca"),
                    f"--vwserver-ca={env.kcp.ca_file}",  # the last flag wins
                ],
                tmp_path,
            )
        )
        for client in (retrying, plain):
            await client.wait_until(
                "kcp refusing the slice (no read grant)",
                functools.partial(refused_by, client, kcp_slices),
                within=TIMEOUT,
            )
        await provider.grant_read()
        for client in (retrying, plain):
            await client.wait_until(
                "vwserver refusing the endpoint (no content grant)",
                functools.partial(refused_by, client, provider.endpoint),
                within=TIMEOUT,
            )
        await asyncio.sleep(1)  # the plain provider's failed attempt is over
        plain_attempts = len(requests_to(plain, provider.endpoint))
        assert not retrying.events("engaged") and not plain.events("engaged")

        await provider.grant_content()
        expected = await bound_clusters(env)
        assert {ws.cluster for ws in env.world.consumers} <= expected, expected
        await retrying.wait_until(
            "every bound workspace engaged",
            lambda: engaged(retrying) == expected,
            within=TIMEOUT,
        )
        engaged_at = len(retrying.lines)
        await asyncio.sleep(5)  # ample time for the plain provider, had it retried
        assert not plain.events("engaged"), plain.events("engaged")
        assert len(requests_to(plain, provider.endpoint)) == plain_attempts
        assert not untrusting.events("engaged"), untrusting.events("engaged")
        untrusted = requests_to(untrusting, provider.endpoint)
        codes = {c.name: await c.stop() for c in (retrying, plain, untrusting)}

    assert codes == dict.fromkeys(codes, 0), codes
    # every engaged cluster's client talks to <endpoint>/clusters/<id>; nothing went to the
    # export's own virtual workspace
    servers = {e["server"] for e in retrying.events("engaged")}
    assert servers == {provider.url(c) for c in expected}, servers
    assert not [r for r in retrying.events("request") if "/services/apiexport/" in r["url"]]
    refused = [r for r in requests_to(retrying, provider.endpoint) if r.get("status") == 403]
    # the wrong CA: every request to vwserver failed verification (first try and each probe)
    assert len(untrusted) > 1, untrusted
    assert all(
        "x509: certificate signed by unknown authority" in r.get("error", "") for r in untrusted
    )
    assert any(r.get("status") == 200 for r in requests_to(untrusting, kcp_slices))
    observe(
        f"engaged {len(expected)} workspaces; the retrying provider was refused {len(refused)} "
        f"times by vwserver before the content grant, the plain one tried the endpoint "
        f"{plain_attempts} times and never again; {engaged_at} output lines until engaged; "
        f"with the wrong CA: {len(untrusted)} failed TLS handshakes, nothing engaged"
    )


async def test_provider_reconciles_exactly_the_slice(
    env: Env, provider: Provider, go_provider: Path, tmp_path: Path, observe: Callable[[str], None]
) -> None:
    """With both grants: in every consumer workspace the provider takes on exactly the objects
    of the slice (the same names in two workspaces are two objects), follows relabels into the
    slice, releases deleted objects, and sees an object that leaves the slice as a graceful
    deletion (vwserver.holds): it removes its finalizer through the slice, then the object is
    gone from it. Writes outside the slice are refused to its identity, and every write it made
    went to ``<endpoint>/clusters/<id>``."""
    world = env.world
    consumers = world.consumers
    namespace = f"prov-{uuid.uuid4().hex[:6]}"
    labels = provider.labels
    out_of_slice = {
        "out-dev": {"env": "dev", "suite": provider.slice},  # relabelled into the slice later
        "out-foreign": {"env": "prod"},  # env=prod but not this suite: never in the slice
    }
    await provider.grant_read()
    await provider.grant_content()
    await make_namespace(env, consumers, namespace)
    try:
        # before the provider starts (its initial list) ...
        for ws in consumers:
            for name in ("in-a", "in-b"):
                await kcp_write(env, "POST", ws, f"{API}/namespaces/{namespace}/widgets",
                                widget(name, namespace, labels))  # fmt: skip
            for name, other in out_of_slice.items():
                await kcp_write(env, "POST", ws, f"{API}/namespaces/{namespace}/widgets",
                                widget(name, namespace, other))  # fmt: skip
        async with clients() as add:
            client = add(
                await GoClient.start(go_provider, "provider", provider.args(retry="1s"), tmp_path)
            )
            expected = await bound_clusters(env)
            await client.wait_until(
                "every bound workspace engaged", lambda: engaged(client) == expected, within=TIMEOUT
            )

            async def all_taken_on(names: Iterable[str]) -> bool:
                for ws in consumers:
                    items = await kcp_widgets(env, ws, namespace)
                    if not all(taken_on(items.get(n)) for n in names):
                        return False
                return True

            await eventually("in-a, in-b taken on", lambda: all_taken_on(["in-a", "in-b"]))
            # ... and after it started (its watch)
            for ws in consumers:
                await kcp_write(env, "POST", ws, f"{API}/namespaces/{namespace}/widgets",
                                widget("late", namespace, labels))  # fmt: skip
            await eventually("late taken on", lambda: all_taken_on(["late"]))
            for ws in consumers:
                items = await kcp_widgets(env, ws, namespace)
                assert all(untouched(items[n]) for n in out_of_slice), items

            # relabels: out-dev into the slice, in-b out of it
            for ws in consumers:
                path = f"{API}/namespaces/{namespace}/widgets"
                await kcp_write(env, "PATCH", ws, f"{path}/out-dev",
                                {"metadata": {"labels": {"env": "prod"}}})  # fmt: skip
                await kcp_write(env, "PATCH", ws, f"{path}/in-b",
                                {"metadata": {"labels": {"env": "dev"}}})  # fmt: skip
            await eventually("out-dev taken on", lambda: all_taken_on(["out-dev"]))

            def saw_leave(ws: Workspace) -> Callable[[], bool]:
                # in-b carries the provider's finalizer: leaving the slice it is shown being
                # deleted, the provider releases it, and then it is gone from the slice
                def lines(action: str) -> list[int]:
                    return [
                        i for i, line in enumerate(client.events("reconcile"))
                        if line["cluster"] == ws.cluster and line["name"] == "in-b"
                        and line["actions"] == [action]
                    ]  # fmt: skip

                return lambda: (
                    bool(lines("finalizer-removed"))
                    and bool(lines("gone"))
                    and (lines("finalizer-removed")[0] < lines("gone")[-1])
                )

            for ws in consumers:
                await client.wait_until(f"in-b leaving in {ws.name}", saw_leave(ws), within=TIMEOUT)

            # a deleted object of the slice is released by the provider
            home = consumers[0]
            await kcp_write(env, "DELETE", home, f"{API}/namespaces/{namespace}/widgets/in-a")

            async def released() -> bool:
                return "in-a" not in await kcp_widgets(env, home, namespace)

            await eventually("in-a released and gone", released)

            # writes outside the slice, as the provider's identity, where its clients write
            refused = await refused_writes(provider, home, namespace)
            codes = {client.name: await client.stop()}
        truth = {ws.cluster: await kcp_widgets(env, ws, namespace) for ws in consumers}
    finally:
        await remove_namespace(env.kcp, consumers, namespace)

    assert codes == {"provider": 0}, codes
    assert refused == {
        "patch out-foreign (never in the slice)": 404,
        "remove in-b's finalizer (released, out of the slice)": 404,
        "create an object outside the slice": 422,
        "relabel late out of the slice": 422,
    }, refused
    # kcp: the slice's objects carry finalizer and status, the others nothing; in-b left and
    # was released by the provider; the refused writes changed nothing
    for ws in consumers:
        items = truth[ws.cluster]
        if ws == consumers[0]:
            assert "in-a" not in items, items
        else:
            assert taken_on(items["in-a"]), items
        for name in ("late", "out-dev"):
            assert taken_on(items[name]), (ws.name, name, items[name])
        assert FINALIZER not in items["in-b"]["metadata"].get("finalizers", []), items["in-b"]
        # The provider's writes changed no label of its own; vwserver's holder label records
        # the finalizer it added through the slice (vwserver.holds).
        late_labels = items["late"]["metadata"]["labels"]
        assert {k: v for k, v in late_labels.items() if not is_holder_label(k)} == labels
        assert [k for k in late_labels if is_holder_label(k)], late_labels
        assert items["in-b"]["metadata"]["labels"]["env"] == "dev"
        assert untouched(items["out-foreign"]), items["out-foreign"]
        assert "outside" not in items
    # the reconciler read only objects of the slice, in the bound workspaces, each under its
    # own cluster (two workspaces' in-a are two objects)
    reconciles = client.events("reconcile")
    read = [line for line in reconciles if "labels" in line]
    for line in read:
        assert line["namespace"] == namespace, line
        if line["name"] == "in-b" and line["labels"].get("env") == "dev":
            # in-b after it left: still the provider's (its finalizer holds it) until released
            assert line["actions"] in (["finalizer-removed"], ["deleting"], ["noop"]), line
        else:
            assert {k: line["labels"].get(k) for k in labels} == labels, line
        assert line["objectCluster"] == line["cluster"], line
    assert {(line["cluster"], line["name"]) for line in read} == {
        (ws.cluster, name) for ws in consumers for name in ("in-a", "in-b", "late", "out-dev")
    }
    errors = [line["error"] for line in reconciles if "error" in line]
    assert all("the object has been modified" in e for e in errors), errors
    # every write went through the slice, to one cluster
    writes = [r for r in client.events("request") if r["method"] in ("POST", "PUT", "PATCH")]
    assert writes
    for r in writes:
        assert r["url"].startswith(f"{provider.endpoint}/clusters/"), r
        assert not r["url"].startswith(provider.url("*")), r
        assert r.get("status") in (200, 201, 409), r
    observe(
        f"{len(reconciles)} reconciles ({len(errors)} conflicts), {len(writes)} writes through "
        f"the slice in {len(consumers)} workspaces; refused: {refused}"
    )


async def refused_writes(provider: Provider, ws: Workspace, namespace: str) -> dict[str, int]:
    """What vwserver answers the provider's identity for writes outside the slice, at the URL
    its cluster clients use (``<endpoint>/clusters/<id>``)."""
    collection = provider.url(ws.cluster, f"/{API}/namespaces/{namespace}/widgets")
    attempts = {
        "patch out-foreign (never in the slice)": (
            "PATCH", f"{collection}/out-foreign", {"metadata": {"annotations": {"x": "y"}}},
        ),
        "remove in-b's finalizer (released, out of the slice)": (
            "PATCH", f"{collection}/in-b", {"metadata": {"finalizers": None}},
        ),
        "create an object outside the slice": (
            "POST", collection, widget("outside", namespace, {"env": "dev", "suite": provider.slice}),
        ),
        "relabel late out of the slice": (
            "PATCH", f"{collection}/late", {"metadata": {"labels": {"env": "dev"}}},
        ),
    }  # fmt: skip
    answers = {}
    async with provider.session() as session:
        for what, (method, url, body) in attempts.items():
            headers = MERGE_PATCH if method == "PATCH" else {"Content-Type": "application/json"}
            async with session.request(method, url, data=json.dumps(body), headers=headers) as r:
                answers[what] = r.status
    return answers


async def test_provider_follows_workspaces_binding_and_unbinding(
    env: Env, provider: Provider, go_provider: Path, tmp_path: Path
) -> None:
    """A workspace that binds the export while the provider runs is engaged and served; when its
    binding goes, it is disengaged."""
    kcp = env.kcp
    await provider.grant_read()
    await provider.grant_content()
    ws = await create_workspace(kcp, unique("prov-ws"))
    binding = (DEMO_DIR / "consumer.yaml").read_text()
    try:
        async with clients() as add:
            client = add(
                await GoClient.start(go_provider, "provider", provider.args(retry="1s"), tmp_path)
            )
            before = await bound_clusters(env)
            await client.wait_until(
                "every bound workspace engaged", lambda: engaged(client) == before, within=TIMEOUT
            )
            assert ws.cluster not in before
            await apply_retrying(kcp, ws.url, binding, within=TIMEOUT)
            await client.wait_until(
                "the new workspace engaged", lambda: ws.cluster in engaged(client), within=TIMEOUT
            )
            await kcp.kubectl("create", "namespace", "team", server=ws.url)
            await apply_retrying(
                kcp, ws.url, json.dumps(widget("w", "team", provider.labels)), within=TIMEOUT
            )

            async def served() -> bool:
                return taken_on((await kcp_widgets(env, ws, "team")).get("w"))

            await eventually("the new workspace's object taken on", served)
            await kcp_write(env, "DELETE", ws, f"{API}/namespaces/team/widgets/w")

            async def released() -> bool:
                return "w" not in await kcp_widgets(env, ws, "team")

            await eventually("the object released and gone", released)
            await kcp.kubectl("delete", "apibinding", "widgets.example.io", server=ws.url)
            await client.wait_until(
                "the unbound workspace disengaged",
                lambda: ws.cluster not in engaged(client),
                within=TIMEOUT,
            )
            assert engaged(client) == before
            assert await client.stop() == 0
    finally:
        await kcp.kubectl(
            "delete", "workspace", ws.name, "--wait=false", "--ignore-not-found",
            server=kcp.cluster_url("root"), check=False,
        )  # fmt: skip
