"""``vwserver kubeconfig`` as a process, then the real kubectl with the kubeconfig it wrote.

Once against the plain-HTTP ``env`` proxy; once end to end over TLS, where one fake origin plays
kcp (the one GET of the slice that ``--slice`` makes, the token and access reviews, the APIExport
virtual workspace) and vwserver, with its own serving CA, authenticates kubectl by the token the
command carried over from the caller's kcp kubeconfig.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from aiohttp import web

from fakekcp.auth import FakeAuth
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER, Env, routes_for, widget
from tests.integration.test_kubectl import Kubectl
from tests.support.serve import serve_app
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import AuthMode, Guard
from vwserver.auth.tokens import TokenReviewer
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")

KCP_TOKEN = "alice-kcp-token"
SLICES = "/apis/sync.edge-connect.eu/v1alpha1/filteredapiexportendpointslices"


async def vwserver_kubeconfig(*args: str, timeout: float = 30) -> tuple[int, str]:
    """Run ``vwserver kubeconfig ARGS``; (exit code, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vwserver.cli", "kubeconfig", *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, err.decode()


def source_kubeconfig(path: Path, *, server: str, token: str, ca_pem: bytes | None) -> Path:
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kcp", "cluster": cluster}],
                "users": [{"name": "alice", "user": {"token": token}}],
                "contexts": [{"name": "kcp", "context": {"cluster": "kcp", "user": "alice"}}],
                "current-context": "kcp",
            }
        )
    )
    return path


async def widget_names(kubeconfig: Path, cache: Path) -> list[str]:
    _, out, _ = await Kubectl(kubeconfig, cache).run("get", "widgets", "-A", "-o", "json")
    return sorted(i["metadata"]["name"] for i in json.loads(out)["items"])


async def test_endpoint_kubeconfig_works_with_kubectl(env: Env, tmp_path: Path) -> None:
    source = source_kubeconfig(
        tmp_path / "kcp.kubeconfig", server="https://kcp.invalid:6443", token="t", ca_pem=None
    )
    endpoint = f"{env.proxy_base}/services/filtered-apiexport/{SLICE_CLUSTER}/prod"
    out = tmp_path / "prod.kubeconfig"
    code, err = await vwserver_kubeconfig(
        "--endpoint", endpoint, "--kubeconfig", str(source), "-o", str(out)
    )
    assert (code, err) == (0, "")
    assert await widget_names(out, tmp_path / "cache") == ["w0", "w0", "w2", "w2", "w4", "w4"]
    out_c1 = tmp_path / "prod-c1.kubeconfig"
    code, err = await vwserver_kubeconfig(
        "--endpoint", endpoint, "--kubeconfig", str(source), "--cluster", "c1", "-o", str(out_c1)
    )
    assert (code, err) == (0, "")
    assert await widget_names(out_c1, tmp_path / "cache") == ["w0", "w2", "w4"]


def add_slice_route(app: web.Application, *, endpoints: list[str], seen_tokens: list[str]) -> None:
    """GET of FilteredAPIExportEndpointSlice ``prod`` in ``root:team`` (status.endpoints: the
    URLs in ``endpoints`` at request time), for KCP_TOKEN only."""

    async def get_slice(request: web.Request) -> web.Response:
        seen_tokens.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {KCP_TOKEN}":
            return status(401, "Unauthorized", "Unauthorized")
        ws, name = request.match_info["ws"], request.match_info["name"]
        if (ws, name) != ("root:team", "prod"):
            return status(404, "NotFound", f'filteredapiexportendpointslices "{name}" not found')
        return web.json_response(
            {
                "apiVersion": "sync.edge-connect.eu/v1alpha1",
                "kind": "FilteredAPIExportEndpointSlice",
                "metadata": {"name": name, "annotations": {"kcp.io/cluster": SLICE_CLUSTER}},
                "spec": {"export": {"name": "widgets.example.io"}},
                "status": {"endpoints": [{"url": u} for u in endpoints]},
            }
        )

    def status(code: int, reason: str, message: str) -> web.Response:
        body = {"kind": "Status", "status": "Failure", "reason": reason, "message": message}
        return web.json_response(body, status=code)

    app.router.add_get("/clusters/{ws}" + SLICES + "/{name}", get_slice)


