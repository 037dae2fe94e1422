"""What kcp's ``status`` subresource of a custom resource ignores, shown directly in kcp (no
vwserver): the fact :func:`vwserver.proxy.write_plan.plan_status_patch` rests on to write status
without a dry run.

kcp v0.32.3: a write to ``<widget>/status`` — PUT, merge patch, JSON patch and server-side apply
alike — changes ``status`` only (and ``managedFields``); the labels, annotations, finalizers,
``deletionTimestamp`` and ``spec`` it carries are dropped (apiextensions'
``statusStrategy.PrepareForUpdate`` starts from the stored object). Its resourceVersion
preconditions hold as for the main resource: a stale ``metadata.resourceVersion`` is 409, a
failed JSON-patch ``test`` is 422.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.widgets import API

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
FINALIZER = "example.io/kept"
# What a status write tries to change besides status (each is ignored).
LABELS = {"env": "dev", "added": "x"}
ANNOTATIONS = {"added": "x"}
FINALIZERS = [FINALIZER, "example.io/added"]
SPEC = {"size": 99, "color": "green"}
DELETION = "2026-01-01T00:00:00Z"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def widgets(
    kcp: KcpInstance, world: Bootstrap
) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """An admin session to kcp and a fresh namespace's widgets URL in consumer-a."""
    ws = world.consumer("consumer-a")
    namespace = f"status-{uuid.uuid4().hex[:6]}"
    await kcp.kubectl("create", "namespace", namespace, server=ws.url)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=kcp.ssl_context()),
        headers={"Authorization": f"Bearer {kcp.admin_token}"},
        timeout=aiohttp.ClientTimeout(total=30),
    ) as admin:
        url = f"{ws.url}/{API}/namespaces/{namespace}/widgets"
        try:
            yield admin, url
        finally:
            async with admin.get(url) as resp:
                items = (await resp.json()).get("items", [])
            for item in items:
                item_url = f"{url}/{item['metadata']['name']}"
                patch = json.dumps({"metadata": {"finalizers": None}})
                async with admin.patch(item_url, data=patch, headers={"Content-Type": MERGE}):
                    pass
                async with admin.delete(item_url):
                    pass
            await kcp.kubectl("delete", "namespace", namespace, "--wait=false", server=ws.url)


async def _create(admin: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    name = f"s-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {
            "name": name,
            "labels": {"env": "prod"},
            "annotations": {"kept": "y"},
            "finalizers": [FINALIZER],
        },
        "spec": {"size": 1, "color": "red"},
    }
    async with admin.post(url, json=body) as resp:
        doc = await resp.json()
        assert resp.status == 201, doc
        return dict(doc)


def _bodies(stored: dict[str, Any], phase: str) -> dict[str, tuple[str, Any]]:
    """Per write type: the content type and the body that sets ``status.phase`` and tries to
    change every membership field and the spec."""
    meta = stored["metadata"]
    changed_meta = {
        **meta,
        "labels": LABELS,
        "annotations": {**meta["annotations"], **ANNOTATIONS},
        "finalizers": FINALIZERS,
        "deletionTimestamp": DELETION,
    }
    return {
        "put": (
            "application/json",
            {**stored, "metadata": changed_meta, "spec": SPEC, "status": {"phase": phase}},
        ),
        "merge": (
            MERGE,
            {
                "metadata": {
                    "labels": LABELS,
                    "annotations": ANNOTATIONS,
                    "finalizers": FINALIZERS,
                    "deletionTimestamp": DELETION,
                },
                "spec": SPEC,
                "status": {"phase": phase},
            },
        ),
        "json": (
            JSON_PATCH,
            [
                {"op": "replace", "path": "/metadata/labels", "value": LABELS},
                {"op": "add", "path": "/metadata/annotations/added", "value": "x"},
                {"op": "replace", "path": "/metadata/finalizers", "value": FINALIZERS},
                {"op": "add", "path": "/metadata/deletionTimestamp", "value": DELETION},
                {"op": "replace", "path": "/spec", "value": SPEC},
                {"op": "add", "path": "/status", "value": {"phase": phase}},
            ],
        ),
        "apply": (
            APPLY,
            {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "labels": LABELS,
                    "annotations": ANNOTATIONS,
                    "finalizers": FINALIZERS,
                },
                "spec": SPEC,
                "status": {"phase": phase},
            },
        ),
    }


KINDS = ("put", "merge", "json", "apply")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_status_write_changes_status_only(
    widgets: tuple[aiohttp.ClientSession, str], kind: str
) -> None:
    admin, url = widgets
    stored = await _create(admin, url)
    content_type, body = _bodies(stored, "Ready")[kind]
    item = f"{url}/{stored['metadata']['name']}"
    async with admin.request(
        "PUT" if kind == "put" else "PATCH",
        f"{item}/status",
        data=json.dumps(body),
        params={"fieldManager": "status-probe"} if kind == "apply" else None,
        headers={"Content-Type": content_type},
    ) as resp:
        answer = await resp.json()
        assert resp.status == 200, answer
    async with admin.get(item) as resp:
        after = await resp.json()
    for doc in (answer, after):
        assert doc["status"] == {"phase": "Ready"}
        assert doc["spec"] == stored["spec"]
        for field in ("labels", "annotations", "finalizers"):
            assert doc["metadata"][field] == stored["metadata"][field], field
        assert "deletionTimestamp" not in doc["metadata"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_status_write_keeps_its_resource_version_precondition(
    widgets: tuple[aiohttp.ClientSession, str], kind: str
) -> None:
    admin, url = widgets
    stored = await _create(admin, url)
    stale = "1"
    content_type, body = _bodies(stored, "Stale")[kind]
    if kind == "json":
        body = [{"op": "test", "path": "/metadata/resourceVersion", "value": stale}, *body]
    elif kind == "put":
        body["metadata"]["resourceVersion"] = stale
    else:
        body["metadata"] = {**body.get("metadata", {}), "resourceVersion": stale}
    item = f"{url}/{stored['metadata']['name']}"
    async with admin.request(
        "PUT" if kind == "put" else "PATCH",
        f"{item}/status",
        data=json.dumps(body),
        params={"fieldManager": "status-probe"} if kind == "apply" else None,
        headers={"Content-Type": content_type},
    ) as resp:
        answer = await resp.json()
        # A failed JSON-patch test is the patch handler's 422; a stale resourceVersion 409.
        assert resp.status == (422 if kind == "json" else 409), answer
    async with admin.get(item) as resp:
        after = await resp.json()
    assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
