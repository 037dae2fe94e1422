"""Start and stop a real Kubernetes API server (etcd + kube-apiserver, no kubelet) from Python.

kcp workspaces serve ServiceAccounts and RBAC but no Deployments, Services or
PodDisruptionBudgets, so the workload half of ``manifests/`` and the chart would otherwise never
meet a server's validation (schemas, defaulting, Pod Security admission). This is the downstream
cluster of the syncer's tests and the target of the manifests' server-side apply tests. Nothing
runs the pods: no scheduler, controller-manager or kubelet; the API objects are what is checked.

Both binaries are built from the Go module proxy and cached (``scripts/tools/build.sh etcd
kube-apiserver``). The processes are owned like kcp's (:class:`devenv.kcp.KcpProcess`: own
process group, SIGKILL on parent death, the process-wide reaper), on free loopback ports, with
certificates made by ``trustme`` (:func:`devenv.shards.make_pki`): a serving certificate for
127.0.0.1, an admin client certificate in ``system:masters``, and the ServiceAccount signing key
(so TokenRequest works: a syncer can run as its ServiceAccount).
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from devenv.bootstrap import Workspace
from devenv.kcp import KcpProcess, KubectlResult, run_kubectl
from devenv.shards import Pki, PkiServerProcess, make_pki, write_kubeconfig

__all__ = ["KubeAPIServer", "start_kube_apiserver"]

# Service ClusterIPs are only allocated (no proxy routes them): any private range does.
SERVICE_CIDR = "10.96.0.0/16"


class EtcdProcess(KcpProcess):
    """A single-member etcd on two free loopback ports (plain HTTP: only loopback clients)."""

    def __init__(self, *, binary: Path, root_dir: Path) -> None:
        super().__init__(binary=binary, root_dir=root_dir, remove_root_dir=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    @property
    def log_file(self) -> Path:
        return self.root_dir / "etcd.log"

    @property
    def ready_marker(self) -> Path | None:
        return None  # etcd's /readyz alone

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(self.binary),
            "--name=default",
            f"--data-dir={self.root_dir / 'etcd'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--log-level=warn",
        ]


class KubeAPIServerProcess(PkiServerProcess):
    """``kube-apiserver`` on a free loopback port, storing in :class:`EtcdProcess`."""

    def __init__(self, *, binary: Path, root_dir: Path, pki: Pki, etcd_url: str) -> None:
        super().__init__(binary=binary, root_dir=root_dir, pki=pki)
        self.etcd_url = etcd_url

    @property
    def log_file(self) -> Path:
        return self.root_dir / "kube-apiserver.log"

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.secure_port}",
            f"--tls-cert-file={self.pki.serving.cert}",
            f"--tls-private-key-file={self.pki.serving.key}",
            f"--client-ca-file={self.pki.client_ca}",
            # TokenRequest for ServiceAccounts (the syncer's in-cluster identity).
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.pki.service_account_key}",
            f"--service-account-signing-key-file={self.pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # RBAC only: no kubelets, hence no Node authorizer.
            "--authorization-mode=RBAC",
            # The kubernetes Service's endpoints would name the advertise address, which may not
            # be a loopback one: no endpoint reconciler (nothing routes to them here).
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            f"--cert-dir={self.root_dir / 'certs'}",
        ]


@dataclass(frozen=True, kw_only=True)
class KubeAPIServer:
    """A running API server as clients see it: ``kubeconfig`` is the admin's (client
    certificate in ``system:masters``), ``ca`` verifies the server."""

    url: str
    kubeconfig: Path
    ca: Path
    pki: Pki
    root_dir: Path

    def as_workspace(self) -> Workspace:
        """This server where the syncer tests expect a downstream workspace: ``url`` is the
        server's (its API root, as a workspace URL is), ``name``/``path`` say
        ``kube-apiserver``, and there is no logical cluster."""
        return Workspace(name="kube-apiserver", path="kube-apiserver", cluster="", url=self.url)

    def http_session(
        self, *, token: str | None = None, timeout: float = 30.0
    ) -> aiohttp.ClientSession:
        """A new session verifying the server's CA, as the admin (client certificate) or, with
        ``token``, as that bearer token's user (no client certificate then). The caller owns it."""
        context = ssl.create_default_context(cafile=str(self.ca))
        headers = {}
        if token is None:
            context.load_cert_chain(self.pki.shard_admin.cert, self.pki.shard_admin.key)
        else:
            headers["Authorization"] = f"Bearer {token}"
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        )

    async def kubectl(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 - a default bound so no kubectl call can hang
    ) -> KubectlResult:
        """kubectl as the admin; :class:`KubectlError` (its stderr) when it fails."""
        cache = f"--cache-dir={self.root_dir / 'kubectl-cache'}"  # not the user's ~/.kube
        argv = [f"--kubeconfig={self.kubeconfig}", cache, *args]
        return await run_kubectl("kubectl", argv, args=args, input=input, timeout=timeout)


@contextlib.asynccontextmanager
async def start_kube_apiserver(
    *,
    kube_apiserver: Path,
    etcd: Path,
    root_dir: Path | None = None,
    ready_within: float = 180.0,
) -> AsyncIterator[KubeAPIServer]:
    """etcd + kube-apiserver, ready (``/readyz`` 200, within ``ready_within`` seconds each), stopped
    on exit (and the temporary directory removed when ``root_dir`` is None)."""
    owned = root_dir is None
    root = Path(tempfile.mkdtemp(prefix="vwserver-kubeapi-")) if root_dir is None else root_dir
    root.mkdir(parents=True, exist_ok=True)
    etcd_process = EtcdProcess(binary=etcd, root_dir=root)
    apiserver: KubeAPIServerProcess | None = None
    try:
        pki = make_pki(root / "pki")
        await etcd_process.start()
        await etcd_process.wait_ready(timeout=ready_within)
        apiserver = KubeAPIServerProcess(
            binary=kube_apiserver, root_dir=root, pki=pki, etcd_url=etcd_process.url
        )
        await apiserver.start()
        await apiserver.wait_ready(timeout=ready_within)
        kubeconfig = write_kubeconfig(
            root / "admin.kubeconfig",
            server=apiserver.url,
            ca=pki.serving_ca,
            contexts=("admin",),
            client=pki.shard_admin,
        )
        yield KubeAPIServer(
            url=apiserver.url, kubeconfig=kubeconfig, ca=pki.serving_ca, pki=pki, root_dir=root
        )
    finally:
        if apiserver is not None:
            await apiserver.stop()
        await etcd_process.stop()
        if owned:
            shutil.rmtree(root, ignore_errors=True)
