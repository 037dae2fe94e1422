"""A sharded kcp started from its pieces: a cache server, the root shard, a second shard and
``kcp-front-proxy`` — the topology every production kcp has, for ``tests/shards`` and the demo.

Why the pieces and not kcp's ``cmd/sharded-test-server``: that program starts them on fixed ports
(front-proxy 6443, shards 6444+n, cache 8012, embedded etcds from 2379) and writes its
certificates into dot-directories of the working directory. On a machine that other kcps share
those ports clash, and a second run in parallel is impossible. So this module does what it does
with free ports and a temporary directory: the flags, certificates and shard labels below were
learnt from kcp v0.32.3's ``cmd/sharded-test-server`` (``main.go``, ``shard.go``, ``cache.go``,
``frontproxy.go``).

Certificates (made with ``trustme``; one CA per trust relation, as kcp's own setup has):

* serving CA: one serving certificate (``localhost``, ``127.0.0.1``) for both shards, the cache
  server and the front-proxy; clients trust this one CA for every URL of the bed, including the
  per-shard virtual-workspace URLs kcp publishes in APIExportEndpointSlices.
* client CA: every kcp server accepts client certificates it signed (``--client-ca-file``); the
  user is the CN, the group the O. Infrastructure identities only: ``shard-admin``
  (``system:masters``; the front-proxy's client to every shard), ``cache-client``
  (``system:masters``; the shards' client of the cache server), ``logical-cluster-admin``
  (a shard creating a workspace's LogicalCluster on another shard) and
  ``external-logical-cluster-admin`` (the same through the front-proxy).
* request-header CA: the front-proxy authenticates a caller, then forwards the request to the
  workspace's shard with a client certificate of this CA (CN ``kcp-front-proxy``) and the user in
  ``X-Remote-User``/``X-Remote-Group`` headers, which the shards trust from that CA only.
* a service-account signing key shared by all shards (a token minted on one verifies on all).

People (``kcp-admin``, the demo users) authenticate with bearer tokens of one static token file
given to every shard *and* to the front-proxy, so the same token works at the front-proxy and at
each shard's own URL (where the APIExport virtual workspaces are). ``kcp-admin`` is in group
``system:kcp:admin``, as the admin certificate of kcp's own sharded setup.

Scheduling: a workspace lands on a shard whose labels match its ``spec.location.selector``. The
bed labels each Shard object ``vwserver.test/shard=<shard name>`` once both are up (kcp has no
flag for shard labels; its sharded-test-server patches them the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devenv.bootstrap import (
    CONSUMERS,
    DEMO_USERS_FILE,
    PROVIDER,
    Bootstrap,
    Workspace,
    apply_retrying,
    bootstrap,
    get_json,
    poll,
    wait_workspace_ready,
    workspace_manifest,
)
from devenv.kcp import (
    ADMIN_CONTEXT,
    KcpError,
    KcpInstance,
    KcpProcess,
    build_kcp_commands,
    free_ports,
)
from vwserver.files import write_private

SHARD_LABEL = "vwserver.test/shard"
"""The label the bed puts on each Shard object (value: the shard's name), for
``spec.location.selector`` of workspaces."""
ROOT_SHARD = "root"
SECOND_SHARD = "shard-1"
SHARD_NAMES = (ROOT_SHARD, SECOND_SHARD)
DEMO_PLACEMENT: Mapping[str, str] = {
    PROVIDER: ROOT_SHARD,
    CONSUMERS[0]: ROOT_SHARD,
    CONSUMERS[1]: SECOND_SHARD,
}
"""The demo's workspaces by shard: provider and one consumer on the root shard, the other
consumer on the second (so that the export has a VW endpoint on each)."""
ADMIN_GROUP = "system:kcp:admin"
"""kcp's bootstrap group of full admins (``bootstrap.SystemKcpAdminGroup``)."""
COMMANDS = ("kcp", "cache-server", "kcp-front-proxy")
PORT_ATTEMPTS = 3
"""Bring-ups tried when a process loses a chosen port to another process before binding it."""


def on_shard(shard: str) -> dict[str, Any]:
    """The ``spec.location.selector`` that schedules a workspace onto ``shard``."""
    return {"matchLabels": {SHARD_LABEL: shard}}


async def bootstrap_placed(bed: ShardedKcp, *, wait_timeout: float = 180.0) -> Bootstrap:
    """The demo world with its workspaces placed across the shards (:data:`DEMO_PLACEMENT`),
    the export's endpoint slice listing both shards: what the sharded demo, the shard tests
    and the sharded benchmark start from."""
    return await bootstrap(
        bed.front,
        locations={name: on_shard(shard) for name, shard in DEMO_PLACEMENT.items()},
        endpoints=2,
        wait_timeout=wait_timeout,
    )


def build_sharded_kcp(*, timeout: float = 3600.0) -> dict[str, Path]:
    """The three binaries of a sharded kcp (``scripts/kcp/build.sh --sharded``, cached)."""
    return build_kcp_commands(*COMMANDS, timeout=timeout)


# --------------------------------------------------------------------------------------------
# Certificates and kubeconfigs


@dataclass(frozen=True, kw_only=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True, kw_only=True)
class Pki:
    serving_ca: Path
    serving: KeyPair
    client_ca: Path
    requestheader_ca: Path
    front_proxy_requestheader: KeyPair
    shard_admin: KeyPair
    cache_client: KeyPair
    logical_cluster_admin: KeyPair
    external_logical_cluster_admin: KeyPair
    service_account_key: Path


def make_pki(directory: Path) -> Pki:
    """Every certificate and key of the bed, written into ``directory`` (private files)."""
    import trustme  # a dev dependency, like everything that starts kcp

    directory.mkdir(parents=True, exist_ok=True)
    serving_ca, client_ca, header_ca, sa_ca = (trustme.CA() for _ in range(4))

    def write_ca(ca: trustme.CA, name: str) -> Path:
        path = directory / f"{name}.crt"
        path.write_bytes(ca.cert_pem.bytes())
        return path

    def write_pair(leaf: trustme.LeafCert, name: str) -> KeyPair:
        pair = KeyPair(cert=directory / f"{name}.crt", key=directory / f"{name}.key")
        pair.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        write_private(pair.key, leaf.private_key_pem.bytes().decode())
        return pair

    def client(ca: trustme.CA, user: str, group: str | None = None) -> trustme.LeafCert:
        # trustme wants at least one identity (a SAN); the user name is harmless there.
        return ca.issue_cert(user, common_name=user, organization_name=group)

    sa_key = directory / "service-account.key"
    write_private(sa_key, sa_ca.private_key_pem.bytes().decode())
    return Pki(
        serving_ca=write_ca(serving_ca, "serving-ca"),
        serving=write_pair(serving_ca.issue_cert("localhost", "127.0.0.1"), "serving"),
        client_ca=write_ca(client_ca, "client-ca"),
        requestheader_ca=write_ca(header_ca, "requestheader-ca"),
        front_proxy_requestheader=write_pair(
            client(header_ca, "kcp-front-proxy"), "front-proxy-requestheader"
        ),
        shard_admin=write_pair(client(client_ca, "shard-admin", "system:masters"), "shard-admin"),
        cache_client=write_pair(
            client(client_ca, "cache-client", "system:masters"), "cache-client"
        ),
        logical_cluster_admin=write_pair(
            client(client_ca, "logical-cluster-admin", "system:kcp:logical-cluster-admin"),
            "logical-cluster-admin",
        ),
        external_logical_cluster_admin=write_pair(
            client(
                client_ca,
                "external-logical-cluster-admin",
                "system:kcp:external-logical-cluster-admin",
            ),
            "external-logical-cluster-admin",
        ),
        service_account_key=sa_key,
    )


def write_kubeconfig(
    path: Path,
    *,
    server: str | None,
    ca: Path,
    contexts: Sequence[str] = ("base",),
    client: KeyPair | None = None,
    token: str | None = None,
) -> Path:
    """A kubeconfig whose ``contexts`` all name one cluster (``server``; None: no server, the
    reader fills it in) and one user (a client certificate or a bearer token)."""
    user: dict[str, str] = {}
    if client is not None:
        user = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    if token is not None:
        user["token"] = token
    cluster: dict[str, str] = {"certificate-authority": str(ca)}
    if server is not None:
        cluster["server"] = server
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": contexts[0],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": c, "context": {"cluster": "c", "user": "u"}} for c in contexts],
    }
    write_private(path, yaml.safe_dump(doc))
    return path


