"""The syncer's related resources against real kcp and a real kube-apiserver (issue #25, §2).

One story per module, started by :func:`devenv.seed_story.seed_story` — the code ``make
run-sync`` runs, with its config (:data:`devenv.seed_story.RELATED`: the password Secret copied
down by the reference ``spec.users[*].passwordSecretRef.name``, the operator's connection-string
Secret ``<database>-<db>-<user>`` copied up by a name template): real ``vwserver serve`` serving
slice ``mongodb-eu`` (``region=eu``, ``relatedResources``: the referenced Secrets and the
Secrets carrying syncer ``eu``'s owner label), real ``vwserver sync`` as a process reading
through it, the demo operator of :mod:`devenv.mongo_operator` (``Pending`` until the password
Secret is in its namespace) in the kube-apiserver the module starts as the downstream cluster.
Workspace names are unique to this run; every test works in a namespace of its own.

What is checked is read past vwserver and the syncer (kcp-admin, the kube-apiserver's admin),
plus what the syncer's slice shows (its endpoint, as the syncer reads it) and watches of both:

* both directions: the password Secret is copied down before the database's copy is created
  (resourceVersions of one etcd), the operator goes Running, its connection-string Secret comes
  up into the consumer's namespace with the owner label the slice's selector rule needs;
* a live reference change: the new Secret's copy appears, the old copy goes (and the slice's
  secrets watch says ADDED/DELETED);
* a Secret two databases share: one copy, no finalizers anywhere, kept (same uid) until the
  last reference goes, and an idle syncer writes nothing (no fight);
* deletion removes every copy on both sides, before the kcp object goes, and the empty
  namespace the syncer made;
* a ``region=us`` database's Secret never reaches the eu syncer: not through the slice (GET,
  LIST, watch), not downstream.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from devenv.bootstrap import poll
from devenv.kcp import KcpInstance
from devenv.kubeapi import KubeAPIServer
from devenv.mongo_operator import API, PLURAL, database
from devenv.seed_story import NAMESPACE_PREFIX, SLICE, SYNCER, Story, StoryNames, seed_story
from devenv.slices import KIND
from tests.e2e.controller_env import API_WS, unique
from tests.support.rest import MERGE_PATCH, RestCalls
from tests.support.watches import Recorder, recording
from vwserver.syncer.naming import (
    ANN_SOURCE,
    LABEL_RELATED,
    LABEL_SYNCER,
    downstream_namespace,
    finalizer,
)

WAIT = 60.0  # seconds for one expected convergence (the syncer's resync is 30 s)
T = TypeVar("T")
#: The syncer's copies (its owner label).
OWNED = f"{LABEL_SYNCER}={SYNCER}"


@dataclass
class World(RestCalls):
    kcp: KcpInstance
    story: Story
    kubeapi: KubeAPIServer
    session: aiohttp.ClientSession
    down_session: aiohttp.ClientSession
    slice_session: aiohttp.ClientSession
    """kcp-admin's token, vwserver's CA: the slice's endpoint, as the syncer reads it."""

    def session_for(self, url: str) -> aiohttp.ClientSession:
        if url.startswith(self.kubeapi.url + "/"):
            return self.down_session
        if url.startswith(self.story.base + "/"):
            return self.slice_session
        return self.session

    # where things are -------------------------------------------------------------------------

    def consumer(self, role: int = 0) -> tuple[str, str]:
        """(kcp URL, logical cluster) of consumer workspace ``role``."""
        ws = self.story.world.consumers[role]
        return ws.url, ws.cluster

    def up(self, role: int, namespace: str, resource: str, name: str = "") -> str:
        base, _ = self.consumer(role)
        return _url(base, namespace, resource, name)

    def via_slice(self, role: int, namespace: str, resource: str, name: str = "") -> str:
        _, cluster = self.consumer(role)
        return _url(f"{self.story.endpoint}/clusters/{cluster}", namespace, resource, name)

    def down_ns(self, role: int, namespace: str) -> str:
        _, cluster = self.consumer(role)
        return downstream_namespace(cluster, namespace, prefix=NAMESPACE_PREFIX)

    def down(self, role: int, namespace: str, resource: str, name: str = "") -> str:
        return _url(self.kubeapi.url, self.down_ns(role, namespace), resource, name)

    # writes -----------------------------------------------------------------------------------

    async def create(self, url: str, obj: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.call("POST", url, obj)
        assert status == 201, f"POST {url}: {status} {body}"
        result: dict[str, Any] = body
        return result

    async def patch(self, url: str, patch: Any) -> dict[str, Any]:
        status, body = await self.call("PATCH", url, patch, ctype=MERGE_PATCH)
        assert status == 200, f"PATCH {url}: {status} {body}"
        result: dict[str, Any] = body
        return result

    async def delete(self, url: str) -> None:
        status, body = await self.call("DELETE", url)
        assert status in (200, 202), f"DELETE {url}: {status} {body}"

    async def namespace(self, role: int = 0) -> str:
        """A new namespace in consumer workspace ``role``."""
        name = unique("rel")
        base, _ = self.consumer(role)
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await self.create(f"{base}/api/v1/namespaces", ns)
        return name

    async def secret(self, role: int, namespace: str, name: str, password: str) -> None:
        obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {"password": password},
        }
        await self.create(self.up(role, namespace, "secrets"), obj)

    async def database(
        self, role: int, namespace: str, name: str, *, password: str, region: str = "eu"
    ) -> None:
        """A database in ``region`` whose one user ``app`` (auth db ``admin``) names the
        Secret ``password``; the operator's connection string is ``<name>-admin-app``."""
        obj = database(name, namespace, password=password, labels={"region": region})
        await self.create(self.up(role, namespace, PLURAL), obj)

    # reads ------------------------------------------------------------------------------------

    async def phase(self, role: int, namespace: str, name: str) -> str | None:
        obj = await self.get(self.up(role, namespace, PLURAL, name))
        return ((obj or {}).get("status") or {}).get("phase")

    async def running(self, role: int, namespace: str, name: str) -> None:
        async def probe() -> bool:
            return await self.phase(role, namespace, name) == "Running"

        await eventually(f"{namespace}/{name} Running in kcp", probe)

    async def delete_database(self, role: int, namespace: str, name: str) -> None:
        """Delete it in kcp and wait until kcp has removed it (the syncer's finalizer holds it
        until the copies that go with it are gone)."""
        url = self.up(role, namespace, PLURAL, name)
        await self.delete(url)

        async def gone() -> bool:
            return await self.get(url) is None

        await eventually(f"{namespace}/{name} gone from kcp", gone)

    async def idle_writes(self) -> tuple[float, float]:
        """(the syncer's reconciles that ended ok, its writes), from its /metrics."""
        async with (
            aiohttp.ClientSession() as plain,
            plain.get(f"{self.story.syncer.health}/metrics") as resp,
        ):
            text = await resp.text()
        ok = writes = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vwserver_syncer_reconciles_total":
                    ok += sample.value if sample.labels.get("result") == "ok" else 0.0
                elif sample.name == "vwserver_syncer_writes_total":
                    writes += sample.value
        return ok, writes


