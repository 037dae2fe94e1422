"""``vwserver sync --decommission`` against real kcp: a syncer stopped for good no longer holds up
deletions in kcp, and with ``--delete-downstream`` leaves nothing behind downstream.

The world of ``test_syncer_kcp.py`` (its ``env`` fixture: a provider exporting the
MongoDBCommunity-like API, two consumers, a downstream workspace with the plain CRD and a test
operator that puts its own finalizer on every downstream copy), set up afresh for this module.
The command runs as a process, as an operator would run it: exit code and summary are checked.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import msgspec
import yaml

from devenv.bootstrap import Workspace
from tests.e2e.test_syncer_kcp import (  # env: the module-scoped world, set up for this module
    SyncWorld,
    env,  # noqa: F401
    eventually,
    mongo,
    running,
    unique,
)
from vwserver.syncer.naming import LABEL_SYNCER, downstream_namespace, finalizer

PREFIX = "kcp-"
COMMAND_TIMEOUT = 120.0


async def decommission(world: SyncWorld, config: Any, *flags: str) -> tuple[int, str, str]:
    """``vwserver sync --config <config> --decommission <flags>``: exit code, stdout, stderr."""
    path = world.dir / f"{config.name}.yaml"
    path.write_text(yaml.safe_dump(msgspec.to_builtins(config)))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vwserver.cli", "sync", "--config", str(path), "--decommission",
        *flags, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def create_in(world: SyncWorld, ws: Workspace, namespace: str, name: str) -> None:
    obj = mongo(name, labels={})
    obj["metadata"]["namespace"] = namespace
    status, body = await world.call("POST", world.up_url(ws, namespace), obj)
    assert status == 201, f"create {name}: {status} {body}"


def syncer_finalizers(obj: dict[str, Any] | None) -> list[str]:
    return [f for f in (obj or {}).get("metadata", {}).get("finalizers") or [] if "syncer-" in f]


async def test_decommission_releases_finalizers_and_cleans_downstream(env: SyncWorld) -> None:  # noqa: F811
    ws = env.consumers["a"]
    namespace = unique("decom")
    await env.kcp.kubectl("create", "namespace", namespace, server=ws.url)
    down_ns = downstream_namespace(ws.cluster, namespace, prefix=PREFIX)
    kept, deleted = unique("kept"), unique("gone")
    config = env.syncer_config("decom")

    async def copy(name: str) -> dict[str, Any] | None:
        return await env.get(env.down_url(down_ns, name))

    async with running(env, config):
        for name in (kept, deleted):
            await create_in(env, ws, namespace, name)
        for name in (kept, deleted):
            await eventually(f"copy of {name}", lambda n=name: copy(n))

            async def finalized(n: str = name) -> bool:
                up = await env.get(env.up_url(ws, namespace, n))
                return syncer_finalizers(up) == [finalizer("decom")]

            await eventually(f"finalizer on {name}", finalized)
        # a running syncer would put every finalizer back: refused
        code, _, err = await decommission(env, config)
        assert code == 1 and "decommission refused: the syncer still runs" in err, err

    # stopped for good: a deletion in kcp now hangs on its finalizer
    await env.delete(env.up_url(ws, namespace, deleted))
    hanging = await env.get(env.up_url(ws, namespace, deleted))
    assert hanging is not None and hanging["metadata"].get("deletionTimestamp")

    # 1. finalizers only: the deletion completes, the other object is released, copies stay
    code, out, err = await decommission(env, config)
    assert code == 0, out + err
    assert "finalizers removed: 2" in out and "result: clean" in out
    await eventually(
        "the deletion completes", lambda: _absent(env, env.up_url(ws, namespace, deleted))
    )
    assert syncer_finalizers(await env.get(env.up_url(ws, namespace, kept))) == []
    for name in (kept, deleted):
        remaining = await copy(name)
        assert remaining is not None and remaining["metadata"]["labels"][LABEL_SYNCER] == "decom"

    # 2. downstream too: the copies (after the operator's finalizer) and their namespace go
    code, out, err = await decommission(env, config, "--delete-downstream", "--wait", "60")
    assert code == 0, out + err
    assert "finalizers removed: 0" in out
    assert "downstream copies deleted: 2" in out
    assert f"namespaces deleted: 1\n    {down_ns}" in out
    for name in (kept, deleted):
        assert await copy(name) is None
    await eventually(
        "the namespace is gone",
        lambda: _absent(
            env, f"{env.kcp.url}/clusters/{env.downstream.path}/api/v1/namespaces/{down_ns}"
        ),
    )
    # the kcp object that stays is an ordinary object now: deleting it completes at once
    await env.delete(env.up_url(ws, namespace, kept))
    await eventually("deleted", lambda: _absent(env, env.up_url(ws, namespace, kept)))

    # 3. idempotent: nothing left to do, still clean
    code, out, err = await decommission(env, config, "--delete-downstream")
    assert code == 0, out + err
    assert "finalizers removed: 0" in out and "downstream copies deleted: 0" in out
    assert "namespaces deleted: 0" in out


async def _absent(world: SyncWorld, url: str) -> bool:
    return await world.get(url) is None