# --------------------------------------------------------------------------------------------
# kcp's other servers, run like a shard (devenv.kcp owns the process lifetime)


class PkiServerProcess(KcpProcess):
    """A server of the bed's PKI that is ready when its ``/readyz`` is (no marker file)."""

    def __init__(self, *, binary: Path, root_dir: Path, pki: Pki) -> None:
        super().__init__(binary=binary, root_dir=root_dir, remove_root_dir=False)
        self.pki = pki

    @property
    def ready_marker(self) -> Path | None:
        return None


class CacheServerProcess(PkiServerProcess):
    """``cache-server``: the shards' shared cache of replicated objects (APIExports, ...)."""

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"--root-directory={self.root_dir}",
            f"--embedded-etcd-directory={self.root_dir / 'etcd-server'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.secure_port}",
            f"--embedded-etcd-client-port={self.etcd_client_port}",
            f"--embedded-etcd-peer-port={self.etcd_peer_port}",
            f"--client-ca-file={self.pki.client_ca}",
            f"--tls-cert-file={self.pki.serving.cert}",
            f"--tls-private-key-file={self.pki.serving.key}",
        ]


class FrontProxyProcess(KcpProcess):
    """``kcp-front-proxy``: routes ``/clusters/<workspace>`` to the shard that holds it."""

    def __init__(
        self,
        *,
        binary: Path,
        root_dir: Path,
        pki: Pki,
        token_auth_file: Path,
        root_kubeconfig: Path,
        shards_kubeconfig: Path,
        root_shard_url: str,
    ) -> None:
        super().__init__(
            binary=binary, root_dir=root_dir, remove_root_dir=False, token_auth_file=token_auth_file
        )
        self.pki = pki
        self.root_kubeconfig = root_kubeconfig
        self.shards_kubeconfig = shards_kubeconfig
        self.root_shard_url = root_shard_url

    @property
    def ready_marker(self) -> Path | None:
        return None

    @property
    def mapping_file(self) -> Path:
        return self.root_dir / "mapping.yaml"

    def write_mapping(self) -> None:
        # kcp fact (pkg/proxy): the backend of "/clusters/" is not used for routing — the shard
        # of a workspace comes from the Shard objects and the shards' LogicalCluster index; the
        # client certificate is the request-header identity the proxy forwards with.
        mapping = [
            {
                "path": "/clusters/",
                "backend": self.root_shard_url,
                "backend_server_ca": str(self.pki.serving_ca),
                "proxy_client_cert": str(self.pki.front_proxy_requestheader.cert),
                "proxy_client_key": str(self.pki.front_proxy_requestheader.key),
            }
        ]
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.mapping_file.write_text(yaml.safe_dump(mapping))

    def command(self) -> list[str]:
        return [
            str(self.binary),
            "--bind-address=127.0.0.1",
            f"--secure-port={self.secure_port}",
            f"--root-directory={self.root_dir}",
            f"--mapping-file={self.mapping_file}",
            f"--root-kubeconfig={self.root_kubeconfig}",
            f"--shards-kubeconfig={self.shards_kubeconfig}",
            f"--client-ca-file={self.pki.client_ca}",
            f"--token-auth-file={self.token_auth_file}",
            f"--requestheader-client-ca-file={self.pki.requestheader_ca}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-allowed-names=kcp-front-proxy",
            f"--tls-cert-file={self.pki.serving.cert}",
            f"--tls-private-key-file={self.pki.serving.key}",
        ]


