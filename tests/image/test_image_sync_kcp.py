"""``vwserver sync`` from the image: the image that serves slices also syncs, run as the
Deployment of ``manifests/syncer/`` runs it, for one object.

The world is the syncer e2e suite's (:mod:`tests.e2e.test_syncer_kcp`: a provider exporting the
MongoDBCommunity-like API, two consumers, a downstream workspace with the plain CRD, and a test
operator there). The container gets the Deployment's ``args`` and security settings and the
config of ``manifests/syncer/config.yaml`` with this world's names: the endpoint slice (kcp's own
APIExportEndpointSlice of the provider), and a downstream kubeconfig in place of ``inCluster``
(the downstream "cluster" is a kcp workspace, whose URL has a path that the in-cluster service
address cannot carry). One object created in kcp gets its downstream copy, the operator's status
comes back, and SIGTERM stops the syncer cleanly within the Deployment's grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import yaml

from devenv.kcp import REPO_ROOT, free_ports
from tests.e2e.test_syncer_kcp import (
    EXPORT,
    PREFIX,
    SyncWorld,
    downstream_copy,
    env,
    eventually,
    unique,
    upstream_status,
)
from tests.support.podman import pod_spec, podman_options, running, share_with_fs_group

__all__ = ["env"]

SYNCER = REPO_ROOT / "manifests" / "syncer"


async def test_sync_one_object_from_the_image(
    env: SyncWorld, vwserver_image: str, tmp_path: Path, observe: Any
) -> None:
    spec = pod_spec(SYNCER)
    (container_spec,) = spec["containers"]
    sources = {"config": tmp_path / "config", "kcp-kubeconfig": tmp_path / "kcp"}
    downstream_dir = tmp_path / "downstream"
    for directory in (*sources.values(), downstream_dir):
        directory.mkdir()

    config = yaml.safe_load((SYNCER / "config.yaml").read_text())
    assert config["upstream"]["kubeconfig"] == "/etc/vwserver/kcp/kubeconfig"
    name = unique("image")
    config["name"] = name
    config["upstream"]["endpointSlice"] = {
        "kind": "APIExportEndpointSlice",
        "workspace": env.provider.path,
        "name": EXPORT,
    }
    config["upstream"]["refreshSeconds"] = 5
    assert config["downstream"] == {"inCluster": True}
    config["downstream"] = {"kubeconfig": "/etc/vwserver/downstream/kubeconfig"}
    config["namespacePrefix"] = PREFIX
    (health_port,) = free_ports(1)
    # the manifest's 0.0.0.0:8081 is the host's here: a free loopback port
    config["health"] = {"host": "127.0.0.1", "port": health_port}
    (sources["config"] / "config.yaml").write_text(yaml.safe_dump(config))
    env.kcp.write_admin_kubeconfig(sources["kcp-kubeconfig"] / "kubeconfig", server=env.kcp.url)
    env.kcp.write_admin_kubeconfig(downstream_dir / "kubeconfig", server=env.downstream.url)
    for directory in (*sources.values(), downstream_dir):
        share_with_fs_group(directory)

    options = [
        *podman_options(spec, sources),
        f"--volume={downstream_dir}:/etc/vwserver/downstream:ro",
    ]
    grace = spec["terminationGracePeriodSeconds"]
    ws = env.consumers["a"]
    obj = unique("orders")
    try:
        async with running(
            vwserver_image,
            container_spec["args"],
            options=options,
            log_file=tmp_path / "syncer.log",
            prefix="vwserver-sync",
        ) as container:
            await env.create(ws, obj, team="payments")
            copy = await eventually(
                f"downstream copy\n{container.log_tail()}",
                lambda: downstream_copy(env, ws, obj),
            )
            assert copy["metadata"]["namespace"] == env.down_ns(ws)
            assert copy["spec"]["version"] == "6.0.5"
            up = await eventually(
                "the operator's status in kcp",
                lambda: upstream_status(env, ws, obj, phase="Running"),
            )
            assert "mongoUri" not in up["status"]  # statusExclude of manifests/syncer
            health = f"http://127.0.0.1:{health_port}/readyz"
            status, _ = await env.call("GET", health)
            assert status == 200

            await container.signal("TERM")
            code = await container.exit_code(within=grace)
            assert code == 0, container.log_tail()
            observe(f"syncer exited {code} after SIGTERM:\n{container.log_tail(3)}")
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(env.purge(ws, obj), 30)
