"""Every option a client sends with a write reaches kcp with its meaning (issue #22, finding 1),
observed in kcp itself: after each write through the ``prod`` slice the object is read straight
from the consumer workspace (kcp-admin, no virtual workspace).

Facts these tests rest on (kcp v0.32.3):

* DELETE/DELETECOLLECTION: the apiserver reads DeleteOptions from the body when there is one and
  then ignores the DeleteOptions query parameters; the proxy always sends a body (its
  preconditions), so it moves the client's query options into it. Body and query together: 400.
* kcp runs a garbage collector per logical cluster that acts on these custom resources well
  within the tests' bound (``GC_WAIT``): Orphan (or ``orphanDependents=true``) removes the dependents' ownerReferences,
  Background, Foreground and the default (custom resources: Background) delete them.
* Custom resources have no graceful deletion: ``gracePeriodSeconds`` is accepted in both forms,
  and an object held by a finalizer gets ``deletionGracePeriodSeconds: 0`` whatever was asked.
* kcp's JSON patch ignores what precedes the first ``/`` of a pointer (finding 8, shown directly).

Also: apply carrying the stored resourceVersion (finding 10), and dependents outside the slice
(finding 12). The proxy serves the slices from the shared watch cache, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance
from tests.support.slices import slice_url, slices_over_kcp
from vwserver.selector import Selector

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

API = "example.io/v1alpha1"
GC_WAIT = 30.0  # seconds kcp's garbage collector gets to act (it takes ~1 s)
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


@dataclass
class Kit:
    kcp: KcpInstance
    ws: Workspace
    namespace: str
    admin: aiohttp.ClientSession
    client: aiohttp.ClientSession
    base: str
    world: Bootstrap

    @property
    def direct(self) -> str:
        return f"{self.ws.url}/apis/{API}/namespaces/{self.namespace}/widgets"

    def through(self, slice_name: str = "prod") -> str:
        url = slice_url(self.base, self.world, slice_name, self.ws.cluster)
        return f"{url}/apis/{API}/namespaces/{self.namespace}/widgets"

    async def create(
        self,
        name: str,
        *,
        env: str = "prod",
        owner: dict[str, Any] | None = None,
        finalizers: list[str] | None = None,
        blocks_owner: bool = False,
    ) -> dict[str, Any]:
        """A widget created directly in kcp (``blocks_owner``: its ownerReference has
        ``blockOwnerDeletion``, so a foreground deletion of the owner waits for it)."""
        meta: dict[str, Any] = {"name": name, "labels": {"env": env, "t": self.namespace}}
        if owner is not None:
            om = owner["metadata"]
            meta["ownerReferences"] = [
                {"apiVersion": API, "kind": "Widget", "name": om["name"], "uid": om["uid"]}
            ]
            if blocks_owner:
                meta["ownerReferences"][0]["blockOwnerDeletion"] = True
        if finalizers:
            meta["finalizers"] = finalizers
        body = {"apiVersion": API, "kind": "Widget", "metadata": meta, "spec": {"size": 1}}
        async with self.admin.post(self.direct, json=body) as r:
            doc = await r.json()
            assert r.status == 201, doc
            return dict(doc)

    async def stored(self, name: str) -> dict[str, Any] | None:
        """The widget as kcp has it (None: gone)."""
        async with self.admin.get(f"{self.direct}/{name}") as r:
            if r.status == 404:
                return None
            doc = await r.json()
            assert r.status == 200, doc
            return dict(doc)

    async def send(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        data: str | None = None
        if body is not None:
            data = body if isinstance(body, str) else json.dumps(body)
        async with self.client.request(
            method, url, params=params, data=data, headers={"Content-Type": content_type}
        ) as r:
            raw = await r.read()
            return r.status, json.loads(raw) if raw.strip() else None

    async def forget(self, name: str) -> None:
        """Gone from kcp, finalizers and all."""
        async with self.admin.patch(
            f"{self.direct}/{name}",
            data=json.dumps({"metadata": {"finalizers": None}}),
            headers={"Content-Type": MERGE},
        ):
            pass
        async with self.admin.delete(f"{self.direct}/{name}"):
            pass


async def until(what: str, check: Callable[[], Awaitable[bool]], *, within: float) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - polling kcp, not waiting for an event
            await asyncio.sleep(0.2)
    assert await check(), what


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def rv(obj: dict[str, Any] | None) -> str:
    assert obj is not None
    return str(obj["metadata"]["resourceVersion"])


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def kit(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Kit]:
    ws = world.consumer("consumer-a")
    namespace = unique("opts")
    slices = {env: Selector.parse(f"env={env}") for env in ("prod", "dev")}
    async with (
        slices_over_kcp(kcp, world, slices=slices, page_size=50, cache=True) as base,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=kcp.ssl_context()),
            headers={"Authorization": f"Bearer {kcp.admin_token}"},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as admin,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client,
    ):
        await kcp.kubectl("create", "namespace", namespace, server=ws.url)
        try:
            yield Kit(kcp, ws, namespace, admin, client, base, world)
        finally:
            with contextlib.suppress(Exception):
                await kcp.kubectl("delete", "namespace", namespace, "--wait=false", server=ws.url)


# --- dryRun: every verb, query and body forms -------------------------------------------------


@pytest.mark.parametrize("form", ["query", "body"])
async def test_dry_run_delete_deletes_nothing(kit: Kit, form: str) -> None:
    obj = await kit.create(unique("dry"))
    name = obj["metadata"]["name"]
    params = {"dryRun": "All"} if form == "query" else None
    body = {"dryRun": ["All"]} if form == "body" else None
    status, doc = await kit.send("DELETE", f"{kit.through()}/{name}", params=params, body=body)
    assert status == 200, doc
    assert rv(await kit.stored(name)) == rv(obj)  # not deleted, not even marked


@pytest.mark.parametrize("form", ["query", "body"])
async def test_dry_run_deletecollection_deletes_nothing(kit: Kit, form: str) -> None:
    mark = unique("coll")
    objs = [await kit.create(f"{mark}-{i}") for i in range(3)]
    dev = await kit.create(f"{mark}-dev", env="dev")
    params = {"labelSelector": f"t={kit.namespace}"}
    if form == "query":
        params["dryRun"] = "All"
    body = {"dryRun": ["All"]} if form == "body" else None
    status, doc = await kit.send("DELETE", kit.through(), params=params, body=body)
    assert status == 200, doc
    names = {i["metadata"]["name"] for i in doc["items"]}
    assert {o["metadata"]["name"] for o in objs} <= names
    for obj in [*objs, dev]:
        assert rv(await kit.stored(obj["metadata"]["name"])) == rv(obj)


@pytest.mark.parametrize(
    ("params", "body"),
    [
        ({"dryRun": "All"}, {"preconditions": {"uid": "x"}}),
        ({"propagationPolicy": "Orphan"}, {}),
        ({"gracePeriodSeconds": "0"}, {"dryRun": ["All"]}),
    ],
)
async def test_delete_options_in_body_and_query_are_refused(
    kit: Kit, params: dict[str, str], body: dict[str, Any]
) -> None:
    obj = await kit.create(unique("both"))
    name = obj["metadata"]["name"]
    for url in (f"{kit.through()}/{name}", kit.through()):
        status, doc = await kit.send("DELETE", url, params=params, body=body)
        assert status == 400, doc
        assert next(iter(params)) in doc["message"]
    assert rv(await kit.stored(name)) == rv(obj)


def _writes(name: str, namespace: str, stored: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    """(method, subpath, content type, body) of every write verb, changing the object."""
    updated = {**stored, "spec": {"size": 7}}
    status = {**stored, "status": {"phase": "dry"}}
    apply = {
        "apiVersion": API,
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace, "labels": {"env": "prod"}},
        "spec": {"color": "dry"},  # spec.size is the creator's: applying it would conflict
    }
    return [
        ("PUT", "", "application/json", updated),
        ("PUT", "/status", "application/json", status),
        ("PATCH", "", MERGE, {"spec": {"size": 3}}),
        ("PATCH", "", JSON_PATCH, [{"op": "replace", "path": "/spec/size", "value": 5}]),
        ("PATCH", "", APPLY, yaml.safe_dump(apply)),
        ("PATCH", "/status", MERGE, {"status": {"phase": "dry"}}),
        ("PATCH", "/status", JSON_PATCH, [{"op": "add", "path": "/status", "value": {"a": 1}}]),
    ]


async def test_dry_run_writes_change_nothing(kit: Kit) -> None:
    obj = await kit.create(unique("drywrite"))
    name = obj["metadata"]["name"]
    for method, sub, content_type, body in _writes(name, kit.namespace, obj):
        params = {"dryRun": "All", "fieldManager": "opt-dry"}
        status, doc = await kit.send(
            method,
            f"{kit.through()}/{name}{sub}",
            params=params,
            body=body,
            content_type=content_type,
        )
        assert status == 200, (method, sub, content_type, doc)
        assert rv(await kit.stored(name)) == rv(obj), (method, sub, content_type)
    created = unique("drycreate")
    new = {
        "apiVersion": API,
        "kind": "Widget",
        "metadata": {"name": created, "labels": {"env": "prod"}},
        "spec": {"size": 1},
    }
    status, doc = await kit.send("POST", kit.through(), params={"dryRun": "All"}, body=new)
    assert status == 201, doc
    apply = yaml.safe_dump({**new, "metadata": {**new["metadata"], "name": f"{created}-a"}})
    status, doc = await kit.send(
        "PATCH",
        f"{kit.through()}/{created}-a",
        params={"dryRun": "All", "fieldManager": "opt-dry"},
        body=apply,
        content_type=APPLY,
    )
    assert status in (200, 201), doc
    assert await kit.stored(created) is None
    assert await kit.stored(f"{created}-a") is None


# --- propagationPolicy / orphanDependents: kcp's garbage collector -------------------------------


@pytest.mark.parametrize(
    ("params", "body", "kept"),
    [
        ({"propagationPolicy": "Orphan"}, None, True),
        (None, {"propagationPolicy": "Orphan"}, True),
        ({"orphanDependents": "true"}, None, True),
        ({"propagationPolicy": "Background"}, None, False),
        (None, {"propagationPolicy": "Foreground"}, False),
        ({"propagationPolicy": "Foreground"}, None, False),
        (None, None, False),  # the default for custom resources: Background
    ],
)
async def test_propagation_reaches_kcps_garbage_collector(
    kit: Kit, params: dict[str, str] | None, body: dict[str, Any] | None, kept: bool
) -> None:
    owner = await kit.create(unique("owner"))
    dependent = await kit.create(unique("dep"), owner=owner)
    dep = dependent["metadata"]["name"]
    status, doc = await kit.send(
        "DELETE", f"{kit.through()}/{owner['metadata']['name']}", params=params, body=body
    )
    assert status in (200, 202), doc

    async def orphaned() -> bool:
        now = await kit.stored(dep)
        return now is not None and not now["metadata"].get("ownerReferences")

    async def collected() -> bool:
        return await kit.stored(dep) is None

    if kept:
        await until("the dependent orphaned", orphaned, within=GC_WAIT)
    else:
        await until("the dependent collected", collected, within=GC_WAIT)
    await until(
        "the owner gone",
        lambda: _gone(kit, owner["metadata"]["name"]),
        within=GC_WAIT,
    )


async def _gone(kit: Kit, name: str) -> bool:
    return await kit.stored(name) is None


# --- fieldManager, fieldValidation, force -----------------------------------------------------


def _managers(obj: dict[str, Any] | None) -> set[str]:
    assert obj is not None
    return {m["manager"] for m in obj["metadata"].get("managedFields") or []}


async def test_field_manager_shows_in_managed_fields(kit: Kit) -> None:
    name = unique("fm")
    new = {
        "apiVersion": API,
        "kind": "Widget",
        "metadata": {"name": name, "labels": {"env": "prod"}},
        "spec": {"size": 1},
    }
    status, doc = await kit.send(
        "POST", kit.through(), params={"fieldManager": "opt-creator"}, body=new
    )
    assert status == 201, doc
    assert "opt-creator" in _managers(await kit.stored(name))
    url = f"{kit.through()}/{name}"
    status, doc = await kit.send(
        "PATCH",
        url,
        params={"fieldManager": "opt-merger"},
        body={"spec": {"size": 2}},
        content_type=MERGE,
    )
    assert status == 200, doc
    stored = await kit.stored(name)
    assert "opt-merger" in _managers(stored)
    assert stored is not None
    status, doc = await kit.send(
        "PUT", url, params={"fieldManager": "opt-updater"}, body={**stored, "spec": {"size": 3}}
    )
    assert status == 200, doc
    assert "opt-updater" in _managers(await kit.stored(name))
    status, doc = await kit.send(
        "PATCH",
        f"{url}/status",
        params={"fieldManager": "opt-status"},
        body={"status": {"phase": "x"}},
        content_type=MERGE,
    )
    assert status == 200, doc
    assert "opt-status" in _managers(await kit.stored(name))


async def test_field_validation_strict_refuses_an_unknown_field(kit: Kit) -> None:
    name = unique("fv")
    new = {
        "apiVersion": API,
        "kind": "Widget",
        "metadata": {"name": name, "labels": {"env": "prod"}},
        "spec": {"size": 1, "bogus": True},
    }
    status, doc = await kit.send(
        "POST", kit.through(), params={"fieldValidation": "Strict"}, body=new
    )
    assert status in (400, 422), doc
    assert "bogus" in doc["message"]
    assert await kit.stored(name) is None
    status, doc = await kit.send(
        "POST", kit.through(), params={"fieldValidation": "Ignore"}, body=new
    )
    assert status == 201, doc
    before = await kit.stored(name)
    assert before is not None and "bogus" not in before["spec"]
    url = f"{kit.through()}/{name}"
    for content_type, body in (
        (MERGE, {"spec": {"bogus": 1}}),
        (JSON_PATCH, [{"op": "add", "path": "/spec/bogus", "value": 1}]),
    ):
        status, doc = await kit.send(
            "PATCH",
            url,
            params={"fieldValidation": "Strict"},
            body=body,
            content_type=content_type,
        )
        assert status in (400, 422), (content_type, doc)
    status, doc = await kit.send(
        "PUT", url, params={"fieldValidation": "Strict"}, body={**before, "spec": {"bogus": 1}}
    )
    assert status in (400, 422), doc
    assert rv(await kit.stored(name)) == rv(before)


async def test_force_resolves_an_apply_conflict(kit: Kit) -> None:
    name = unique("force")
    url = f"{kit.through()}/{name}"

    def config(size: int) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": API,
                "kind": "Widget",
                "metadata": {"name": name, "labels": {"env": "prod"}},
                "spec": {"size": size},
            }
        )

    status, doc = await kit.send(
        "PATCH", url, params={"fieldManager": "opt-a"}, body=config(1), content_type=APPLY
    )
    assert status in (200, 201), doc
    status, doc = await kit.send(
        "PATCH", url, params={"fieldManager": "opt-b"}, body=config(2), content_type=APPLY
    )
    assert status == 409, doc  # a field conflict: spec.size is opt-a's
    stored = await kit.stored(name)
    assert stored is not None and stored["spec"]["size"] == 1
    status, doc = await kit.send(
        "PATCH",
        url,
        params={"fieldManager": "opt-b", "force": "true"},
        body=config(2),
        content_type=APPLY,
    )
    assert status == 200, doc
    stored = await kit.stored(name)
    assert stored is not None and stored["spec"]["size"] == 2
    assert "opt-b" in _managers(stored)


# --- gracePeriodSeconds, preconditions ---------------------------------------------------------


@pytest.mark.parametrize("form", ["query", "body"])
async def test_grace_period_reaches_kcp(kit: Kit, form: str) -> None:
    """Custom resources have no graceful deletion: kcp accepts gracePeriodSeconds and sets a
    finalizer-held object's deletionGracePeriodSeconds to 0 whatever was asked (the option's
    arrival in the body is checked against the fake, tests/security/test_write_options.py)."""
    obj = await kit.create(unique("grace"), finalizers=["example.io/opt-hold"])
    name = obj["metadata"]["name"]
    try:
        params = {"gracePeriodSeconds": "30"} if form == "query" else None
        body = {"gracePeriodSeconds": 30} if form == "body" else None
        status, doc = await kit.send("DELETE", f"{kit.through()}/{name}", params=params, body=body)
        assert status in (200, 202), doc
        stored = await kit.stored(name)
        assert stored is not None and stored["metadata"].get("deletionTimestamp")
        assert stored["metadata"].get("deletionGracePeriodSeconds") == 0
    finally:
        await kit.forget(name)


async def test_body_preconditions_combine_with_the_proxys(kit: Kit) -> None:
    obj = await kit.create(unique("pre"))
    name = obj["metadata"]["name"]
    url = f"{kit.through()}/{name}"
    status, doc = await kit.send("DELETE", url, body={"preconditions": {"uid": "not-it"}})
    assert status == 409, doc
    status, doc = await kit.send(
        "DELETE", url, body={"preconditions": {"resourceVersion": "1"}, "dryRun": ["All"]}
    )
    assert status == 409, doc
    assert rv(await kit.stored(name)) == rv(obj)
    status, doc = await kit.send(
        "DELETE",
        url,
        body={"preconditions": {"uid": obj["metadata"]["uid"], "resourceVersion": rv(obj)}},
    )
    assert status == 200, doc
    assert await kit.stored(name) is None


# --- finding 8: JSON-patch pointer aliases ------------------------------------------------------


async def test_kcp_aliases_pointers_and_the_proxy_refuses_them(kit: Kit) -> None:
    obj = await kit.create(unique("alias"))
    name = obj["metadata"]["name"]
    # kcp itself: "x/metadata/labels/alias" addresses /metadata/labels/alias.
    async with kit.admin.patch(
        f"{kit.direct}/{name}",
        data=json.dumps([{"op": "add", "path": "x/metadata/labels/alias", "value": "1"}]),
        headers={"Content-Type": JSON_PATCH},
    ) as r:
        doc = await r.json()
        assert r.status == 200, doc
        assert doc["metadata"]["labels"]["alias"] == "1"
    before = await kit.stored(name)
    for ops in (
        [{"op": "replace", "path": "x/metadata/resourceVersion", "value": "1"}],
        [{"op": "remove", "path": "x/metadata"}],
        [{"op": "add", "path": "x/metadata/labels/env", "value": "dev"}],
        [{"op": "move", "from": "x/metadata/labels/env", "path": "/metadata/labels/gone"}],
        [{"op": "test", "path": "x/metadata/resourceVersion", "value": rv(before)}],
        [{"op": "add", "path": "/metadata/labels/a~2b", "value": "1"}],
    ):
        status, doc = await kit.send(
            "PATCH", f"{kit.through()}/{name}", body=ops, content_type=JSON_PATCH
        )
        assert status == 422, (ops, doc)
    assert rv(await kit.stored(name)) == rv(before)
    # escapes are decoded: "/metadata/labels/a~1b" is the label "a/b"
    status, doc = await kit.send(
        "PATCH",
        f"{kit.through()}/{name}",
        body=[{"op": "add", "path": "/metadata/labels/example.io~1x", "value": "y"}],
        content_type=JSON_PATCH,
    )
    assert status == 200, doc
    stored = await kit.stored(name)
    assert stored is not None and stored["metadata"]["labels"]["example.io/x"] == "y"


# --- finding 10: apply carrying the stored resourceVersion -----------------------------------------


async def test_apply_with_the_stored_resource_version(kit: Kit) -> None:
    obj = await kit.create(unique("applyrv"))
    name = obj["metadata"]["name"]
    url = f"{kit.through()}/{name}"

    def config(version: str, size: int) -> str:
        meta = {"name": name, "labels": {"env": "prod"}, "resourceVersion": version}
        return yaml.safe_dump(
            {"apiVersion": API, "kind": "Widget", "metadata": meta, "spec": {"size": size}}
        )

    # force: spec.size is the creator's; only the resourceVersion may decide here
    params = {"fieldManager": "opt-apply-rv", "force": "true"}
    status, doc = await kit.send(
        "PATCH", url, params=params, body=config(rv(obj), 5), content_type=APPLY
    )
    assert status == 200, doc
    stored = await kit.stored(name)
    assert stored is not None and stored["spec"]["size"] == 5
    status, doc = await kit.send(
        "PATCH", url, params=params, body=config(rv(obj), 6), content_type=APPLY
    )
    assert status == 409, doc  # stale now
    assert rv(await kit.stored(name)) == rv(stored)
    missing = f"{url}-missing"
    status, doc = await kit.send(
        "PATCH", missing, params=params, body=config("5", 1), content_type=APPLY
    )
    assert status == 404, doc
    # outside the slice: the same NotFound
    dev = await kit.create(unique("applyrv-dev"), env="dev")
    status, doc = await kit.send(
        "PATCH",
        f"{kit.through()}/{dev['metadata']['name']}",
        params=params,
        body=config(rv(dev), 1).replace(name, dev["metadata"]["name"]),
        content_type=APPLY,
    )
    assert status == 404, doc
    assert rv(await kit.stored(dev["metadata"]["name"])) == rv(dev)


# --- finding 12: dependents outside the slice -------------------------------------------------------


async def test_owner_with_dependents_outside_the_slice(kit: Kit) -> None:
    owner = await kit.create(unique("gcowner"))
    hidden = await kit.create(unique("gchidden"), env="dev", owner=owner)
    mine = await kit.create(unique("gcmine"), owner=owner)
    name = owner["metadata"]["name"]
    url = f"{kit.through()}/{name}"

    async def refused() -> bool:
        # a dry run until the cache has seen the dependent (it was created a moment ago)
        status, _ = await kit.send("DELETE", url, params={"dryRun": "All"})
        return status == 409

    await until("the proxy to see the hidden dependent", refused, within=10)
    for params, body in (
        (None, None),
        ({"propagationPolicy": "Background"}, None),
        (None, {"propagationPolicy": "Foreground"}),
        ({"orphanDependents": "false"}, None),
    ):
        status, doc = await kit.send("DELETE", url, params=params, body=body)
        assert status == 409, doc
        assert "dependents outside the slice" in doc["message"]
        assert "Orphan" in doc["message"]
        assert hidden["metadata"]["name"] not in doc["message"]
    status, doc = await kit.send(
        "DELETE", kit.through(), params={"fieldSelector": f"metadata.name={name}"}
    )
    assert status == 409, doc
    assert rv(await kit.stored(name)) == rv(owner)
    # Orphan: the owner goes, both dependents stay (their ownerReferences removed)
    status, doc = await kit.send("DELETE", url, params={"propagationPolicy": "Orphan"})
    assert status == 200, doc
    for dep in (hidden, mine):
        dep_name = dep["metadata"]["name"]

        async def orphaned(dep_name: str = dep_name) -> bool:
            now = await kit.stored(dep_name)
            return now is not None and not now["metadata"].get("ownerReferences")

        await until(f"{dep_name} orphaned", orphaned, within=GC_WAIT)


async def test_owner_with_dependents_in_the_slice_only(kit: Kit) -> None:
    owner = await kit.create(unique("gcown2"))
    mine = await kit.create(unique("gcmine2"), owner=owner)
    status, doc = await kit.send("DELETE", f"{kit.through()}/{owner['metadata']['name']}")
    assert status == 200, doc
    await until(
        "the slice's own dependent collected",
        lambda: _gone(kit, mine["metadata"]["name"]),
        within=GC_WAIT,
    )


# --- finding 12, its residual: kcp's garbage-collector finalizers ---------------------------------

GC_PIN = "vwserver-test-gc-pin"


@contextlib.asynccontextmanager
async def gc_pinned(kit: Kit, prefix: str) -> AsyncIterator[None]:
    """While inside, kcp refuses (a ValidatingAdmissionPolicy; kcp reads those of a bound
    resource from the APIExport's workspace, the provider's) every update that leaves a widget of the kit's namespace named ``prefix…`` without
    ownerReferences — kcp's garbage collector too, whose orphaning of such a dependent then
    fails and is retried: an owner deleted with propagationPolicy=Orphan stays Terminating with
    the ``orphan`` finalizer, deterministically, instead of for the collector's few ms."""
    name = f"{GC_PIN}-{kit.namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["example.io"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["widgets"],
                    }
                ],
                "objectSelector": {"matchLabels": {"t": kit.namespace}},
            },
            "matchConditions": [
                {"name": "pinned", "expression": f"object.metadata.name.startsWith('{prefix}')"}
            ],
            "validations": [
                {
                    "expression": "has(object.metadata.ownerReferences)",
                    "message": "pinned by the test: the ownerReferences stay",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    manifest = yaml.safe_dump_all([policy, binding])
    server = kit.world.provider.url
    await kit.kcp.kubectl("apply", "-f", "-", input=manifest, server=server)
    try:
        yield
    finally:
        await kit.kcp.kubectl(
            "delete", "-f", "-", "--ignore-not-found", input=manifest, server=server
        )


async def _pin_holds(kit: Kit, name: str) -> bool:
    """Whether kcp refuses to take ``name``'s ownerReferences away (a dry run)."""
    async with kit.admin.patch(
        f"{kit.direct}/{name}",
        params={"dryRun": "All"},
        data=json.dumps({"metadata": {"ownerReferences": None}}),
        headers={"Content-Type": MERGE},
    ) as r:
        return r.status in (400, 403, 422)


def _gc_refused(status: int, doc: Any, finalizer: str) -> bool:
    return (
        status == 422
        and "garbage collector" in doc["message"]
        and finalizer in doc["message"]
        and doc["details"]["causes"][0]["field"] == "metadata.finalizers"
    )


async def test_orphan_finalizer_stays_until_kcps_gc_removes_it(kit: Kit) -> None:
    """The residual gap: owner deleted with Orphan through the slice; before kcp's collector
    has orphaned the dependents, the slice removes ``orphan`` — kcp then let the owner go and
    its collector deleted the dependent outside the slice. Every write path is refused now, and
    the dependent outside the slice survives (orphaned, once the collector can do its work)."""
    prefix = unique("gcpin")
    async with gc_pinned(kit, prefix):
        owner = await kit.create(unique("gcowner"))  # not pinned: kcp may update it
        hidden = await kit.create(f"{prefix}-hidden", env="dev", owner=owner)
        name, hidden_name = owner["metadata"]["name"], hidden["metadata"]["name"]
        await until("the pin in force", lambda: _pin_holds(kit, hidden_name), within=GC_WAIT)
        url = f"{kit.through()}/{name}"
        status, doc = await kit.send("DELETE", url, params={"propagationPolicy": "Orphan"})
        assert status == 200, doc
        terminating = await kit.stored(name)
        assert terminating is not None
        assert terminating["metadata"]["deletionTimestamp"]
        assert terminating["metadata"]["finalizers"] == ["orphan"]
        put = {**terminating, "metadata": {**terminating["metadata"], "finalizers": []}}
        refused = []
        for how, method, target, body, content_type in (
            (
                "json patch",
                "PATCH",
                url,
                [{"op": "remove", "path": "/metadata/finalizers/0"}],
                JSON_PATCH,
            ),
            (
                "json patch, whole list",
                "PATCH",
                url,
                [{"op": "replace", "path": "/metadata/finalizers", "value": []}],
                JSON_PATCH,
            ),
            ("merge patch", "PATCH", url, {"metadata": {"finalizers": None}}, MERGE),
            ("update", "PUT", url, put, "application/json"),
        ):
            status, doc = await kit.send(method, target, body=body, content_type=content_type)
            refused.append((how, _gc_refused(status, doc, "orphan"), status, doc))
            if await kit.stored(name) is None:
                # The gap: the owner went before its dependents were orphaned; kcp's collector
                # (not pinned for deletes) now deletes the dependent outside the slice.
                await until(
                    "the dependent collected", lambda: _gone(kit, hidden_name), within=GC_WAIT
                )
                pytest.fail(
                    f"{how} ({status}) removed 'orphan' through the slice: the owner went and "
                    f"kcp's garbage collector deleted {hidden_name}, outside the slice"
                )
        # A status write ignores metadata (CRD status subresource): the finalizer stays.
        status, doc = await kit.send("PUT", f"{url}/status", body=put)
        assert status == 200, doc
        after = await kit.stored(name)
        assert after is not None and after["metadata"]["finalizers"] == ["orphan"], after

    # The pin is off: kcp's collector orphans the dependent, then lets the owner go.
    async def orphaned() -> bool:
        now = await kit.stored(hidden_name)
        assert now is not None, "kcp's garbage collector deleted the dependent outside the slice"
        return not now["metadata"].get("ownerReferences")

    await until("the dependent outside the slice orphaned", orphaned, within=4 * GC_WAIT)
    await until("the owner gone", lambda: _gone(kit, name), within=4 * GC_WAIT)
    assert all(ok for _, ok, _, _ in refused), refused


async def test_foreground_deletion_finalizer_stays_until_kcps_gc_removes_it(kit: Kit) -> None:
    """A foreground deletion through the slice (its dependent in the slice) waits for a
    dependent that blocks it, here kept by its own finalizer: the owner stays Terminating with
    ``foregroundDeletion``. Removing that through the slice would let the owner go first (a
    foreground deletion made a background one): refused; once the dependent is gone, kcp's
    collector removes it and the owner goes."""
    owner = await kit.create(unique("fgowner"))
    dependent = await kit.create(
        unique("fgdep"), owner=owner, finalizers=["x.example/hold"], blocks_owner=True
    )
    name, dep = owner["metadata"]["name"], dependent["metadata"]["name"]
    url = f"{kit.through()}/{name}"
    status, doc = await kit.send("DELETE", url, params={"propagationPolicy": "Foreground"})
    assert status == 200, doc

    async def dependent_deleting() -> bool:
        now = await kit.stored(dep)
        return now is not None and bool(now["metadata"].get("deletionTimestamp"))

    await until("kcp's collector deleting the dependent", dependent_deleting, within=GC_WAIT)
    terminating = await kit.stored(name)
    assert terminating is not None
    assert terminating["metadata"]["finalizers"] == ["foregroundDeletion"]
    put = {**terminating, "metadata": {**terminating["metadata"], "finalizers": []}}
    for body, content_type in (
        ([{"op": "remove", "path": "/metadata/finalizers/0"}], JSON_PATCH),
        ({"metadata": {"finalizers": None}}, MERGE),
        (put, "application/json"),
    ):
        method = "PUT" if body is put else "PATCH"
        status, doc = await kit.send(method, url, body=body, content_type=content_type)
        assert _gc_refused(status, doc, "foregroundDeletion"), (content_type, status, doc)
        assert await kit.stored(name) is not None, "the owner went before its dependent"
    # The slice finishes the dependent's own finalizer; kcp's collector then lets the owner go.
    status, doc = await kit.send(
        "PATCH",
        f"{kit.through()}/{dep}",
        body=[{"op": "remove", "path": "/metadata/finalizers/0"}],
        content_type=JSON_PATCH,
    )
    assert status == 200, doc
    await until("the dependent gone", lambda: _gone(kit, dep), within=GC_WAIT)
    await until("the owner gone", lambda: _gone(kit, name), within=GC_WAIT)


async def test_gc_finalizers_are_not_added_through_a_slice(kit: Kit) -> None:
    """Adding ``orphan`` / ``foregroundDeletion`` to a live object decides what a later DELETE
    naming no propagation does (kcp reads the finalizers): refused on every write path."""
    live = await kit.create(unique("gcadd"))
    name = live["metadata"]["name"]
    url = f"{kit.through()}/{name}"
    for finalizer in ("orphan", "foregroundDeletion"):
        for body, content_type in (
            ({"metadata": {"finalizers": [finalizer]}}, MERGE),
            ([{"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}], JSON_PATCH),
            (
                f"apiVersion: {API}\nkind: Widget\nmetadata:\n  name: {name}\n"
                f"  labels: {{env: prod}}\n  finalizers: [{finalizer}]\n",
                APPLY,
            ),
        ):
            params = {"fieldManager": "gc-test"} if content_type == APPLY else None
            status, doc = await kit.send(
                "PATCH", url, params=params, body=body, content_type=content_type
            )
            assert _gc_refused(status, doc, finalizer), (content_type, status, doc)
        now = await kit.stored(name)
        put = {**now, "metadata": {**now["metadata"], "finalizers": [finalizer]}}
        status, doc = await kit.send("PUT", url, body=put)
        assert _gc_refused(status, doc, finalizer), (status, doc)
        created = {
            "apiVersion": API,
            "kind": "Widget",
            "metadata": {"name": unique("gcnew"), "finalizers": [finalizer]},
            "spec": {"size": 1},
        }
        status, doc = await kit.send("POST", kit.through(), body=created)
        assert _gc_refused(status, doc, finalizer), (status, doc)
    assert (await kit.stored(name) or {})["metadata"].get("finalizers") is None


# --- booleans: the spellings kcp and strconv.ParseBool read differently --------------------------


async def test_kcp_reads_f_as_true_and_the_proxy_refuses_it(kit: Kit) -> None:
    """kcp decodes ``watch=F`` (and every option boolean) with apimachinery's converter, for which
    only "0" and "false" are false: a LIST with ``watch=F`` is a watch to kcp. The proxy, which
    would have read it with strconv.ParseBool as false, refuses such spellings."""
    async with kit.admin.get(kit.direct, params={"watch": "F", "timeoutSeconds": "1"}) as r:
        raw = await r.read()
        assert r.status == 200, raw
    first = json.loads(raw.splitlines()[0]) if raw.strip() else {}
    assert first.get("type") in ("ADDED", "BOOKMARK") or raw.strip() == b"", raw[:200]
    assert first.get("kind") != "WidgetList"
    status, doc = await kit.send("GET", kit.through(), params={"watch": "F"})
    assert status == 400, doc