def shard_args(
    *,
    name: str,
    url: str,
    front_proxy_url: str,
    pki: Pki,
    cache_kubeconfig: Path,
    logical_cluster_admin_kubeconfig: Path,
    external_logical_cluster_admin_kubeconfig: Path,
    root_shard_kubeconfig: Path | None,
) -> list[str]:
    """``kcp start`` flags of one shard, besides the ones :class:`KcpProcess` always passes."""
    args = [
        f"--shard-name={name}",
        # The shard's own URL: kcp publishes it in the Shard object (the front-proxy routes
        # there) and, as --shard-virtual-workspace-url defaults to it, in every
        # APIExportEndpointSlice of an export with bindings on this shard.
        f"--shard-base-url={url}",
        # What kubeconfigs kcp writes for outside clients name: the front-proxy.
        f"--shard-external-url={front_proxy_url}",
        f"--cache-kubeconfig={cache_kubeconfig}",
        f"--client-ca-file={pki.client_ca}",
        f"--requestheader-client-ca-file={pki.requestheader_ca}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--service-account-key-file={pki.service_account_key}",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--logical-cluster-admin-kubeconfig={logical_cluster_admin_kubeconfig}",
        f"--external-logical-cluster-admin-kubeconfig={external_logical_cluster_admin_kubeconfig}",
        f"--shard-client-cert-file={pki.shard_admin.cert}",
        f"--shard-client-key-file={pki.shard_admin.key}",
        f"--shard-virtual-workspace-ca-file={pki.serving_ca}",
    ]
    if root_shard_kubeconfig is not None:
        args.append(f"--root-shard-kubeconfig-file={root_shard_kubeconfig}")
    return args


