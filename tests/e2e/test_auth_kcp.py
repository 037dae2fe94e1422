"""Each slice endpoint is a security boundary, checked against real kcp (issue #5).

Setup (once per module, on the session's kcp and demo world), everything in ``root:provider``:

* vwserver's own identity is a ServiceAccount there, given exactly the shipped RBAC
  (``manifests/rbac/vwserver-reviewer.yaml`` and ``vwserver-export-content.yaml``, subjects
  pointed at it) — so these tests also prove that RBAC is sufficient;
* the static user alice (``config/demo/users.csv``) is granted slice A with
  ``manifests/rbac/example-slice-user.yaml`` (slice name swapped in); bob gets nothing; neither
  has ``apiexports/content``, so kcp's APIExport virtual workspace refuses both;
* an in-process vwserver serves slice A (env=prod) and slice B (env=dev) over TLS (trustme) with
  client-certificate authentication and the Guard, and reloads its certificate files.

kubectl is the client where a client's behaviour matters; raw HTTP (aiohttp) where the exact
verb, header or status is the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import trustme
import yaml

from devenv.bootstrap import Bootstrap, Workspace, apply_retrying, poll
from devenv.kcp import KcpInstance, KubectlResult
from devenv.slices import rbac_docs, slice_grant
from tests.support.serve import serve_app
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import AuthMode, Guard
from vwserver.auth.tls import ServingTLS
from vwserver.auth.tokens import TokenReviewer
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app

SA = "vwserver-e2e"
SLICE_A, SLICE_B = "auth-a", "auth-b"  # env=prod, env=dev
TIMEOUT = 20.0


@dataclass
class Secured:
    kcp: KcpInstance
    world: Bootstrap
    base: str
    serving_ca: trustme.CA
    next_ca: trustme.CA
    """The CA of the certificate a rotation switches to."""
    clients_ca: trustme.CA
    tls_dir: Path
    sa_auth: ClientAuth
    client: KcpInstance
    """kubectl towards the proxy: contexts alice, bob, wrong (token), alice-cert (certificate)."""

    def url(self, slice_name: str, cluster: str, path: str = "") -> str:
        return (
            f"{self.base}/services/filtered-apiexport/{self.world.provider.cluster}/"
            f"{slice_name}/clusters/{cluster}{path}"
        )

    def raw_path(self, slice_name: str, cluster: str, path: str) -> str:
        """For ``kubectl get --raw``, which takes the path from the host's root."""
        return self.url(slice_name, cluster, path).removeprefix(self.base)

    async def kubectl(
        self,
        context: str,
        slice_name: str,
        cluster: str,
        *args: str,
        check: bool = True,
        input: str | None = None,
    ) -> KubectlResult:
        return await self.client.kubectl(
            *args,
            context=context,
            server=self.url(slice_name, cluster),
            check=check,
            input=input,
        )

    def ssl(self, ca: trustme.CA | None = None, cert: trustme.LeafCert | None = None) -> Any:
        ctx = ssl.create_default_context()
        (ca or self.serving_ca).configure_trust(ctx)
        if cert is not None:
            cert.configure_cert(ctx)
        return ctx


def consumer_a(world: Bootstrap) -> Workspace:
    return world.consumer("consumer-a")


def token(world: Bootstrap, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.tokens[user]}"}


def _with_subject(docs: list[dict[str, Any]], subject: dict[str, str]) -> str:
    for doc in docs:
        if doc["kind"] == "ClusterRoleBinding":
            doc["subjects"] = [subject]
    return yaml.safe_dump_all(docs)


async def wait_allowed(kcp: KcpInstance, world: Bootstrap, user: str, slice_name: str) -> None:
    """Until kcp's authorizer has the new RBAC (answers are then cached by the Guard)."""
    review = json.dumps(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:authenticated"],
                "resourceAttributes": {
                    "verb": "get",
                    "group": "sync.edge-connect.eu",
                    "resource": "filteredapiexportendpointslices",
                    "subresource": "content",
                    "name": slice_name,
                },
            },
        }
    )

    async def allowed() -> bool | None:
        out = await kcp.kubectl(
            "create", "-f", "-", "-o", "json", server=world.provider.url, input=review
        )
        return True if json.loads(out.stdout)["status"].get("allowed") else None

    await poll(f"{user} allowed on slice {slice_name}", allowed, within=TIMEOUT)


