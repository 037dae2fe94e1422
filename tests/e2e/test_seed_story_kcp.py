"""What ``make run-sync`` prints is tested: every kubectl line, run exactly as printed.

The story's lines come from one pure function, :func:`devenv.seed_story.story_lines`; the story
prints them (:func:`~devenv.seed_story.story_text`) and this module runs each one with
``bash -c`` from the directory they were rendered for, against a story started by
:func:`~devenv.seed_story.seed_story` — the code ``make run-sync`` runs — on the session's kcp:
real ``vwserver serve`` in kcp mode serving the slice, real ``vwserver sync`` as a process, the
operator of :mod:`devenv.mongo_operator`. Workspace names are unique to this run. What each line
shows is checked against what kcp and the downstream cluster hold (read as their admins, past
vwserver and the syncer).

The story runs twice: with a kcp workspace as the downstream cluster (what ``make run-sync``
starts and prints), and with a real kube-apiserver (:mod:`devenv.kubeapi`, no kubelet): the
syncer's copies, namespaces and Lease then meet a real cluster's API and admission, and the
printed downstream lines name its kubeconfig.

vwserver's API is installed in ``root:vwserver-api``, the workspace the controller tests use (see
tests/e2e/test_demo_lines_kcp.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from devenv.demo import DemoLine, shown_path
from devenv.kcp import KcpInstance
from devenv.kubeapi import KubeAPIServer, start_kube_apiserver
from devenv.mongo_operator import database, mongo_uri
from devenv.seed_story import (
    EXPORT,
    NAMESPACE_PREFIX,
    PLURAL,
    SAMPLE_FILE,
    SLICE,
    SLICE_LABELS,
    SYNCER,
    Sample,
    Story,
    StoryNames,
    sample_database,
    seed_story,
    story_lines,
    story_text,
)
from devenv.slices import KIND
from tests.e2e.controller_env import API_WS
from tests.support import printed as printed_lines
from tests.support.printed import Ran
from vwserver.syncer.naming import LABEL_SYNCER, downstream_namespace, finalizer

TIMEOUT = 60.0  # seconds for any one command or awaited output (the syncer and kcp converge)


@dataclass(frozen=True, kw_only=True)
class Printed:
    kcp: KcpInstance
    story: Story
    sample: Sample
    lines: dict[str, DemoLine]
    printed: list[str]
    cwd: Path
    env: dict[str, str]
    log: Path
    said: list[str]


@contextlib.asynccontextmanager
async def downstream_cluster(
    kind: str, *, kube_apiserver: Path, etcd: Path, root_dir: Path
) -> AsyncIterator[KubeAPIServer | None]:
    """None: a kcp workspace is the downstream cluster; else a kube-apiserver, stopped after."""
    if kind == "workspace":
        yield None
        return
    async with start_kube_apiserver(
        kube_apiserver=kube_apiserver, etcd=etcd, root_dir=root_dir
    ) as server:
        yield server


@pytest_asyncio.fixture(
    scope="module", loop_scope="session", params=["workspace", "kube-apiserver"]
)
async def story(
    kcp: KcpInstance,
    kube_apiserver_binary: Path,
    etcd_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Printed]:
    cwd = tmp_path_factory.mktemp("seed-story")  # where the user started `make run-sync`
    run_dir = cwd / ".run" / "sync"
    log = cwd / "processes.log"
    said: list[str] = []
    sample = sample_database()
    with log.open("w") as sink:
        async with (
            downstream_cluster(
                request.param,
                kube_apiserver=kube_apiserver_binary,
                etcd=etcd_binary,
                root_dir=cwd / "kubeapi",
            ) as kubeapi,
            seed_story(
                kcp,
                run_dir=run_dir,
                port=0,
                names=StoryNames.unique(),
                api_workspace=API_WS,
                kubeapi=kubeapi,
                ready_after=2.0,
                log=sink,
                say=said.append,
            ) as running,
        ):
            try:
                kwargs: dict[str, Any] = {
                    "kcp": kcp,
                    "world": running.world,
                    "sample_file": shown_path(SAMPLE_FILE, cwd),
                    "sample": sample,
                }
                lines = story_lines(**kwargs)
                text = story_text(
                    **kwargs,
                    run_dir=shown_path(run_dir, cwd),
                    base=running.base,
                    endpoint=running.endpoint,
                    health=running.syncer.health,
                )
                env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
                env["HOME"] = str(cwd / "home")  # kubectl's discovery cache
                yield Printed(
                    kcp=kcp,
                    story=running,
                    sample=sample,
                    lines={line.key: line for line in lines},
                    printed=text.splitlines(),
                    cwd=cwd,
                    env=env,
                    log=log,
                    said=said,
                )
            finally:
                # the slice would point at a stopped server; the sample must not keep the
                # syncer's finalizer once the syncer is gone
                provider = running.world.provider
                await kcp.kubectl("delete", KIND, SLICE, "--ignore-not-found", server=provider.url)
                await _purge(kcp, running, sample)


async def _purge(kcp: KcpInstance, story: Story, sample: Sample) -> None:
    server = story.world.consumers[0].url
    found = await kcp.kubectl(
        "get", PLURAL, sample.name, "-n", sample.namespace, "--ignore-not-found", "-o", "name",
        server=server,
    )  # fmt: skip
    if found.stdout.strip():
        await kcp.kubectl(
            "patch", PLURAL, sample.name, "-n", sample.namespace, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', server=server,
        )  # fmt: skip
        await kcp.kubectl(
            "delete", PLURAL, sample.name, "-n", sample.namespace, "--ignore-not-found",
            "--wait=false", server=server,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Helpers


async def run_line(printed: Printed, key: str) -> Ran:
    """Run the printed line ``key`` as printed, from the directory it was printed for."""
    return await printed_lines.run_line(printed, key, timeout=TIMEOUT)


def table(stdout: str) -> list[dict[str, str]]:
    """kubectl's table output as rows (no empty cells: custom-columns prints ``<none>``)."""
    lines = [line.split() for line in stdout.splitlines() if line.strip()]
    assert lines, "no table"
    header, *rows = lines
    return [dict(zip(header, row, strict=True)) for row in rows]