# --------------------------------------------------------------------------------------------
# The bed


@dataclass(frozen=True, kw_only=True)
class Shard:
    name: str
    #: The shard's own base URL (its APIExport virtual workspaces are under it).
    url: str
    #: kcp-admin at this shard directly (same token and CA as the front-proxy's).
    instance: KcpInstance
    process: KcpProcess


@dataclass(frozen=True, kw_only=True)
class ShardedKcp:
    """A running sharded kcp. ``front`` is what clients use (kubectl, vwserver's kcp client):
    the front-proxy, with kcp-admin's token; ``shards`` by name (root first)."""

    front: KcpInstance
    shards: Mapping[str, Shard]
    cache: KcpProcess
    front_proxy: KcpProcess
    pki: Pki
    users_file: Path
    #: Seconds from the first process start to a front-proxy that routes to both shards.
    ready_seconds: float

    def shard(self, name: str) -> Shard:
        return self.shards[name]

    def shard_of_url(self, url: str) -> str:
        """The name of the shard whose base URL ``url`` starts with (a VW URL, say)."""
        for shard in self.shards.values():
            if url == shard.url or url.startswith(shard.url + "/"):
                return shard.name
        raise KcpError(
            f"{url} is on no shard of this bed ({[s.url for s in self.shards.values()]})"
        )

    async def create_workspace(self, name: str, *, shard: str, within: float = 120.0) -> Workspace:
        """Workspace ``root:<name>`` scheduled onto ``shard`` (``spec.location.selector``)."""
        doc = workspace_manifest(name, selector=on_shard(shard))
        front = self.front
        await apply_retrying(front, front.cluster_url("root"), json.dumps(doc), within=within)
        return await wait_workspace_ready(front, name, within=within)

    async def workspace_shard(self, name: str) -> str:
        """The shard a workspace of ``root`` was scheduled onto: kcp writes the shard's name
        into the Workspace's ``core.kcp.io/shard`` annotation (verified on v0.32.3)."""
        obj = await get_json(self.front, self.front.cluster_url("root"), "workspace", name)
        return _shard_of(obj)


def _shard_of(workspace: Mapping[str, Any]) -> str:
    annotations = (workspace.get("metadata") or {}).get("annotations") or {}
    shard = annotations.get("core.kcp.io/shard")
    if not isinstance(shard, str) or not shard:
        raise KcpError(f"workspace has no core.kcp.io/shard annotation: {annotations}")
    return shard


def write_users_file(path: Path, *, admin_token: str, demo_users: Path | None) -> Path:
    """The static token file of every server: kcp-admin (``system:kcp:admin``) and the demo
    users (``config/demo/users.csv``)."""
    lines = [f'{admin_token},kcp-admin,uid-kcp-admin,"{ADMIN_GROUP}"']
    if demo_users is not None:
        lines += [line for line in demo_users.read_text().splitlines() if line.strip()]
    write_private(path, "\n".join(lines) + "\n")
    return path


@dataclass(frozen=True, kw_only=True)
class _Layout:
    cache: KcpProcess
    processes: dict[str, KcpProcess]
    front: KcpProcess
    admin_kubeconfig: Path
    kubeconfigs: Path