def client_kubeconfig(
    path: Path, *, world: Bootstrap, ca: Path, alice_cert: Path, alice_key: Path
) -> None:
    users: list[dict[str, Any]] = [
        {"name": name, "user": {"token": world.tokens[name]}} for name in ("alice", "bob")
    ]
    users += [
        {"name": "wrong", "user": {"token": "not-a-token"}},
        {
            "name": "alice-cert",
            "user": {"client-certificate": str(alice_cert), "client-key": str(alice_key)},
        },
    ]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "vwserver",
                "cluster": {"server": "https://unused", "certificate-authority": str(ca)},
            }
        ],
        "users": users,
        "contexts": [
            {"name": u["name"], "context": {"cluster": "vwserver", "user": u["name"]}}
            for u in users
        ],
        "current-context": "alice",
    }
    path.write_text(yaml.safe_dump(doc))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def secured(
    kcp: KcpInstance, world: Bootstrap, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Secured]:
    provider = world.provider.url
    # vwserver's identity: a ServiceAccount of the provider workspace with the shipped RBAC.
    await kcp.kubectl("apply", "-f", "-", server=provider, input=json.dumps(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": "default"}}
    ))  # fmt: skip
    subject = {"kind": "ServiceAccount", "name": SA, "namespace": "default"}
    content = rbac_docs("vwserver-export-content.yaml")
    content[0]["rules"][0]["resourceNames"] = [world.export_name]
    for doc in (_with_subject(rbac_docs("vwserver-reviewer.yaml"), subject),
                _with_subject(content, subject)):  # fmt: skip
        await apply_retrying(kcp, provider, doc, within=TIMEOUT)
    await apply_retrying(kcp, provider, slice_grant(SLICE_A, "alice"), within=TIMEOUT)
    sa_token = (
        await kcp.kubectl("create", "token", SA, "--duration=2h", server=provider)
    ).stdout.strip()
    await wait_allowed(kcp, world, "alice", SLICE_A)

    tmp = tmp_path_factory.mktemp("auth")
    serving_ca, next_ca, clients_ca = trustme.CA(), trustme.CA(), trustme.CA()
    cert = serving_ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
    clients_ca.cert_pem.write_to_path(str(tmp / "clients-ca.crt"))
    # kubectl trusts both serving CAs, so a rotation (in any test order) does not break it.
    (tmp / "serving-cas.crt").write_bytes(serving_ca.cert_pem.bytes() + next_ca.cert_pem.bytes())
    alice = clients_ca.issue_cert("alice.example", common_name="alice")
    alice.private_key_pem.write_to_path(str(tmp / "alice.key"))
    alice.cert_chain_pems[0].write_to_path(str(tmp / "alice.crt"))
    client_kubeconfig(
        tmp / "client.kubeconfig",
        world=world,
        ca=tmp / "serving-cas.crt",
        alice_cert=tmp / "alice.crt",
        alice_key=tmp / "alice.key",
    )
    client = dataclasses.replace(kcp, kubeconfig=tmp / "client.kubeconfig", admin_context="alice")

    sa_auth = ClientAuth(server=kcp.url, ca_pem=kcp.ca_file.read_text(), token=sa_token)
    tls = ServingTLS(
        cert_file=tmp / "tls.crt", key_file=tmp / "tls.key", client_ca_file=tmp / "clients-ca.crt"
    )
    routes = Routes(
        RouteTable(
            Route(
                cluster=world.provider.cluster,
                name=name,
                selector=Selector.parse(f"env={env}"),
                upstream_url=world.vw_url,
            )
            for name, env in ((SLICE_A, "prod"), (SLICE_B, "dev"))
        )
    )
    async with KubeClient(auth=sa_auth, timeout=10) as reviews:
        guard = Guard(tokens=TokenReviewer(client=reviews), access=AccessReviewer(client=reviews))
        app = build_app(
            routes=routes, upstream=UpstreamClient(auth=sa_auth), page_size=3, guard=guard
        )
        reload = asyncio.create_task(tls.watch(interval=0.1))
        try:
            async with serve_app(app, ssl_context=tls.context) as base:
                yield Secured(
                    kcp, world, base, serving_ca, next_ca, clients_ca, tmp, sa_auth, client
                )
        finally:
            reload.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reload