def aligned(stdout: str) -> dict[str, dict[str, str]]:
    """kubectl's aligned table (``get -L``: a label column may be empty) by its first column:
    cells are cut where the header's columns start."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return {}
    header, *rows = lines
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    assert len(starts) == len(names), header
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    out = {}
    for row in rows:
        cells = {n: row[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)}
        out[cells[names[0]]] = cells
    return out


async def secrets_shown(printed: Printed, key: str, want: set[str]) -> dict[str, dict[str, str]]:
    """Run the printed secrets line ``key`` until it lists exactly ``want`` (the syncer and
    the operator converge a moment after the line before)."""
    shown: dict[str, dict[str, str]] = {}

    async def listed() -> bool:
        nonlocal shown
        ran = await run_line(printed, key)
        assert ran.returncode == 0, ran.stderr
        shown = aligned(ran.stdout)
        return set(shown) == want

    try:
        await eventually(f"line {key} listing {sorted(want)}", listed)
    except AssertionError as e:
        raise AssertionError(f"{e}; it shows {shown}") from None
    return shown


def decoded(secret: dict[str, Any] | None) -> dict[str, str]:
    data = (secret or {}).get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


async def kcp_get(printed: Printed, server: str, *args: str) -> dict[str, Any] | None:
    """An object (or list) as kcp-admin reads it from kcp; None when it does not exist."""
    result = await printed.kcp.kubectl(
        "get", *args, "-o", "json", "--ignore-not-found", server=server
    )
    return json.loads(result.stdout) if result.stdout.strip() else None


async def upstream(printed: Printed) -> dict[str, Any] | None:
    """The sample database in the consumer workspace, from kcp."""
    sample, ws = printed.sample, printed.story.world.consumers[0]
    return await kcp_get(printed, ws.url, PLURAL, sample.name, "-n", sample.namespace)


def copy_namespace(printed: Printed) -> str:
    """Where the syncer puts the sample's downstream copy."""
    ws = printed.story.world.consumers[0]
    return downstream_namespace(ws.cluster, printed.sample.namespace, prefix=NAMESPACE_PREFIX)