GROUP = "mongodbcommunity.mongodb.com"


def _url(base: str, namespace: str, resource: str, name: str = "") -> str:
    api = "api/v1" if resource in ("secrets", "namespaces") else API
    url = f"{base}/{api}/namespaces/{namespace}/{resource}"
    return f"{url}/{name}" if name else url


async def eventually(
    what: str, probe: Callable[[], Awaitable[T | None]], *, within: float = WAIT
) -> T:
    """``probe()`` until it returns something other than None/False (devenv's ``poll``)."""

    async def ready() -> T | None:
        value = await probe()
        return None if value is False else value

    return await poll(what, ready, within=within, interval=0.3)


def decoded(secret: dict[str, Any] | None) -> dict[str, str]:
    data = (secret or {}).get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = obj["metadata"].get("labels") or {}
    return labels


def events_of(recorder: Recorder, name: str) -> list[str]:
    return [e["type"] for e in recorder.of(name)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(
    kcp: KcpInstance, kubeapi: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    cwd = tmp_path_factory.mktemp("syncer-related")
    run_dir = cwd / ".run" / "sync"
    with (cwd / "processes.log").open("w") as sink:
        async with seed_story(
            kcp,
            run_dir=run_dir,
            port=0,
            names=StoryNames.unique("rel"),
            api_workspace=API_WS,
            kubeapi=kubeapi,
            ready_after=1.0,
            log=sink,
            say=lambda _: None,
        ) as story:
            slice_ssl = ssl.create_default_context(cafile=str(run_dir / "ca.crt"))
            async with (
                kcp.http_session(timeout=30) as session,
                kubeapi.http_session(timeout=30) as down,
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=slice_ssl),
                    headers={"Authorization": f"Bearer {kcp.admin_token}"},
                    timeout=aiohttp.ClientTimeout(total=30),
                ) as through,
            ):
                w = World(
                    kcp=kcp,
                    story=story,
                    kubeapi=kubeapi,
                    session=session,
                    down_session=down,
                    slice_session=through,
                )
                try:
                    yield w
                finally:
                    provider = story.world.provider
                    await kcp.kubectl(
                        "delete", KIND, SLICE, "--ignore-not-found", server=provider.url
                    )
                    await _purge(w)