async def test_slice_lookup_then_kubectl_through_an_authenticating_vwserver(
    tmp_path: Path,
) -> None:
    """One fake origin plays kcp over TLS (the slice lookup, TokenReview and SubjectAccessReview,
    the APIExport virtual workspace); vwserver, over TLS with its own CA, checks every caller."""
    kcp_ca, serving_ca = trustme.CA(), trustme.CA()
    kcp_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    kcp_ca.issue_cert("127.0.0.1").configure_cert(kcp_tls)
    vw_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving_ca.issue_cert("127.0.0.1").configure_cert(vw_tls)
    serving_ca.cert_pem.write_to_path(str(tmp_path / "vwserver-ca.crt"))
    kcp_ca_pem = kcp_ca.cert_pem.bytes()

    fake = FakeUpstream()
    for i, env in enumerate(["prod", "dev", "prod"]):
        fake.create(cluster="c1", obj=widget(f"w{i}", env=env))
    fake.create(cluster="c2", obj=widget("other", env="prod"))
    reviews = FakeAuth(reviewer_token=PROXY_TOKEN)
    reviews.add_user(KCP_TOKEN, "alice")
    reviews.add_user("bob-kcp-token", "bob")
    reviews.grant(cluster=SLICE_CLUSTER, slice_name="prod", user="alice")
    reviews.install(fake.app)
    endpoints: list[str] = []  # the slice has no endpoint until vwserver listens
    seen: list[str] = []
    add_slice_route(fake.app, endpoints=endpoints, seen_tokens=seen)

    async with start_fake_upstream(fake, ssl_context=kcp_tls) as (_, vw_url):
        kcp_base = vw_url.removesuffix(fake.base_path)

        def kcp_kubeconfig(name: str, *, token: str, ca_pem: bytes = kcp_ca_pem) -> Path:
            return source_kubeconfig(
                tmp_path / name,
                server=f"{kcp_base}/clusters/root:team",  # the workspace --slice reads from
                token=token,
                ca_pem=ca_pem,
            )

        alice = kcp_kubeconfig("alice.kubeconfig", token=KCP_TOKEN)
        code, err = await vwserver_kubeconfig("--slice", "prod", "--kubeconfig", str(alice))
        assert code == 2
        assert err == "vwserver kubeconfig: --slice: prod has no endpoint in status.endpoints yet\n"

        identity = ClientAuth(server=kcp_base, token=PROXY_TOKEN, ca_pem=kcp_ca_pem.decode())
        async with KubeClient(auth=identity, timeout=5) as review_client:
            guard = Guard(
                tokens=TokenReviewer(client=review_client),
                access=AccessReviewer(client=review_client),
                mode=AuthMode.DELEGATED,
            )
            proxy = build_app(
                routes=Routes(routes_for(vw_url)),
                upstream=UpstreamClient(auth=identity),
                guard=guard,
            )
            async with serve_app(proxy, ssl_context=vw_tls) as vw_base:
                slice_url = f"{vw_base}/services/filtered-apiexport/{SLICE_CLUSTER}/prod"
                endpoints.append(slice_url)
                out = tmp_path / "prod.kubeconfig"
                ca_flag = ("--certificate-authority", str(tmp_path / "vwserver-ca.crt"))
                code, err = await vwserver_kubeconfig(
                    "--slice", "prod", "--kubeconfig", str(alice), "--cluster", "c1",
                    *ca_flag, "-o", str(out),
                )  # fmt: skip
                assert (code, err) == (0, "")
                assert seen[-1] == f"Bearer {KCP_TOKEN}"
                server = yaml.safe_load(out.read_text())["clusters"][0]["cluster"]["server"]
                assert server == f"{slice_url}/clusters/c1"
                # kubectl authenticates to vwserver with alice's kcp token, trusts vwserver's CA
                assert await widget_names(out, tmp_path / "cache") == ["w0", "w2"]
                tokens = {r["spec"]["token"] for r in reviews.token_reviews}
                assert tokens == {KCP_TOKEN}

                # bob's kcp token is carried over just the same, and vwserver refuses it
                bob = kcp_kubeconfig("bob.kubeconfig", token="bob-kcp-token")
                bob_out = tmp_path / "bob-prod.kubeconfig"
                code, err = await vwserver_kubeconfig(
                    "--endpoint", slice_url, "--kubeconfig", str(bob), *ca_flag,
                    "-o", str(bob_out),
                )  # fmt: skip
                assert (code, err) == (0, "")
                code, _, err = await Kubectl(bob_out, tmp_path / "cache").run(
                    "get", "widgets", "-A", check=False
                )
                assert code != 0
                assert "forbidden" in err.lower()

        # errors: one line, naming the flag
        code, err = await vwserver_kubeconfig("--slice", "nope", "--kubeconfig", str(alice))
        assert code == 2
        assert err == (
            "vwserver kubeconfig: --slice: no FilteredAPIExportEndpointSlice 'nope' in root:team\n"
        )
        code, err = await vwserver_kubeconfig(
            "--slice", "prod", "--workspace", "root:other", "--kubeconfig", str(alice)
        )
        assert (code, err.count("\n")) == (2, 1)
        assert "'prod' in root:other" in err
        wrong = kcp_kubeconfig("wrong.kubeconfig", token="wrong")
        code, err = await vwserver_kubeconfig("--slice", "prod", "--kubeconfig", str(wrong))
        assert code == 2
        assert err == (
            "vwserver kubeconfig: --kubeconfig: kcp answered 401 Unauthorized: Unauthorized\n"
        )
        # kcp's certificate is checked against the source kubeconfig's CA
        untrusted = kcp_kubeconfig(
            "untrusted.kubeconfig", token=KCP_TOKEN, ca_pem=serving_ca.cert_pem.bytes()
        )
        code, err = await vwserver_kubeconfig("--slice", "prod", "--kubeconfig", str(untrusted))
        assert code == 2
        assert err.startswith("vwserver kubeconfig: --kubeconfig: cannot reach kcp: ")
        assert err.count("\n") == 1
        assert "certificate verify failed" in err