async def downstream_get(printed: Printed, *args: str) -> dict[str, Any] | None:
    """An object (or list) as the downstream cluster's admin reads it; None when missing."""
    world = printed.story.world
    if world.kubeapi is None:
        return await kcp_get(printed, world.downstream.url, *args)
    result = await world.kubeapi.kubectl("get", *args, "-o", "json", "--ignore-not-found")
    return json.loads(result.stdout) if result.stdout.strip() else None


async def downstream_copy(printed: Printed) -> dict[str, Any] | None:
    namespace = copy_namespace(printed)
    return await downstream_get(printed, PLURAL, printed.sample.name, "-n", namespace)


async def eventually(what: str, probe: Callable[[], Any], *, within: float = TIMEOUT) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.3)


# --------------------------------------------------------------------------------------------
# The printed text


CHECKED = {
    "slice",
    "create",
    "watch",
    "wait",
    "downstream",
    "downstream-secrets",
    "secrets",
    "delete",
    "downstream-gone",
    "downstream-secrets-gone",
    "secrets-gone",
}


async def test_every_printed_line_is_checked_here(story: Printed) -> None:
    """A line added to the story without a check in this module fails here."""
    assert set(story.lines) == CHECKED
    for line in story.lines.values():
        assert line.command in story.printed  # verbatim, on a line of its own
        for text in line.shows:
            assert f"# {text}" in story.printed
    commands = [p for p in story.printed if p.startswith("kubectl ")]
    assert commands == [line.command for line in story.lines.values()]  # and nothing else


async def test_the_processes_run_and_the_slice_line_shows_the_slice(story: Printed) -> None:
    assert story.story.vwserver.returncode is None
    assert story.story.syncer.process.returncode is None
    assert not story.story.operator_task.done()
    ran = await run_line(story, "slice")
    assert ran.returncode == 0, ran.stderr
    rows = {r["NAME"]: r for r in table(ran.stdout)}
    assert rows[SLICE]["EXPORT"] == EXPORT
    assert rows[SLICE]["READY"] == "True"
    assert rows[SLICE]["ENDPOINT"] == story.story.endpoint
    assert story.story.endpoint.startswith(f"{story.story.base}/services/filtered-apiexport/")