async def _purge(w: World) -> None:
    """No database may keep the syncer's finalizer once the syncer is gone."""
    for ws in w.story.world.consumers:
        listing = await w.get(f"{ws.url}/{API}/{PLURAL}")
        for item in (listing or {}).get("items") or []:
            meta = item["metadata"]
            url = f"{ws.url}/{API}/namespaces/{meta['namespace']}/{PLURAL}/{meta['name']}"
            with contextlib.suppress(AssertionError):
                await w.patch(url, {"metadata": {"finalizers": None}})
            await w.call("DELETE", url)


@contextlib.asynccontextmanager
async def slice_secrets(w: World, role: int, namespace: str) -> AsyncIterator[Recorder]:
    """A watch of the namespace's secrets through the syncer's slice."""
    async with recording(w.slice_session, w.via_slice(role, namespace, "secrets")) as r:
        yield r


# --------------------------------------------------------------------------------------------


async def test_both_directions_in_order_and_deletion_removes_every_copy(world: World) -> None:
    """The password Secret goes down before the database's copy exists; the operator, which
    waits for it, goes Running and writes the connection string, which comes up into the
    consumer's namespace with syncer eu's owner label (the slice shows it); deleting the
    database removes the copies on both sides before the kcp object goes, then the empty
    downstream namespace. The consumer's own Secret stays."""
    w = world
    ns = await w.namespace()
    down_ns = w.down_ns(0, ns)
    db, password, connection = "orders", "orders-pw", "orders-admin-app"
    down = w.kubeapi.url
    async with (
        recording(w.down_session, f"{down}/api/v1/secrets", labelSelector=OWNED) as down_secrets,
        recording(w.down_session, f"{down}/{API}/{PLURAL}", labelSelector=OWNED) as down_dbs,
        slice_secrets(w, 0, ns) as through,
    ):
        await w.secret(0, ns, password, "s3cret")
        await w.database(0, ns, db, password=password)
        await w.running(0, ns, db)

        # down, in order: the Secret's copy was created before the database's copy
        await down_dbs.wait_for("the copy's ADDED", lambda: down_dbs.of(db) or None, within=WAIT)
        pw_added = [e for e in down_secrets.of(password) if e["type"] == "ADDED"]
        db_added = [e for e in down_dbs.of(db) if e["type"] == "ADDED"]
        assert pw_added and db_added, (down_secrets.events, down_dbs.events)
        assert int(pw_added[0]["object"]["metadata"]["resourceVersion"]) < int(
            db_added[0]["object"]["metadata"]["resourceVersion"]
        )
        copy = await w.get(w.down(0, ns, "secrets", password))
        assert copy is not None
        assert copy["metadata"]["namespace"] == down_ns
        assert decoded(copy) == {"password": "s3cret"}
        assert _labels(copy)[LABEL_SYNCER] == SYNCER
        assert LABEL_RELATED in _labels(copy)
        assert copy["metadata"]["annotations"][ANN_SOURCE] == f"{ns}/{password}"
        assert not copy["metadata"].get("finalizers")

        # up: the operator's connection string, in the consumer's namespace, owner-labelled
        async def brought_up() -> dict[str, Any] | None:
            return await w.get(w.up(0, ns, "secrets", connection))

        up_copy = await eventually("the connection string in kcp", brought_up)
        written = await w.get(w.down(0, ns, "secrets", connection))
        assert written is not None
        assert decoded(up_copy) == decoded(written)
        assert decoded(up_copy)["connectionString.standard"].startswith("mongodb://app:s3cret@")
        assert _labels(up_copy)[LABEL_SYNCER] == SYNCER  # what the slice's selector rule shows
        assert not up_copy["metadata"].get("finalizers")
        shown = await w.get(w.via_slice(0, ns, "secrets", connection))
        assert shown is not None and decoded(shown) == decoded(up_copy)
        listing = await w.get(w.via_slice(0, ns, "secrets"))
        assert {i["metadata"]["name"] for i in (listing or {})["items"]} == {password, connection}
        source = await w.get(w.up(0, ns, "secrets", password))
        assert source is not None and not source["metadata"].get("finalizers")
        obj = await w.get(w.up(0, ns, PLURAL, db))
        assert obj is not None and finalizer(SYNCER) in obj["metadata"]["finalizers"]

        # deletion: every copy goes before the kcp object does
        url = w.up(0, ns, PLURAL, db)
        await w.delete(url)

        async def in_order() -> bool:
            there = await w.get(url) is not None
            copies = [
                await w.get(w.down(0, ns, PLURAL, db)),
                await w.get(w.down(0, ns, "secrets", password)),
                await w.get(w.up(0, ns, "secrets", connection)),
            ]
            if not there:
                assert copies == [None, None, None], "the kcp object went before its copies"
            return not there

        await eventually(f"{db} gone from kcp", in_order)
        await through.wait_for(
            "DELETED of both Secrets through the slice",
            lambda: (
                True
                if "DELETED" in events_of(through, password)
                and "DELETED" in events_of(through, connection)
                else None
            ),
            within=WAIT,
        )
    assert events_of(through, password)[0] == "ADDED"  # when the database started naming it
    assert "ADDED" in events_of(through, connection)

    async def operator_cleaned() -> bool:
        return await w.get(w.down(0, ns, "secrets", connection)) is None

    await eventually("the operator's connection string deleted downstream", operator_cleaned)

    async def namespace_gone() -> bool:
        found = await w.get(f"{down}/api/v1/namespaces/{down_ns}")
        # a bare kube-apiserver has no namespace controller: deleted means Terminating there
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    await eventually(f"the empty namespace {down_ns} deleted", namespace_gone, within=90)
    mine = await w.get(w.up(0, ns, "secrets", password))
    assert mine is not None and decoded(mine) == {"password": "s3cret"}  # never a copy: kept


