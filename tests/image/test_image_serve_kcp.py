"""``vwserver serve`` from the image, run as the Deployment of ``manifests/deploy/`` runs it,
against the session's kcp in kcp mode.

The container gets what the pod gets: the Deployment's ``args``; the config file of
``manifests/deploy/config.yaml`` (only the addresses and the export's workspace changed: this
run's listener on loopback, its external URL, the test bed's API workspace), the serving
certificate and vwserver's kcp kubeconfig mounted read-only where the Deployment mounts its
ConfigMap and Secrets (group 65532, mode 0440, as ``fsGroup`` and ``defaultMode`` make them);
the image's numeric user, a read-only root filesystem with an in-memory ``/tmp`` only, no
capabilities, no privilege escalation; and the host's network, where kcp listens on loopback.

The demo's slices (:func:`devenv.demo.prepare_world`) become Ready with this server's URL; alice
lists through the slice with kubectl and watches it; SIGTERM ends her watch cleanly and the
container exits 0 by itself within the Deployment's ``terminationGracePeriodSeconds``. The time
from ``podman run`` to ``/readyz`` 200 is printed (not asserted: the machine is shared).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import trustme
import yaml

from devenv.bootstrap import Bootstrap
from devenv.demo import prepare_world, served_endpoint, write_kubeconfigs
from devenv.kcp import REPO_ROOT, KcpInstance, free_ports
from tests.e2e.controller_env import API_WS
from tests.support.podman import (
    Container,
    pod_spec,
    podman_options,
    running,
    share_with_fs_group,
)
from tests.support.vwserver_process import wait_readyz

DEPLOY = REPO_ROOT / "manifests" / "deploy"
TIMEOUT = 60.0  # seconds for any one awaited step


async def wait_ready(base: str, *, ca: Path, container: Container, within: float) -> float:
    """Seconds from ``podman run`` until ``/readyz`` answered 200 over verified TLS."""
    await wait_readyz(
        base,
        ssl_context=ssl.create_default_context(cafile=str(ca)),
        process=container.process,
        log_tail=container.log_tail,
        within=within,
    )
    return asyncio.get_running_loop().time() - container.started


async def kubectl_json(kcp: KcpInstance, kubeconfig: Path, *args: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        kcp.kubectl_binary, f"--kubeconfig={kubeconfig}", *args, "-o", "json",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    doc: dict[str, Any] = json.loads(out)
    return doc


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return meta["annotations"]["kcp.io/cluster"], meta["namespace"], meta["name"]


async def test_serve_from_the_image_in_kcp_mode(
    kcp: KcpInstance,
    world: Bootstrap,
    vwserver_image: str,
    tmp_path: Path,
    observe: Any,
) -> None:
    api = await prepare_world(kcp, world, api_workspace=API_WS)
    spec = pod_spec(DEPLOY)
    (container_spec,) = spec["containers"]
    sources = {name: tmp_path / name for name in ("config", "tls", "kcp-kubeconfig")}
    for directory in sources.values():
        directory.mkdir()

    port, health_port = free_ports(2)
    base = f"https://127.0.0.1:{port}"
    config = yaml.safe_load((DEPLOY / "config.yaml").read_text())
    config["listen"] = {"host": "127.0.0.1", "port": port}
    # the default health port (8081) is the host's here: another free loopback port
    config["health"] = {"host": "127.0.0.1", "port": health_port}
    config["externalURL"] = base
    config["controller"]["export"]["path"] = api.path
    (sources["config"] / "config.yaml").write_text(yaml.safe_dump(config))
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    assert config["tls"] == {
        "certFile": "/etc/vwserver/tls/tls.crt",
        "keyFile": "/etc/vwserver/tls/tls.key",
    }
    cert.cert_chain_pems[0].write_to_path(str(sources["tls"] / "tls.crt"))
    cert.private_key_pem.write_to_path(str(sources["tls"] / "tls.key"))
    assert config["upstream"]["kubeconfig"] == "/etc/vwserver/kcp/kubeconfig"
    kcp.write_admin_kubeconfig(sources["kcp-kubeconfig"] / "kubeconfig", server=kcp.url)
    for directory in sources.values():
        share_with_fs_group(directory)

    grace = spec["terminationGracePeriodSeconds"]
    async with running(
        vwserver_image,
        container_spec["args"],
        options=podman_options(spec, sources),
        log_file=tmp_path / "vwserver.log",
        prefix="vwserver-serve",
    ) as container:
        seconds = await wait_ready(base, ca=tmp_path / "ca.crt", container=container, within=120)
        observe(f"podman run to /readyz 200: {seconds:.1f} s ({vwserver_image})")

        endpoint = await served_endpoint(kcp, world.provider, "prod", base=base)
        # alice's kubeconfig for the slice, trusting the serving certificate's CA (ca.crt)
        write_kubeconfigs(tmp_path, {"prod": endpoint}, token=world.tokens["alice"])
        listed = await kubectl_json(kcp, tmp_path / "prod.kubeconfig", "get", world.resource, "-A")
        # kcp's own answer, read as kcp-admin from the export's virtual workspace
        async with kcp.http_session() as admin:
            url = f"{world.vw_url}/clusters/*/{world.api_path}/{world.resource}"
            async with admin.get(url, params={"labelSelector": "env=prod"}) as r:
                assert r.status == 200, await r.text()
                truth = await r.json()
        expected = {key(o) for o in truth["items"]}
        assert expected, "the demo world has prod widgets"
        assert {key(o) for o in listed["items"]} == expected

        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=grace + TIMEOUT),
        ) as alice:
            watch_url = f"{endpoint}/clusters/*/{world.api_path}/{world.resource}"
            async with alice.get(watch_url, params={"watch": "1"}) as stream:
                assert stream.status == 200, await stream.text()
                added: set[tuple[str, str, str]] = set()
                async with asyncio.timeout(TIMEOUT):
                    while added != expected:
                        event = json.loads(await stream.content.readline())
                        assert event["type"] == "ADDED", event
                        added.add(key(event["object"]))

                signalled = asyncio.get_running_loop().time()
                await container.signal("TERM")
                # The watch ends (end of stream, not a reset) and the server exits by itself.
                async with asyncio.timeout(grace):
                    rest = await stream.content.read()
                assert all(
                    json.loads(line)["type"] in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
                    for line in rest.splitlines()
                    if line.strip()
                )
        code = await container.exit_code(within=grace)
        assert code == 0, container.log_tail()
        took = asyncio.get_running_loop().time() - signalled
        observe(f"exited {code} {took:.1f} s after SIGTERM (grace {grace} s)")