def _layout(
    base: Path, *, binaries: Mapping[str, Path], pki: Pki, users: Path, admin_token: str
) -> _Layout:
    """The processes of one bring-up in ``base`` (ports chosen now) and their kubeconfigs."""
    cache = CacheServerProcess(binary=binaries["cache-server"], root_dir=base / "cache", pki=pki)
    shard_dirs = {name: base / name for name in SHARD_NAMES}
    # Each process picks its free ports when it is made; the flags below name them.
    (front_port,) = free_ports(1)
    front_url = f"https://127.0.0.1:{front_port}"
    kubeconfigs = base / "kubeconfigs"
    kubeconfigs.mkdir(parents=True, exist_ok=True)
    cache_kubeconfig = write_kubeconfig(
        kubeconfigs / "cache.kubeconfig",
        server=cache.url,
        ca=pki.serving_ca,
        contexts=("cache",),
        client=pki.cache_client,
    )
    processes: dict[str, KcpProcess] = {}
    for name, directory in shard_dirs.items():
        processes[name] = KcpProcess(
            binary=binaries["kcp"], root_dir=directory, remove_root_dir=False, token_auth_file=users
        )
    root_url = processes[ROOT_SHARD].url
    lca = write_kubeconfig(
        kubeconfigs / "logical-cluster-admin.kubeconfig",
        server=root_url,
        ca=pki.serving_ca,
        client=pki.logical_cluster_admin,
    )
    elca = write_kubeconfig(
        kubeconfigs / "external-logical-cluster-admin.kubeconfig",
        server=front_url,
        ca=pki.serving_ca,
        client=pki.external_logical_cluster_admin,
    )
    # The root shard as shard-admin: what a second shard registers itself through
    # (--root-shard-kubeconfig-file, read with context "shard-base") and what the front-proxy
    # watches Shards with (--root-kubeconfig).
    root_admin = write_kubeconfig(
        kubeconfigs / "root-shard-admin.kubeconfig",
        server=root_url,
        ca=pki.serving_ca,
        contexts=("shard-base", "base"),
        client=pki.shard_admin,
    )
    # The front-proxy's client of every shard: the server is filled in per shard.
    shards_kubeconfig = write_kubeconfig(
        kubeconfigs / "shards.kubeconfig", server=None, ca=pki.serving_ca, client=pki.shard_admin
    )
    for name, process in processes.items():
        process.extra_args = tuple(
            shard_args(
                name=name,
                url=process.url,
                front_proxy_url=front_url,
                pki=pki,
                cache_kubeconfig=cache_kubeconfig,
                logical_cluster_admin_kubeconfig=lca,
                external_logical_cluster_admin_kubeconfig=elca,
                root_shard_kubeconfig=None if name == ROOT_SHARD else root_admin,
            )
        )
    front = FrontProxyProcess(
        binary=binaries["kcp-front-proxy"],
        root_dir=base / "front-proxy",
        pki=pki,
        token_auth_file=users,
        root_kubeconfig=root_admin,
        shards_kubeconfig=shards_kubeconfig,
        root_shard_url=root_url,
    )
    front.secure_port = front_port
    front.write_mapping()
    admin_kubeconfig = write_kubeconfig(
        kubeconfigs / "admin.kubeconfig",
        server=front_url,
        ca=pki.serving_ca,
        contexts=(ADMIN_CONTEXT, "root"),
        token=admin_token,
    )

    return _Layout(
        cache=cache,
        processes=processes,
        front=front,
        admin_kubeconfig=admin_kubeconfig,
        kubeconfigs=kubeconfigs,
    )


def _port_clash(process: KcpProcess) -> bool:
    """Whether the process died because another took one of its ports (a port is free when it
    is chosen, and can be taken by anyone on the machine until the process binds it)."""
    return process.returncode is not None and "address already in use" in process.log_tail(200)