async def test_a_reference_change_moves_the_copy(world: World) -> None:
    """The database switches to another password Secret: the new Secret's copy appears, the
    old copy goes (the slice's watch says ADDED and DELETED), and the operator's connection
    string — and its copy in kcp — follow the new password."""
    w = world
    ns = await w.namespace()
    db, old, new, connection = "users", "pw-old", "pw-new", "users-admin-app"
    await w.secret(0, ns, old, "first")
    await w.secret(0, ns, new, "second")
    async with slice_secrets(w, 0, ns) as through:
        await w.database(0, ns, db, password=old)
        await w.running(0, ns, db)

        async def copied(name: str) -> dict[str, Any] | None:
            return await w.get(w.down(0, ns, "secrets", name))

        await eventually("the old Secret's copy", lambda: copied(old))
        await through.wait_for(
            "the old Secret's ADDED through the slice", lambda: through.of(old) or None, within=WAIT
        )
        assert through.initial == []  # before the database, the slice showed neither
        assert await copied(new) is None  # not referenced: not copied
        assert through.of(new) == []  # ... and not shown

        await w.patch(
            w.up(0, ns, PLURAL, db),
            {
                "spec": {
                    "users": [
                        {
                            "name": "app",
                            "db": "admin",
                            "passwordSecretRef": {"name": new},
                            "roles": [{"name": "readWrite", "db": "orders"}],
                        }
                    ]
                }
            },
        )

        async def moved() -> bool:
            return await copied(new) is not None and await copied(old) is None

        await eventually("the new copy there and the old one gone", moved)
        assert decoded(await copied(new)) == {"password": "second"}

        async def followed() -> bool:
            up = await w.get(w.up(0, ns, "secrets", connection))
            return decoded(up).get("password") == "second"

        await eventually("the connection string's copy with the new password", followed)
        await through.wait_for(
            "ADDED of the new Secret and DELETED of the old one through the slice",
            lambda: (
                True
                if "ADDED" in events_of(through, new) and "DELETED" in events_of(through, old)
                else None
            ),
            within=WAIT,
        )
        await w.delete_database(0, ns, db)