async def request(
    secured: Secured,
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    params: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=secured.ssl())) as session,
        session.request(
            method, url, headers=headers, json=json_body, params=params,
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
        ) as r,
    ):  # fmt: skip
        raw = await r.read()
        return r.status, json.loads(raw) if raw else None


# --------------------------------------------------------------------------------------------


async def test_granted_slice_200_other_slice_403(secured: Secured) -> None:
    a = consumer_a(secured.world)
    out = await secured.kubectl("alice", SLICE_A, "*", "get", "widgets", "-A", "-o", "json")
    items = json.loads(out.stdout)["items"]
    assert items
    assert {i["metadata"]["labels"]["env"] for i in items} == {"prod"}
    # kubectl prints "Error from server (Forbidden): unknown" when discovery is refused (kcp
    # alike); a raw GET shows the Status message, which names the slice and the verb.
    denied = await secured.kubectl("alice", SLICE_B, a.cluster, "get", "widgets", "-A", check=False)
    assert denied.returncode != 0
    assert "(Forbidden)" in denied.stderr
    raw = secured.raw_path(SLICE_B, a.cluster, "/apis/example.io/v1alpha1/widgets")
    denied = await secured.kubectl("alice", SLICE_B, a.cluster, "get", "--raw", raw, check=False)
    assert denied.returncode != 0
    assert f'"{SLICE_B}" is forbidden: User "alice" cannot list' in denied.stderr
    raw = secured.raw_path(SLICE_A, a.cluster, "/apis/example.io/v1alpha1/widgets")
    bob = await secured.kubectl("bob", SLICE_A, "*", "get", "--raw", raw, check=False)
    assert bob.returncode != 0
    assert 'User "bob" cannot list' in bob.stderr


