"""Client credentials the way a deployment has them, for the e2e tests of ``serve`` and ``sync``:

* :func:`write_exec_kubeconfig` — a kubeconfig whose user is an exec credential plugin (a small
  script printing an ``ExecCredential`` with a token, counting its runs), as OIDC helpers and
  cloud CLIs are;
* :func:`in_cluster` — what a pod sees: ``KUBERNETES_SERVICE_HOST``/``_PORT`` naming an
  API server over TLS, and a ServiceAccount directory with ``token`` and ``ca.crt``. The API
  server (a kcp workspace or a real kube-apiserver) is behind a small TLS front (in-cluster
  configuration has no path, and kcp needs ``/clusters/<workspace>``): it forwards every
  request, its bearer token unchanged, and records the tokens it saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml
from aiohttp import web
from yarl import URL

from devenv.kcp import KcpInstance
from tests.support.serve import serve_app

EXEC_API_VERSION = "client.authentication.k8s.io/v1"


def admin_token(kcp: KcpInstance) -> str:
    """The bearer token of the kcp admin context (skips when it authenticates otherwise)."""
    doc = yaml.safe_load(kcp.kubeconfig.read_text())
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == kcp.admin_context)
    user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
    if not user.get("token"):
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and the kcp admin context has no bearer token", pytrace=False)
        pytest.skip("the kcp admin context has no bearer token to hand to an exec plugin")
    return str(user["token"])


def write_exec_kubeconfig(kcp: KcpInstance, *, server: str, directory: Path) -> Path:
    """``directory/exec.kubeconfig``: ``server`` with kcp's CA, user = an exec plugin printing
    the admin token; each run appends a line to ``directory/exec-runs``."""
    token_file = directory / "exec-token"
    token_file.write_text(admin_token(kcp))
    runs = directory / "exec-runs"
    plugin = directory / "kcp-credential"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib\n"
        f"with pathlib.Path({str(runs)!r}).open('a') as runs:\n"
        "    runs.write('run\\n')\n"
        f"token = pathlib.Path({str(token_file)!r}).read_text().strip()\n"
        f"print(json.dumps({{'apiVersion': {EXEC_API_VERSION!r}, 'kind': 'ExecCredential', "
        "'status': {'token': token}}))\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    path = directory / "exec.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "kcp",
                        "cluster": {"server": server, "certificate-authority": str(kcp.ca_file)},
                    }
                ],
                "users": [
                    {
                        "name": "plugin",
                        "user": {
                            "exec": {
                                "apiVersion": EXEC_API_VERSION,
                                "command": str(plugin),
                                "interactiveMode": "Never",
                            }
                        },
                    }
                ],
                "contexts": [{"name": "kcp", "context": {"cluster": "kcp", "user": "plugin"}}],
                "current-context": "kcp",
            }
        )
    )
    return path


def exec_runs(directory: Path) -> int:
    runs = directory / "exec-runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


@dataclass
class InCluster:
    """A pod's view: ``environ`` to set, ``service_account_dir`` to read."""

    environ: dict[str, str]
    service_account_dir: Path
    token: str
    #: Bearer tokens of the requests the API server front received.
    seen_tokens: list[str] = field(default_factory=list)


_FORWARDED = ("Authorization", "Content-Type", "Accept", "User-Agent")
_RETURNED = ("Content-Type",)


@contextlib.asynccontextmanager
async def in_cluster(
    *, api_url: str, ca_file: Path, token: str, directory: Path
) -> AsyncIterator[InCluster]:
    """An API server at ``https://127.0.0.1:<port>`` that is ``api_url`` (a kcp workspace's
    URL, or a kube-apiserver's: the front then only records the tokens), verified with
    ``ca_file``, and a ServiceAccount directory holding ``token`` and the front's CA."""
    ca = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    sa = directory / "serviceaccount"
    sa.mkdir(exist_ok=True)
    ca.cert_pem.write_to_path(str(sa / "ca.crt"))
    (sa / "token").write_text(token)
    (sa / "namespace").write_text("default")
    state = InCluster(environ={}, service_account_dir=sa, token=token)
    upstream_ctx = ssl.create_default_context(cafile=str(ca_file))
    target = api_url.rstrip("/")

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=upstream_ctx),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
    ) as session:

        async def forward(request: web.Request) -> web.StreamResponse:
            auth = request.headers.get("Authorization", "")
            state.seen_tokens.append(auth.removeprefix("Bearer "))
            headers = {h: request.headers[h] for h in _FORWARDED if h in request.headers}
            body: Any = await request.read()
            async with session.request(
                request.method,
                URL(target + request.raw_path, encoded=True),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            ) as up:
                response = web.StreamResponse(
                    status=up.status,
                    headers={h: up.headers[h] for h in _RETURNED if h in up.headers},
                )
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        async with serve_app(app, ssl_context=server_ctx) as base:
            port = URL(base).port
            state.environ = {
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(port),
            }
            yield state


async def service_account_token(kcp: KcpInstance, *, workspace_url: str, name: str) -> str:
    """A ServiceAccount ``default/<name>`` in the workspace, allowed everything there, and a
    token of it (as kubelet would mount it)."""
    docs = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": "default"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{name}-all"},
            "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{name}-all"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{name}-all",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
        },
    ]
    await kcp.kubectl(
        "apply", "-f", "-", server=workspace_url,
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    )  # fmt: skip
    result = await kcp.kubectl("create", "token", name, "--duration=1h", server=workspace_url)
    return result.stdout.strip()