async def test_a_shared_secret_stays_until_the_last_reference_goes(world: World) -> None:
    """Two databases name one password Secret: one copy downstream, no finalizer on the Secret
    or its copy; deleting the first database keeps the copy (same uid, never re-created),
    deleting the second removes it. Meanwhile an idle syncer writes nothing."""
    w = world
    ns = await w.namespace()
    shared, first, second = "shared-pw", "first", "second"
    await w.secret(0, ns, shared, "together")
    down_ns = w.down_ns(0, ns)
    secrets = f"{w.kubeapi.url}/api/v1/namespaces/{down_ns}/secrets"
    async with recording(w.down_session, secrets, labelSelector=OWNED) as copies:
        await w.database(0, ns, first, password=shared)
        await w.database(0, ns, second, password=shared)
        await w.running(0, ns, first)
        await w.running(0, ns, second)
        copy = await w.get(w.down(0, ns, "secrets", shared))
        assert copy is not None and not copy["metadata"].get("finalizers")
        uid = copy["metadata"]["uid"]
        source = await w.get(w.up(0, ns, "secrets", shared))
        assert source is not None and not source["metadata"].get("finalizers")
        for name in (first, second):
            url = w.up(0, ns, "secrets", f"{name}-admin-app")
            await eventually(f"{name}'s connection string in kcp", functools.partial(w.get, url))

        # settled: a round of reconciles (events or the resync) writes nothing anywhere
        ok, writes = await w.idle_writes()

        async def reconciled_again() -> bool:
            now_ok, _ = await w.idle_writes()
            return now_ok >= ok + 2

        await eventually("both databases reconciled again", reconciled_again)
        assert (await w.idle_writes())[1] == writes, "an idle syncer wrote"

        await w.delete_database(0, ns, first)
        copy = await w.get(w.down(0, ns, "secrets", shared))
        assert copy is not None and copy["metadata"]["uid"] == uid
        assert not copy["metadata"].get("deletionTimestamp")
        assert await w.get(w.up(0, ns, "secrets", "first-admin-app")) is None
        assert await w.get(w.up(0, ns, "secrets", "second-admin-app")) is not None
        assert await w.phase(0, ns, second) == "Running"
        assert "DELETED" not in events_of(copies, shared)

        await w.delete_database(0, ns, second)
        assert await w.get(w.down(0, ns, "secrets", shared)) is None
        assert await w.get(w.up(0, ns, "secrets", "second-admin-app")) is None
    assert events_of(copies, shared).count("ADDED") == 1, copies.events
    assert events_of(copies, shared)[-1] == "DELETED"


async def test_a_region_us_secret_never_reaches_the_eu_syncer(world: World) -> None:
    """A ``region=us`` database and its password Secret next to a ``region=eu`` one (which is
    synced: the syncer is looking): the us Secret answers like a missing one through the eu
    slice (GET, LIST, never in its watch), is never copied downstream, and the us database
    gets no finalizer, no copy, no connection string."""
    w = world
    ns = await w.namespace(1)
    await w.secret(1, ns, "us-pw", "far-away")
    await w.secret(1, ns, "eu-pw", "close-by")
    everywhere = f"{w.kubeapi.url}/api/v1/secrets"
    async with (
        slice_secrets(w, 1, ns) as through,
        recording(w.down_session, everywhere, fieldSelector="metadata.name=us-pw") as down,
    ):
        await w.database(1, ns, "us-db", password="us-pw", region="us")
        await w.database(1, ns, "eu-db", password="eu-pw")
        await w.running(1, ns, "eu-db")
        url = w.up(1, ns, "secrets", "eu-db-admin-app")
        await eventually("eu-db's connection string in kcp", functools.partial(w.get, url))
        assert await w.get(w.down(1, ns, "secrets", "eu-pw")) is not None

        status, body = await w.call("GET", w.via_slice(1, ns, "secrets", "us-pw"))
        assert status == 404, body
        assert body["kind"] == "Status" and body["reason"] == "NotFound"
        listing = await w.get(w.via_slice(1, ns, "secrets"))
        names = {i["metadata"]["name"] for i in (listing or {})["items"]}
        assert names == {"eu-pw", "eu-db-admin-app"}
        everywhere_list = await w.get(everywhere)
        assert all(
            i["metadata"]["name"] not in ("us-pw", "us-db-admin-app")
            for i in (everywhere_list or {})["items"]
        )
        us = await w.get(w.up(1, ns, PLURAL, "us-db"))
        assert us is not None and not us["metadata"].get("finalizers") and not us.get("status")
        assert await w.get(w.down(1, ns, PLURAL, "us-db")) is None
        await w.delete_database(1, ns, "eu-db")
        await w.delete(w.up(1, ns, PLURAL, "us-db"))
    assert through.of("us-pw") == [] and through.initial == []
    assert down.events == [] and down.initial == []
    assert {e["object"]["metadata"]["name"] for e in through.events} == {
        "eu-pw",
        "eu-db-admin-app",
    }