@contextlib.asynccontextmanager
async def start_sharded_kcp(
    *,
    binaries: Mapping[str, Path],
    root_dir: Path | None = None,
    demo_users: Path | None = DEMO_USERS_FILE,
    ready_timeout: float = 180.0,
    stop_grace: float = 20.0,
) -> AsyncIterator[ShardedKcp]:
    """Run cache server, root shard, second shard and front-proxy for the ``async with`` block.

    ``root_dir``: where everything is written (kept afterwards, with each server's log); without
    it a temporary directory, removed on stop. Every process is stopped on exit, whatever
    happened; every wait is bounded by ``ready_timeout`` seconds.
    """
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="vwserver-shards-")) if root_dir is None else root_dir
    remove = root_dir is None
    pki = make_pki(base / "pki")
    admin_token = secrets.token_urlsafe(24)
    users = write_users_file(base / "users.csv", admin_token=admin_token, demo_users=demo_users)

    layout: _Layout | None = None
    started_processes: list[KcpProcess] = []

    async def run(process: KcpProcess) -> None:
        started_processes.append(process)
        await process.start()
        await process.wait_ready(timeout=ready_timeout)

    try:
        for attempt in range(PORT_ATTEMPTS):
            layout = _layout(
                base / f"bed-{attempt}",
                binaries=binaries,
                pki=pki,
                users=users,
                admin_token=admin_token,
            )
            try:
                await run(layout.cache)
                await run(layout.processes[ROOT_SHARD])
                await run(layout.processes[SECOND_SHARD])
                await run(layout.front)
                break
            except KcpError:
                clash = any(_port_clash(p) for p in started_processes)
                for process in reversed(started_processes):
                    await process.stop(grace=stop_grace)
                started_processes.clear()
                if not clash or attempt == PORT_ATTEMPTS - 1:
                    raise
        assert layout is not None
        cache, processes, front = layout.cache, layout.processes, layout.front
        admin_kubeconfig, kubeconfigs = layout.admin_kubeconfig, layout.kubeconfigs
        instance = KcpInstance.from_kubeconfig(
            admin_kubeconfig, workdir=base, context=ADMIN_CONTEXT, process=front
        )
        shards: dict[str, Shard] = {}
        for name, process in processes.items():
            config = write_kubeconfig(
                kubeconfigs / f"{name}.kubeconfig",
                server=process.url,
                ca=pki.serving_ca,
                contexts=(ADMIN_CONTEXT,),
                token=admin_token,
            )
            shards[name] = Shard(
                name=name,
                url=process.url,
                instance=KcpInstance.from_kubeconfig(
                    config, workdir=base / f"{name}-client", context=ADMIN_CONTEXT, process=process
                ),
                process=process,
            )
        await _label_shards(instance, within=ready_timeout)
        await _wait_routes_both(instance, shards, within=ready_timeout)
        yield ShardedKcp(
            front=instance,
            shards=shards,
            cache=cache,
            front_proxy=front,
            pki=pki,
            users_file=users,
            ready_seconds=time.monotonic() - started,
        )
    finally:
        # Front-proxy first, cache last: the reverse of the start order.
        for process in reversed(started_processes):
            await process.stop(grace=stop_grace)
        if remove:
            import shutil

            await asyncio.to_thread(shutil.rmtree, base, True)


async def _label_shards(front: KcpInstance, *, within: float) -> None:
    """Label each Shard object with its name (both must have registered first)."""

    async def registered() -> bool | None:
        doc = await get_json(front, front.cluster_url("root"), "shards")
        names = {item["metadata"]["name"] for item in doc.get("items", [])}
        return True if set(SHARD_NAMES) <= names else None

    await poll("both Shard objects registered", registered, within=within)
    for name in SHARD_NAMES:
        await front.kubectl(
            "label",
            "shard",
            name,
            f"{SHARD_LABEL}={name}",
            "--overwrite",
            server=front.cluster_url("root"),
        )


async def _wait_routes_both(
    front: KcpInstance, shards: Mapping[str, Shard], *, within: float
) -> None:
    """Until the front-proxy serves ``root`` (root shard) — the other shard's workspaces are
    checked as the fixture creates them."""

    async def routes() -> bool | None:
        await get_json(front, front.cluster_url("root"), "namespaces")
        return True

    await poll("front-proxy routes /clusters/root", routes, within=within)
    for shard in shards.values():
        await poll(
            f"shard {shard.name} answers kcp-admin's token",
            functools.partial(_answers, shard.instance),
            within=within,
        )


async def _answers(instance: KcpInstance) -> bool | None:
    await get_json(instance, instance.cluster_url("root"), "namespaces")
    return True
