"""vwserver in front of real kcp, with kubectl as the client (issue #2 scenarios, issue #3 §5).

The proxy runs in-process on the session's event loop with static routes for two slices of the
demo export, ``prod`` (env=prod) and ``dev`` (env=dev), and talks to kcp's APIExport virtual
workspace as kcp-admin. kubectl talks to the proxy; changes "behind the proxy's back" are made
with kubectl directly in the consumer workspaces.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
import yaml

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance, KubectlResult, free_ports
from tests.e2e.credentials import admin_token, exec_runs, write_exec_kubeconfig
from tests.support.kubectl import JsonStream
from tests.support.slices import slices_over_kcp
from vwserver.config import parse_config
from vwserver.selector import Selector
from vwserver.server import serve

EVENT_TIMEOUT = 20.0


@dataclass
class Proxy:
    base: str
    kcp: KcpInstance
    world: Bootstrap

    def url(self, slice_name: str, cluster: str) -> str:
        return (
            f"{self.base}/services/filtered-apiexport/{self.world.provider.cluster}/"
            f"{slice_name}/clusters/{cluster}"
        )

    async def kubectl(
        self,
        slice_name: str,
        cluster: str,
        *args: str,
        check: bool = True,
        input: str | None = None,
    ) -> KubectlResult:
        return await self.kcp.kubectl(
            *args, server=self.url(slice_name, cluster), check=check, input=input
        )


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def proxy(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Proxy]:
    slices = {env: Selector.parse(f"env={env}") for env in ("prod", "dev")}
    async with slices_over_kcp(kcp, world, slices=slices, page_size=3) as base:
        yield Proxy(base, kcp, world)


def consumer(world: Bootstrap, name: str = "consumer-a") -> Workspace:
    return world.consumer(name)


async def direct(kcp: KcpInstance, ws: Workspace, *args: str, input: str | None = None) -> Any:
    """kubectl in the consumer workspace itself (not through any virtual workspace)."""
    result = await kcp.kubectl(*args, server=ws.url, input=input)
    return json.loads(result.stdout) if result.stdout.strip().startswith("{") else result.stdout


def widget(name: str, namespace: str, **labels: str) -> str:
    return json.dumps(
        {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"size": 1, "color": "red"},
        }
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def test_list_wildcard_and_per_cluster(proxy: Proxy, world: Bootstrap) -> None:
    result = await proxy.kubectl("prod", "*", "get", "widgets", "-A", "-o", "json")
    items = json.loads(result.stdout)["items"]
    got = {
        (
            i["metadata"]["annotations"]["kcp.io/cluster"],
            i["metadata"]["namespace"],
            i["metadata"]["name"],
        )
        for i in items
    }
    expected = {
        (w.cluster, w.namespace, w.name) for w in world.widgets if w.labels["env"] == "prod"
    }
    assert expected <= got  # other tests may add prod widgets; nothing else may appear
    assert all(i["metadata"]["labels"]["env"] == "prod" for i in items)
    ws = consumer(world)
    result = await proxy.kubectl("dev", ws.cluster, "get", "widgets", "-A", "-o", "json")
    items = json.loads(result.stdout)["items"]
    assert items
    assert all(i["metadata"]["labels"]["env"] == "dev" for i in items)
    assert {i["metadata"]["annotations"]["kcp.io/cluster"] for i in items} == {ws.cluster}
    table = await proxy.kubectl("prod", "*", "get", "widgets", "-A")
    assert "prod-eu" in table.stdout
    assert "dev-eu" not in table.stdout


async def test_get_outside_the_slice_is_like_missing(proxy: Proxy, world: Bootstrap) -> None:
    ws = consumer(world)
    ns = next(w.namespace for w in world.widgets if w.cluster == ws.cluster)
    invisible = await proxy.kubectl(
        "prod", ws.cluster, "get", "widget", "dev-eu", "-n", ns, "-o", "yaml", check=False
    )
    missing = await proxy.kubectl(
        "prod", ws.cluster, "get", "widget", "nosuch", "-n", ns, "-o", "yaml", check=False
    )
    assert invisible.returncode != 0
    assert invisible.stdout == ""
    assert invisible.stderr.replace("dev-eu", "X") == missing.stderr.replace("nosuch", "X")
    visible = await proxy.kubectl(
        "prod", ws.cluster, "get", "widget", "prod-eu", "-n", ns, "-o", "yaml"
    )
    assert yaml.safe_load(visible.stdout)["metadata"]["labels"]["env"] == "prod"


async def test_watch_follows_a_label_change(proxy: Proxy, world: Bootstrap) -> None:
    ws = consumer(world)
    name = unique("moving")
    await direct(proxy.kcp, ws, "apply", "-f", "-", input=widget(name, "default", env="prod"))
    args = [
        f"--kubeconfig={proxy.kcp.kubeconfig}",
        f"--context={proxy.kcp.admin_context}",
        f"--server={proxy.url('prod', '*')}",
        "get", "widgets", "-A", "-w", "--output-watch-events", "-o", "json",
        f"--field-selector=metadata.name={name}",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        "kubectl", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    events = JsonStream(proc.stdout)

    async def next_event() -> dict[str, Any]:
        return await events.next(within=EVENT_TIMEOUT)

    try:
        first = await next_event()
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", name)
        await direct(
            proxy.kcp, ws, "label", "widget", name, "-n", "default", "env=dev", "--overwrite"
        )
        gone = await next_event()
        assert gone["type"] == "DELETED"
        assert gone["object"]["metadata"]["name"] == name
        await direct(
            proxy.kcp, ws, "label", "widget", name, "-n", "default", "env=prod", "--overwrite"
        )
        back = await next_event()
        assert back["type"] == "ADDED"
        assert back["object"]["metadata"]["labels"]["env"] == "prod"
    finally:
        proc.kill()
        await proc.wait()
        await direct(proxy.kcp, ws, "delete", "widget", name, "-n", "default", "--ignore-not-found")


async def test_create_patch_apply_delete(proxy: Proxy, world: Bootstrap) -> None:
    ws = consumer(world, "consumer-b")
    name = unique("made")
    # CREATE through the prod slice adds env=prod
    await proxy.kubectl("prod", ws.cluster, "create", "-f", "-", input=widget(name, "default"))
    stored = await direct(proxy.kcp, ws, "get", "widget", name, "-n", "default", "-o", "json")
    assert stored["metadata"]["labels"] == {"env": "prod"}
    # a conflicting label is refused, naming the label
    bad = await proxy.kubectl(
        "prod", ws.cluster, "create", "-f", "-", check=False,
        input=widget(unique("bad"), "default", env="dev"),
    )  # fmt: skip
    assert bad.returncode != 0
    assert "metadata.labels[env]" in bad.stderr
    # merge and JSON patches (dry-run first, then for real)
    await proxy.kubectl(
        "prod", ws.cluster, "patch", "widget", name, "-n", "default", "--type=merge",
        "-p", '{"spec":{"size":5}}',
    )  # fmt: skip
    await proxy.kubectl(
        "prod", ws.cluster, "patch", "widget", name, "-n", "default", "--type=json",
        "-p", '[{"op":"replace","path":"/spec/color","value":"blue"}]',
    )  # fmt: skip
    stored = await direct(proxy.kcp, ws, "get", "widget", name, "-n", "default", "-o", "json")
    assert (stored["spec"]["size"], stored["spec"]["color"]) == (5, "blue")
    # a patch that would move it out of the slice: 422, nothing written
    out = await proxy.kubectl(
        "prod", ws.cluster, "patch", "widget", name, "-n", "default", "--type=merge",
        "-p", '{"metadata":{"labels":{"env":"dev"}}}', check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "out of the slice" in out.stderr
    stored = await direct(proxy.kcp, ws, "get", "widget", name, "-n", "default", "-o", "json")
    assert stored["metadata"]["labels"]["env"] == "prod"
    # server-side apply: kcp's field-manager conflict reaches the client as such ...
    applied = json.loads(widget(name, "default"))
    applied["spec"] = {"size": 9, "color": "blue"}
    conflict = await proxy.kubectl(
        "prod", ws.cluster, "apply", "--server-side", "--validate=false", "-f", "-",
        input=json.dumps(applied), check=False,
    )  # fmt: skip
    assert conflict.returncode != 0
    assert "conflict" in conflict.stderr.lower()
    assert "kept changing" not in conflict.stderr
    # ... and --force-conflicts applies
    await proxy.kubectl(
        "prod", ws.cluster, "apply", "--server-side", "--force-conflicts", "--validate=false",
        "-f", "-", input=json.dumps(applied),
    )  # fmt: skip
    stored = await direct(proxy.kcp, ws, "get", "widget", name, "-n", "default", "-o", "json")
    assert stored["spec"]["size"] == 9
    # the status subresource
    await proxy.kubectl(
        "prod", ws.cluster, "patch", "widget", name, "-n", "default", "--type=merge",
        "--subresource=status", "-p", '{"status":{"phase":"Running"}}',
    )  # fmt: skip
    stored = await direct(proxy.kcp, ws, "get", "widget", name, "-n", "default", "-o", "json")
    assert stored["status"]["phase"] == "Running"
    # DELETE through the wrong slice is a 404 and deletes nothing; through the right one works
    wrong = await proxy.kubectl(
        "dev", ws.cluster, "delete", "widget", name, "-n", "default", check=False
    )
    assert wrong.returncode != 0
    assert "not found" in wrong.stderr
    await proxy.kubectl("prod", ws.cluster, "delete", "widget", name, "-n", "default")
    gone = await proxy.kcp.kubectl(
        "get", "widget", name, "-n", "default", server=ws.url, check=False
    )
    assert gone.returncode != 0


async def test_deletecollection_only_touches_the_slice(proxy: Proxy, world: Bootstrap) -> None:
    ws = consumer(world, "consumer-b")
    ns = unique("dc")
    await direct(proxy.kcp, ws, "create", "namespace", ns)
    try:
        for env in ("prod", "dev"):
            await direct(proxy.kcp, ws, "apply", "-f", "-", input=widget(f"w-{env}", ns, env=env))
        await proxy.kubectl("prod", ws.cluster, "delete", "widgets", "--all", "-n", ns)
        left = await direct(proxy.kcp, ws, "get", "widgets", "-n", ns, "-o", "json")
        assert [i["metadata"]["name"] for i in left["items"]] == ["w-dev"]
    finally:
        await direct(proxy.kcp, ws, "delete", "namespace", ns, "--wait=false")


async def test_wildcard_writes_are_405_and_apibindings_read_only(
    proxy: Proxy, world: Bootstrap
) -> None:
    out = await proxy.kubectl(
        "prod", "*", "patch", "widget", "prod-eu", "-n", "default", "--type=merge",
        "-p", "{}", check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "MethodNotAllowed" in out.stderr or "not allowed" in out.stderr.lower()
    bindings = await proxy.kubectl("prod", "*", "get", "apibindings", "-o", "json")
    names = {i["metadata"]["name"] for i in json.loads(bindings.stdout)["items"]}
    assert names


async def test_serve_with_an_exec_plugin_kubeconfig(
    kcp: KcpInstance, world: Bootstrap, tmp_path: Path
) -> None:
    """``vwserver serve`` whose ``upstream.kubeconfig`` gets vwserver's kcp credentials from an
    exec plugin: the plugin runs, reviews and slice reads go through with its token."""
    kubeconfig = write_exec_kubeconfig(kcp, server=kcp.url, directory=tmp_path)
    (port,) = free_ports(1)
    raw = {
        "listen": {"host": "127.0.0.1", "port": port},
        "insecureServing": True,
        "upstream": {"kubeconfig": kubeconfig.name},
        "slices": [
            {
                "cluster": world.provider.cluster,
                "name": "exec-prod",
                "upstreamURL": world.vw_url,
                "selector": {"matchLabels": {"env": "prod"}},
            }
        ],
    }
    config = parse_config(raw, base_dir=tmp_path)
    stop = asyncio.Event()
    server = asyncio.create_task(serve(config, base_dir=tmp_path, stop=stop))
    base = f"http://127.0.0.1:{port}"
    url = (
        f"{base}/services/filtered-apiexport/{world.provider.cluster}/exec-prod/clusters/*/"
        f"{world.api_path}/{world.resource}"
    )
    headers = {"Authorization": f"Bearer {admin_token(kcp)}"}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                assert not server.done(), server.exception()
                try:
                    async with session.get(f"{base}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            async with session.get(url, headers=headers) as r:
                assert r.status == 200, await r.text()
                items = (await r.json())["items"]
        assert items
        assert all(i["metadata"]["labels"]["env"] == "prod" for i in items)
        assert exec_runs(tmp_path) >= 1
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