async def test_no_token_or_a_wrong_token_is_401(secured: Secured) -> None:
    url = secured.url(SLICE_A, "*", "/apis/example.io/v1alpha1/widgets")
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        status, body = await request(secured, "GET", url, headers=headers)
        assert (status, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")
    out = await secured.kubectl("wrong", SLICE_A, "*", "get", "widgets", "-A", check=False)
    assert out.returncode != 0
    assert "Unauthorized" in out.stderr


async def test_alice_never_sees_or_changes_an_object_of_slice_b(secured: Secured) -> None:
    world, kcp = secured.world, secured.kcp
    a = consumer_a(world)
    ns = "team-red"
    victim = "dev-eu"  # env=dev: slice B's
    before = json.loads(
        (await kcp.kubectl("get", "widget", victim, "-n", ns, "-o", "json", server=a.url)).stdout
    )
    alice = token(world, "alice")
    api = f"/apis/{world.group}/{world.version}/namespaces/{ns}/widgets"
    obj = f"{api}/{victim}"
    merge = {**alice, "Content-Type": "application/merge-patch+json"}
    table = {**alice, "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    status_body = {**before, "status": {"phase": "Hacked"}}

    # Through slice A: the object behaves as if it did not exist.
    def via_a(path: str) -> str:
        return secured.url(SLICE_A, a.cluster, path)

    assert (await request(secured, "GET", via_a(obj), headers=alice))[0] == 404
    status, listed = await request(secured, "GET", via_a(api), headers=alice)
    assert status == 200
    assert victim not in {i["metadata"]["name"] for i in listed["items"]}
    assert listed["items"]
    status, rows = await request(secured, "GET", via_a(api), headers=table)
    assert status == 200
    assert rows["kind"] == "Table"
    assert victim not in {r["object"]["metadata"]["name"] for r in rows["rows"]}
    patch = {"metadata": {"labels": {"hacked": "yes"}}}
    assert (await request(secured, "PATCH", via_a(obj), headers=merge, json_body=patch))[0] == 404
    assert (
        await request(secured, "PUT", via_a(obj + "/status"), headers=alice, json_body=status_body)
    )[0] == 404
    assert (await request(secured, "DELETE", via_a(obj), headers=alice))[0] == 404
    status, _ = await request(
        secured, "DELETE", via_a(api), headers=alice, params={"labelSelector": "env=dev"}
    )
    assert status == 200  # deletes what matches env=prod AND env=dev: nothing
    try:
        await _watch_does_not_show(secured, via_a(api), alice, victim=victim, ns=ns, ws=a)
    finally:
        for name in (victim, "prod-eu"):
            await kcp.kubectl("annotate", "widget", name, "-n", ns, "e2e/auth-", server=a.url)

    # Through slice B (not granted): 403 for every verb, before anything reaches kcp.
    def via_b(path: str) -> str:
        return secured.url(SLICE_B, a.cluster, path)

    attempts = [
        ("GET", via_b(obj), alice, None, None),
        ("GET", via_b(api), alice, None, None),
        ("GET", via_b(api), alice, None, {"watch": "true"}),
        ("GET", via_b(api), table, None, None),
        ("PATCH", via_b(obj), merge, patch, None),
        ("PUT", via_b(obj + "/status"), alice, status_body, None),
        ("DELETE", via_b(obj), alice, None, None),
        ("DELETE", via_b(api), alice, None, None),
    ]
    for method, url, headers, body, params in attempts:
        status, answer = await request(
            secured, method, url, headers=headers, json_body=body, params=params
        )
        assert (status, answer["reason"]) == (403, "Forbidden"), (method, url, params)
        assert f'"{SLICE_B}" is forbidden' in answer["message"]

    after = json.loads(
        (await kcp.kubectl("get", "widget", victim, "-n", ns, "-o", "json", server=a.url)).stdout
    )
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert after["spec"] == before["spec"]
    assert after.get("status") == before.get("status")


async def _watch_does_not_show(
    secured: Secured, url: str, headers: dict[str, str], *, victim: str, ns: str, ws: Workspace
) -> None:
    """A watch through slice A: a change to the victim is not delivered, a later one to a
    prod object is (so the watch was live when the victim changed)."""
    kcp = secured.kcp
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=secured.ssl())) as session,
        session.get(url, headers=headers, params={"watch": "true"}) as watch,
    ):
        assert watch.status == 200
        marker = uuid.uuid4().hex[:8]
        for name in (victim, "prod-eu"):
            await kcp.kubectl(
                "annotate", "widget", name, "-n", ns, f"e2e/auth={marker}", "--overwrite",
                server=ws.url,
            )  # fmt: skip
        async with asyncio.timeout(TIMEOUT):
            while True:
                line = await watch.content.readline()
                assert line, "watch ended"
                event = json.loads(line)
                name = event["object"]["metadata"]["name"]
                assert name != victim
                if (
                    name == "prod-eu"
                    and event["object"]["metadata"].get("annotations", {}).get("e2e/auth") == marker
                ):
                    break


async def test_client_certificates(secured: Secured) -> None:
    out = await secured.kubectl("alice-cert", SLICE_A, "*", "get", "widgets", "-A", "-o", "name")
    assert out.stdout.strip()
    raw = secured.raw_path(SLICE_B, "*", "/apis/example.io/v1alpha1/widgets")
    denied = await secured.kubectl("alice-cert", SLICE_B, "*", "get", "--raw", raw, check=False)
    assert denied.returncode != 0
    assert 'User "alice" cannot list' in denied.stderr
    rogue = trustme.CA().issue_cert("alice.example", common_name="alice")
    url = secured.url(SLICE_A, "*", "/apis/example.io/v1alpha1/widgets")
    tls12 = secured.ssl(cert=rogue)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    for ctx in (tls12, secured.ssl(cert=rogue)):
        with pytest.raises(aiohttp.ClientError):
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
                session.get(url) as r,
            ):
                pytest.fail(f"a rogue certificate got an answer: {r.status}")