async def test_the_story_create_watch_wait_see_downstream_delete(story: Printed) -> None:
    """The printed lines in their printed order: the sample is created in the consumer
    workspace, appears downstream (synced by the syncer through vwserver's slice), the
    operator's status arrives in kcp (the watch shows it, the wait returns), the downstream line
    shows the copy with its internal mongoUri, and deleting it in kcp completes only once the
    downstream copy is gone."""
    sample = story.sample
    assert sample.labels.items() >= SLICE_LABELS.items()  # the sample is in the slice
    assert await upstream(story) is None

    created = await run_line(story, "create")
    assert created.returncode == 0, created.stderr
    assert created.stdout == "".join(
        [
            *(f"secret/{s} created\n" for s in sample.secrets),
            f"{PLURAL}.{EXPORT}/{sample.name} created\n",
        ]
    )

    # the watch, in the background, until it shows the database Running and Synced
    rows: list[list[str]] = []
    changed = asyncio.Event()
    watch = await printed_lines.spawn(story, "watch")

    async def read() -> None:
        assert watch.stdout is not None
        while line := await watch.stdout.readline():
            cells = line.decode().split()
            if cells and cells[0] != "NAME":
                rows.append(cells)
                changed.set()

    reader = asyncio.create_task(read())
    try:
        # NAME PHASE VERSION MEMBERS SYNCED
        version, members = sample.spec["version"], str(sample.spec["members"])
        want = [sample.name, "Running", version, members, "True"]

        async def running_row() -> bool:
            if watch.returncode is not None:
                raise AssertionError(f"the watch ended: rows {rows}")
            return want in rows

        await eventually(f"a Running row in the watch (rows so far: {rows})", running_row)
    finally:
        await printed_lines.kill(watch)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    assert all(r[0] == sample.name for r in rows)

    waited = await run_line(story, "wait")
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout == f"{PLURAL}.{EXPORT}/{sample.name} condition met\n"

    # ground truth in kcp: the operator's status, without mongoUri; the syncer's finalizer
    up = await upstream(story)
    assert up is not None
    assert up["status"]["phase"] == "Running"
    assert up["status"]["currentMongoDBMembers"] == sample.spec["members"]
    assert "mongoUri" not in up["status"]  # statusExclude
    synced = [c for c in up["status"]["conditions"] if c["type"] == "Synced"]
    assert [c["status"] for c in synced] == ["True"]
    assert finalizer(SYNCER) in up["metadata"]["finalizers"]

    # the downstream copy, as the printed line shows it and as kcp holds it
    copy = await downstream_copy(story)
    assert copy is not None
    assert copy["metadata"]["labels"][LABEL_SYNCER] == SYNCER
    assert copy["spec"] == sample.spec
    namespace = copy_namespace(story)
    seen = await run_line(story, "downstream")
    assert seen.returncode == 0, seen.stderr
    assert {
        "NAMESPACE": namespace,
        "NAME": sample.name,
        "PHASE": "Running",
        "MONGOURI": mongo_uri(namespace, sample.name),
    } in table(seen.stdout)
    assert any(f"{namespace}/{sample.name} is Running" in line for line in story.said)

    # the Secrets on both sides: the password copied down (the syncer's owner label), the
    # operator's connection string downstream, and its copy up in the consumer's namespace
    (password,) = sample.secrets
    (connection,) = sample.connection_secrets
    down = await secrets_shown(story, "downstream-secrets", {password, connection})
    assert down[password]["SYNCER"] == SYNCER
    assert down[connection]["SYNCER"] == ""  # the operator's own
    up_secrets = await secrets_shown(story, "secrets", {password, connection})
    assert up_secrets[password]["SYNCER"] == ""  # the consumer's own
    assert up_secrets[connection]["SYNCER"] == SYNCER
    team = story.story.world.consumers[0].url
    source = await kcp_get(story, team, "secret", password, "-n", sample.namespace)
    copied = await downstream_get(story, "secret", password, "-n", namespace)
    assert decoded(copied) == decoded(source) == {"password": "change-me"}
    written = await downstream_get(story, "secret", connection, "-n", namespace)
    brought = await kcp_get(story, team, "secret", connection, "-n", sample.namespace)
    assert decoded(brought) == decoded(written)
    assert decoded(brought)["connectionString.standard"].startswith("mongodb://app:change-me@")
    assert brought is not None and brought["metadata"]["labels"][LABEL_SYNCER] == SYNCER

    # delete: kubectl waits until kcp has removed it, which the syncer's finalizer holds until
    # the downstream copy is gone
    deleted = await run_line(story, "delete")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == f'{PLURAL}.{EXPORT} "{sample.name}" deleted\n'
    assert await upstream(story) is None
    assert await downstream_copy(story) is None
    gone = await run_line(story, "downstream-gone")
    assert gone.returncode == 0, gone.stderr
    assert table(gone.stdout) == []  # custom-columns prints its header, and no row
    # the syncer removed the connection string's copy before its finalizer went
    assert await kcp_get(story, team, "secret", connection, "-n", sample.namespace) is None
    left = await secrets_shown(story, "secrets-gone", {password})
    assert left[password]["SYNCER"] == ""
    await secrets_shown(story, "downstream-secrets-gone", set())
    ran = await run_line(story, "downstream-secrets-gone")
    assert ran.stdout == "" and f"No resources found in {namespace} namespace." in ran.stderr

    async def namespace_gone() -> bool:
        found = await downstream_get(story, "namespace", namespace)
        # a bare kube-apiserver has no namespace controller: deleted means Terminating there
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    await eventually(f"the empty namespace {namespace} deleted", namespace_gone, within=90)


