"""The real kubectl binary against vwserver in front of the fake upstream."""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import SLICE_CLUSTER, Env
from tests.support.kubectl import JsonStream

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


@dataclass
class Kubectl:
    kubeconfig: Path
    cache: Path

    async def run(
        self, *args: str, stdin: str | None = None, timeout: float = 30, check: bool = True
    ) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.cache),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin else None), timeout
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        code = proc.returncode or 0
        if check and code != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({code}): {err.decode()}")
        return code, out.decode(), err.decode()


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "vw", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "ignored-by-the-proxy"}}],
                "contexts": [{"name": "vw", "context": {"cluster": "vw", "user": "u"}}],
                "current-context": "vw",
            }
        )
    )
    return path


@pytest.fixture
def kubectl(env: Env, tmp_path: Path) -> tuple[Kubectl, Kubectl]:
    """(wildcard client, client on logical cluster c1) of the env=prod slice."""
    return (
        Kubectl(kubeconfig(tmp_path / "all", env.slice_url("prod", "*")), tmp_path / "cache-all"),
        Kubectl(kubeconfig(tmp_path / "c1", env.slice_url("prod", "c1")), tmp_path / "cache-c1"),
    )


async def test_get_all_namespaces(kubectl: tuple[Kubectl, Kubectl]) -> None:
    wildcard, _ = kubectl
    _, out, _ = await wildcard.run("get", "widgets", "-A", "-o", "json")
    items = json.loads(out)["items"]
    assert sorted(i["metadata"]["name"] for i in items) == ["w0", "w0", "w2", "w2", "w4", "w4"]
    _, table, _ = await wildcard.run("get", "widgets", "-A")
    assert "w0" in table and "w1" not in table and "w3" not in table


async def test_yaml_of_invisible_object_is_not_found(kubectl: tuple[Kubectl, Kubectl]) -> None:
    _, c1 = kubectl
    code, out, err = await c1.run("get", "widget", "w1", "-n", "ns1", "-o", "yaml", check=False)
    assert code != 0
    assert "not found" in err
    assert "spec-of-w1" not in out + err
    # kubectl says exactly the same for an object that does not exist at all (after a 404 it
    # also asks for the namespace, which the fake upstream does not serve either)
    _, out2, err2 = await c1.run("get", "widget", "nosuch", "-n", "ns1", "-o", "yaml", check=False)
    assert (out2, err2) == (out, err)
    _, out, _ = await c1.run("get", "widget", "w0", "-n", "ns1", "-o", "yaml")
    assert yaml.safe_load(out)["metadata"]["name"] == "w0"


async def test_watch_across_a_label_change(env: Env, kubectl: tuple[Kubectl, Kubectl]) -> None:
    wildcard, _ = kubectl
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        str(wildcard.kubeconfig),
        "--cache-dir",
        str(wildcard.cache),
        "get",
        "widgets",
        "-A",
        "-w",
        "--output-watch-events",
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    events = JsonStream(proc.stdout)

    async def next_event() -> dict[str, object]:
        return await events.next(within=15)

    try:
        initial = [await next_event() for _ in range(6)]  # the 6 visible widgets, as ADDED
        assert {e["type"] for e in initial} == {"ADDED"}
        obj = env.fake.get(cluster="c1", namespace="ns1", name="w0")
        assert obj is not None
        obj["metadata"]["labels"]["env"] = "dev"
        env.fake.update(cluster="c1", obj=obj)
        gone = await next_event()
        assert gone["type"] == "DELETED"
        obj["metadata"]["labels"]["env"] = "prod"
        env.fake.update(cluster="c1", obj=obj)
        back = await next_event()
        assert back["type"] == "ADDED"
        assert back["object"]["metadata"]["name"] == "w0"  # type: ignore[index]
    finally:
        proc.kill()
        await proc.wait()


async def test_patch_delete_and_server_side_apply(
    env: Env, kubectl: tuple[Kubectl, Kubectl], tmp_path: Path
) -> None:
    _, c1 = kubectl
    await c1.run("patch", "widget", "w0", "-n", "ns1", "--type=merge", "-p", '{"spec":{"size":8}}')
    assert (env.fake.get(cluster="c1", namespace="ns1", name="w0") or {})["spec"]["size"] == 8
    code, _, err = await c1.run(
        "patch", "widget", "w0", "-n", "ns1", "--type=merge",
        "-p", '{"metadata":{"labels":{"env":"dev"}}}', check=False,
    )  # fmt: skip
    assert code != 0
    assert "out of the slice" in err
    code, _, err = await c1.run("delete", "widget", "w1", "-n", "ns1", check=False)
    assert code != 0
    assert "not found" in err
    assert env.fake.get(cluster="c1", namespace="ns1", name="w1") is not None
    await c1.run("delete", "widget", "w2", "-n", "ns1")
    assert env.fake.get(cluster="c1", namespace="ns1", name="w2") is None
    manifest = {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": "applied", "namespace": "ns1"},
        "spec": {"size": 2},
    }
    await c1.run(
        "apply", "--server-side", "--validate=false", "-f", "-", stdin=json.dumps(manifest)
    )
    applied = env.fake.get(cluster="c1", namespace="ns1", name="applied")
    assert applied is not None
    assert applied["metadata"]["labels"] == {"env": "prod"}


async def test_writes_on_wildcard_are_refused(kubectl: tuple[Kubectl, Kubectl]) -> None:
    wildcard, _ = kubectl
    code, _, err = await wildcard.run(
        "patch", "widget", "w0", "-n", "ns1", "--type=merge", "-p", "{}", check=False
    )
    assert code != 0
    assert SLICE_CLUSTER not in err  # an honest 405, not a leak of internals
    assert "clusters/*" in err or "not allowed" in err.lower()