async def test_impersonation_through_a_slice_is_refused(secured: Secured) -> None:
    """``kubectl --as`` through a slice gets an error, not the caller's list: vwserver cannot
    act as another user, and answering as the caller was a request other than the one sent
    (#22, the class of finding 1)."""
    world = secured.world
    spoof = {"Impersonate-User": "bob", "Impersonate-Group": "system:masters"}
    # kcp honours these headers: vwserver's identity may not impersonate, so kcp refuses it ...
    vw = f"{world.vw_url}/clusters/*/apis/example.io/v1alpha1/widgets"
    async with (
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=secured.sa_auth.ssl_context())
        ) as s,
        s.get(vw, headers={"Authorization": f"Bearer {secured.sa_auth.token}", **spoof}) as r,
    ):
        assert r.status == 403
    # ... and vwserver refuses them too, before it asks kcp anything (a wrong token is not
    # even reviewed: the same 403)
    url = secured.url(SLICE_A, "*", "/apis/example.io/v1alpha1/widgets")
    for credentials in (token(world, "alice"), {"Authorization": "Bearer not-a-token"}):
        status, body = await request(secured, "GET", url, headers={**credentials, **spoof})
        assert (status, body["kind"], body["reason"]) == (403, "Status", "Forbidden")
        assert body["message"].startswith("impersonation is not supported through a slice")
    raw = secured.raw_path(SLICE_A, "*", "/apis/example.io/v1alpha1/widgets")
    as_others = (("--as=bob",), ("--as=alice",), ("--as=bob", "--as-group=system:masters"),
                 ("--as=bob", "--as-uid=1"))  # fmt: skip
    for context in ("alice", "wrong"):
        for as_other in as_others:
            out = await secured.kubectl(
                context, SLICE_A, "*", "get", "widgets", "-A", "-o", "json", *as_other,
                check=False,
            )  # fmt: skip
            assert out.returncode != 0, (context, as_other, out.stdout[:300])
            assert "(Forbidden)" in out.stderr, out.stderr
            # (kubectl -o json prints an empty List beside the error)
            assert not out.stdout.strip() or json.loads(out.stdout)["items"] == [], out.stdout
            out = await secured.kubectl(
                context, SLICE_A, "*", "get", "--raw", raw, *as_other, check=False
            )
            assert out.returncode != 0
            assert "impersonation is not supported through a slice" in out.stderr, out.stderr
    # without --as alice gets her list, as always
    out = await secured.kubectl("alice", SLICE_A, "*", "get", "widgets", "-A", "-o", "json")
    assert json.loads(out.stdout)["items"]


async def test_certificate_rotation_keeps_an_open_watch(secured: Secured) -> None:
    world, kcp = secured.world, secured.kcp
    a = consumer_a(world)
    url = secured.url(SLICE_A, "*", "/apis/example.io/v1alpha1/widgets")
    name = f"rotated-{uuid.uuid4().hex[:6]}"
    current, rotated = secured.serving_ca, secured.next_ca
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=secured.ssl(current))) as session,
        session.get(url, headers=token(world, "alice"), params={"watch": "true"}) as watch,
    ):
        assert watch.status == 200
        cert = rotated.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(str(secured.tls_dir / "tls.key"))
        cert.cert_chain_pems[0].write_to_path(str(secured.tls_dir / "tls.crt"))
        async with asyncio.timeout(TIMEOUT):  # new connections get the new certificate
            while True:
                with contextlib.suppress(aiohttp.ClientConnectorCertificateError):
                    async with (
                        aiohttp.ClientSession(
                            connector=aiohttp.TCPConnector(ssl=secured.ssl(rotated))
                        ) as fresh,
                        fresh.get(url, headers=token(world, "alice")) as r,
                    ):
                        assert r.status == 200
                        break
                await asyncio.sleep(0.1)
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=secured.ssl(current))
                ) as old,
                old.get(url, headers=token(world, "alice")),
            ):
                pass
        # the watch opened before the rotation goes on
        manifest = {
            "apiVersion": f"{world.group}/{world.version}",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": "default", "labels": {"env": "prod"}},
            "spec": {"size": 1, "color": "red"},
        }
        await kcp.kubectl("apply", "-f", "-", server=a.url, input=json.dumps(manifest))
        try:
            async with asyncio.timeout(TIMEOUT):
                while True:
                    line = await watch.content.readline()
                    assert line, "watch ended"
                    event = json.loads(line)
                    if event["object"]["metadata"]["name"] == name:
                        break
            assert event["type"] == "ADDED"
        finally:
            await kcp.kubectl("delete", "widget", name, "-n", "default", server=a.url)
    secured.serving_ca, secured.next_ca = rotated, current  # later tests trust the new one