async def test_a_database_outside_the_slice_is_not_synced(story: Printed) -> None:
    """The filtering is the product: the same database labelled ``region=us`` stays in kcp
    only — no finalizer, no copy, no status."""
    ws = story.story.world.consumers[1]
    doc = yaml_doc(story.sample, name="other-region", labels={"region": "us"})
    await story.kcp.kubectl("apply", "-f", "-", server=ws.url, input=json.dumps(doc))
    try:
        # a database in the slice, created after it, is synced: the syncer is looking
        inside = yaml_doc(story.sample, name="same-region", labels=SLICE_LABELS)
        await story.kcp.kubectl("apply", "-f", "-", server=ws.url, input=json.dumps(inside))

        async def synced() -> bool:
            obj = await kcp_get(story, ws.url, PLURAL, "same-region", "-n", "default")
            return ((obj or {}).get("status") or {}).get("phase") == "Running"

        await eventually("the region=eu database Running", synced)
        other = await kcp_get(story, ws.url, PLURAL, "other-region", "-n", "default")
        assert other is not None
        assert not other["metadata"].get("finalizers")
        assert not other.get("status")
        copies = await downstream_get(story, PLURAL, "-A")
        names = [i["metadata"]["name"] for i in (copies or {}).get("items", [])]
        assert "same-region" in names and "other-region" not in names
    finally:
        await story.kcp.kubectl(
            "delete", PLURAL, "same-region", "other-region", "-n", "default",
            "--ignore-not-found", "--timeout=60s", server=ws.url,
        )  # fmt: skip


def yaml_doc(sample: Sample, *, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The sample's database without users (no password Secret to wait for)."""
    return {
        "apiVersion": f"{EXPORT}/v1",
        "kind": "MongoDBCommunity",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {k: v for k, v in sample.spec.items() if k != "users"},
    }


async def test_the_operator_waits_for_the_password_and_writes_the_connection_string(
    story: Printed,
) -> None:
    """The downstream operator on its own (a database created downstream by its admin, not by
    the syncer): Pending with a message until the password Secret is there, then Running with
    the connection-string Secret ``<database>-<db>-<user>``, rewritten when the password
    changes, deleted with the database."""
    namespace = f"op-{uuid.uuid4().hex[:6]}"
    db = database("users-db", namespace, password="app-password")
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    await downstream_apply(story, ns)
    await downstream_apply(story, db)

    async def status() -> dict[str, Any]:
        obj = await downstream_get(story, PLURAL, "users-db", "-n", namespace)
        return (obj or {}).get("status") or {}

    pending = await eventually("the database Pending", status)
    assert pending["phase"] == "Pending"
    assert "app-password (key password)" in pending["message"]

    def password(value: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "app-password", "namespace": namespace},
            "stringData": {"password": value},
        }

    async def connection(want: str) -> dict[str, str] | None:
        found = await downstream_get(story, "secret", "users-db-admin-app", "-n", namespace)
        data = {
            k: base64.b64decode(v).decode() for k, v in ((found or {}).get("data") or {}).items()
        }
        return data if data.get("password") == want else None

    await downstream_apply(story, password("first"))
    data = await eventually("the connection-string Secret", lambda: connection("first"))
    assert set(data) == {
        "connectionString.standard",
        "connectionString.standardSrv",
        "username",
        "password",
    }
    assert data["username"] == "app"
    assert data["connectionString.standard"].startswith("mongodb://app:first@users-db-0.")
    assert (await status())["phase"] == "Running"

    await downstream_apply(story, password("second"))
    await eventually("the connection string with the new password", lambda: connection("second"))

    await downstream_delete(story, PLURAL, "users-db", "-n", namespace)

    async def secret_gone() -> bool:
        found = await downstream_get(story, "secret", "users-db-admin-app", "-n", namespace)
        return found is None

    await eventually("the connection-string Secret deleted with the database", secret_gone)
    await downstream_delete(story, "namespace", namespace, "--wait=false")


async def downstream_apply(printed: Printed, doc: dict[str, Any]) -> None:
    world = printed.story.world
    if world.kubeapi is None:
        await printed.kcp.kubectl(
            "apply", "-f", "-", server=world.downstream.url, input=json.dumps(doc)
        )
    else:
        await world.kubeapi.kubectl("apply", "-f", "-", input=json.dumps(doc))


async def downstream_delete(printed: Printed, *args: str) -> None:
    world = printed.story.world
    if world.kubeapi is None:
        await printed.kcp.kubectl(
            "delete", *args, "--ignore-not-found", server=world.downstream.url
        )
    else:
        await world.kubeapi.kubectl("delete", *args, "--ignore-not-found")
