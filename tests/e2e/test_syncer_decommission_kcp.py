"""``vwserver sync --decommission`` against real kcp: a syncer stopped for good no longer holds up
deletions in kcp, and with ``--delete-downstream`` leaves nothing behind downstream.

The world of ``test_syncer_kcp.py`` (its ``env`` fixture: a provider exporting the
MongoDBCommunity-like API, two consumers, a downstream workspace with the plain CRD and a test
operator that puts its own finalizer on every downstream copy), set up afresh for this module.
For related resources, the seed story of ``test_syncer_related_kcp.py`` (its ``world``
fixture: vwserver serving the slice with its ``relatedResources``, the story's syncer with the
password Secret copied down and the operator's connection-string Secret copied up, the demo
operator in a kube-apiserver), also set up afresh for this module.
The command runs as a process, as an operator would run it: exit code and summary are checked.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from pathlib import Path
from typing import Any

import msgspec
import yaml

from devenv.bootstrap import Workspace
from devenv.demo import stop_process
from devenv.mongo_operator import PLURAL
from devenv.seed_story import SYNCER
from tests.e2e.test_syncer_kcp import (  # env: the module-scoped world, set up for this module
    SyncWorld,
    env,  # noqa: F401
    eventually,
    mongo,
    running,
    unique,
)
from tests.e2e.test_syncer_related_kcp import (  # world: the seed story, set up for this module
    World,
    world,  # noqa: F401
)
from tests.e2e.test_syncer_related_kcp import eventually as eventually_in
from vwserver.syncer.naming import LABEL_RELATED, LABEL_SYNCER, downstream_namespace, finalizer

PREFIX = "kcp-"
COMMAND_TIMEOUT = 120.0


async def decommission(sw: SyncWorld, config: Any, *flags: str) -> tuple[int, str, str]:
    """``vwserver sync --config <config> --decommission <flags>``: exit code, stdout, stderr."""
    path = sw.dir / f"{config.name}.yaml"
    path.write_text(yaml.safe_dump(msgspec.to_builtins(config)))
    return await decommission_with(path, *flags)


async def decommission_with(path: Path, *flags: str) -> tuple[int, str, str]:
    """``vwserver sync --config <path> --decommission <flags>``: exit code, stdout, stderr."""
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


async def create_in(sw: SyncWorld, ws: Workspace, namespace: str, name: str) -> None:
    obj = mongo(name, labels={})
    obj["metadata"]["namespace"] = namespace
    status, body = await sw.call("POST", sw.up_url(ws, namespace), obj)
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
            await eventually(f"copy of {name}", functools.partial(copy, name))

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


async def _absent(sw: SyncWorld, url: str) -> bool:
    return await sw.get(url) is None


# --- related resources -------------------------------------------------------------------------


async def test_decommission_deletes_the_related_copies_down_and_up(world: World) -> None:  # noqa: F811
    """A database with its password Secret copied down and the operator's connection string
    copied up; the syncer stopped, ``--delete-downstream`` deletes the database's copy, the
    password's copy downstream and the connection string's copy in kcp — each a copy of this
    syncer's by the sync loop's rule — and then the emptied namespace. A consumer Secret that
    carries the copies' labels but was not written by the syncer is no copy: it stays, as does
    the consumer's own password Secret."""
    w = world
    ns = await w.namespace()
    down_ns = w.down_ns(0, ns)
    db, password, connection = "orders", "orders-pw", "orders-admin-app"
    await w.secret(0, ns, password, "s3cret")
    await w.database(0, ns, db, password=password)
    await w.running(0, ns, db)

    async def brought_up() -> dict[str, Any] | None:
        return await w.get(w.up(0, ns, "secrets", connection))

    up_copy = await eventually_in("the connection string in kcp", brought_up)
    down_copy = await w.get(w.down(0, ns, "secrets", password))
    assert down_copy is not None and await w.get(w.down(0, ns, PLURAL, db)) is not None
    # a consumer's Secret with the labels of a copy up (the slice shows it: owner label)
    forged = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "forged",
            "namespace": ns,
            "labels": {
                LABEL_SYNCER: SYNCER,
                LABEL_RELATED: up_copy["metadata"]["labels"][LABEL_RELATED],
            },
        },
        "stringData": {"connectionString.standard": "mongodb://elsewhere"},
    }
    await w.create(w.up(0, ns, "secrets"), forged)

    await stop_process(w.story.syncer.process)  # stopped for good (its Lease released)
    config = w.story.run_dir / "syncer.yaml"
    code, out, err = await decommission_with(config, "--delete-downstream", "--wait", "60")
    assert code == 0, out + err
    assert "finalizers removed: 1" in out
    assert "downstream copies deleted: 2" in out
    assert f"{PLURAL} {down_ns}/{db}" in out
    assert f"secrets (related password) {down_ns}/{password}" in out
    assert "related copies deleted in kcp: 1" in out
    assert f"/{ns}/{connection} (related connection-string)" in out
    assert await w.get(w.down(0, ns, PLURAL, db)) is None
    assert await w.get(w.down(0, ns, "secrets", password)) is None
    assert await w.get(w.up(0, ns, "secrets", connection)) is None
    assert await w.get(w.up(0, ns, "secrets", "forged")) is not None  # no copy of ours
    mine = await w.get(w.up(0, ns, "secrets", password))
    assert mine is not None and not mine["metadata"].get("finalizers")  # never a copy: kept
    obj = await w.get(w.up(0, ns, PLURAL, db))
    assert obj is not None and not obj["metadata"].get("finalizers")

    # the operator deletes its connection string with the database's copy; once it has, the
    # namespace is empty and goes (in this run, or in the next one: running again is safe)
    async def operator_cleaned() -> bool:
        return await w.get(w.down(0, ns, "secrets", connection)) is None

    await eventually_in("the operator's connection string deleted", operator_cleaned)
    if f"namespaces deleted: 1\n    {down_ns}" not in out:
        code, again, err = await decommission_with(config, "--delete-downstream")
        assert code == 0, again + err
        assert "downstream copies deleted: 0" in again
        assert f"    {down_ns}" in again.split("namespaces deleted:")[1], again
    found = await w.get(f"{w.kubeapi.url}/api/v1/namespaces/{down_ns}")
    # a bare kube-apiserver has no namespace controller: deleted means Terminating there
    assert found is None or found["metadata"].get("deletionTimestamp")