async def test_alice_reads_through_her_slice_but_not_directly_from_kcp(secured: Secured) -> None:
    """The safe setup (manifests/rbac/example-slice-user.yaml, the demo): a slice user gets
    filteredapiexportendpointslices/content only, so kcp's APIExport virtual workspace refuses
    her — she cannot go around vwserver to read objects outside her slice."""
    world = secured.world
    direct = [
        f"{world.vw_url}/clusters/{cluster}/apis/example.io/v1alpha1/widgets"
        for cluster in ("*", consumer_a(world).cluster)
    ]
    async with secured.kcp.http_session(token=world.tokens["alice"]) as session:
        for url in direct:
            async with session.get(url) as r:
                assert r.status == 403, (url, await r.text())
    status, listed = await request(
        secured, "GET", secured.url(SLICE_A, "*", "/apis/example.io/v1alpha1/widgets"),
        headers=token(world, "alice"),
    )  # fmt: skip
    assert status == 200
    assert listed["items"]
    assert {i["metadata"]["labels"]["env"] for i in listed["items"]} == {"prod"}


async def test_passthrough_forwards_the_callers_token(secured: Secured) -> None:
    """In passthrough mode kcp decides with the caller's identity: alice, granted slice A but
    not the export's apiexports/content, is admitted by vwserver and refused by kcp; bob, given
    both for this test, gets the slice's objects."""
    kcp, world = secured.kcp, secured.world
    # apiexports/content for bob, as vwserver-export-content.yaml grants it to vwserver
    role, binding = rbac_docs("vwserver-export-content.yaml")
    role["metadata"]["name"] = binding["roleRef"]["name"] = "e2e-passthrough-export-content"
    role["rules"][0]["resourceNames"] = [world.export_name]
    binding["metadata"]["name"] = "e2e-passthrough-export-content-bob"
    binding["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]
    direct = f"{world.vw_url}/clusters/*/apis/example.io/v1alpha1/widgets"
    try:
        for doc in (slice_grant(SLICE_A, "bob"), yaml.safe_dump_all([role, binding])):
            await apply_retrying(kcp, world.provider.url, doc, within=TIMEOUT)
        await wait_allowed(kcp, world, "bob", SLICE_A)
        async with kcp.http_session(token=world.tokens["bob"]) as direct_session:

            async def bob_may_read_the_export() -> bool | None:
                async with direct_session.get(direct) as r:
                    return True if r.status == 200 else None

            await poll("bob's apiexports/content", bob_may_read_the_export, within=TIMEOUT)
        routes = Routes(
            RouteTable(
                [
                    Route(
                        cluster=world.provider.cluster,
                        name=SLICE_A,
                        selector=Selector.parse("env=prod"),
                        upstream_url=world.vw_url,
                    )
                ]
            )
        )
        async with KubeClient(auth=secured.sa_auth, timeout=10) as reviews:
            guard = Guard(
                tokens=TokenReviewer(client=reviews),
                access=AccessReviewer(client=reviews),
                mode=AuthMode.PASSTHROUGH,
            )
            app = build_app(
                routes=routes, upstream=UpstreamClient(auth=secured.sa_auth), guard=guard
            )
            async with serve_app(app) as base, aiohttp.ClientSession() as session:
                url = (
                    f"{base}/services/filtered-apiexport/{world.provider.cluster}/{SLICE_A}"
                    "/clusters/*/apis/example.io/v1alpha1/widgets"
                )
                async with session.get(url, headers=token(world, "bob")) as r:
                    assert r.status == 200
                    assert {i["metadata"]["labels"]["env"] for i in (await r.json())["items"]} == {
                        "prod"
                    }
                async with session.get(url, headers=token(world, "alice")) as r:
                    body = json.loads(await r.read())
                    assert r.status == 403
                    assert 'User "alice" cannot list resource "widgets"' in body["message"]
    finally:  # bob's bindings and the test's role; alice's slice-A role stays
        for kind, name in (
            ("clusterrolebinding", f"slice-{SLICE_A}-content-bob"),
            ("clusterrolebinding", binding["metadata"]["name"]),
            ("clusterrole", role["metadata"]["name"]),
        ):
            await kcp.kubectl("delete", kind, name, "--ignore-not-found", server=world.provider.url)
