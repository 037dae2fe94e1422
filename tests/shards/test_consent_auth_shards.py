"""Consent and caller authentication across the shards of a sharded kcp (issue #24 point 4).

Setup (once per module): the shard suites' vwserver (:func:`tests.shards.test_slices_shards.
serving_slices`) with the Guard — every caller's token is reviewed (TokenReview) and its use
of the slice authorized (SubjectAccessReview) by kcp. vwserver's kcp client is the
front-proxy, so both reviews are POSTed to ``/clusters/<slice workspace>`` there and the
front-proxy sends them to the shard that holds the slice's workspace (the consent check, a
SubjectAccessReview in the export's workspace, goes to the root shard the same way): no
shard URL is configured anywhere.

kcp v0.32.3 facts these tests rely on and check (kcp's workspace content authorizer): a
ServiceAccount token is authenticated in every workspace of every shard (the shards share the
signing key; tests/shards/test_testbed_shards.py), with its home cluster as a scope
(``authentication.kcp.io/scopes: cluster:<home>``); in any other workspace a scoped user is
denied as a "foreign service account" — even when a RoleBinding there names its user name
(kcp: otherwise names could collide across workspaces). So a ServiceAccount can use a slice of
its own workspace only, on whichever shard the data lives.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.bootstrap import Workspace, apply_retrying
from devenv.shards import SECOND_SHARD, SHARD_NAMES
from devenv.slices import export_grant, export_grant_binding, slice_grant, wait_slice_ready
from tests.e2e.controller_env import Served, condition, eventually, unique
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import (
    PROD,
    another_export,
    endpoints_by_shard,
    export_binding,
    keys,
    serving_slices,
    widgets,
)
from tests.shards.test_testbed_shards import _service_account, _token_review
from vwserver.auth.access import (
    CONTENT_GROUP,
    CONTENT_RESOURCE,
    CONTENT_SUBRESOURCE,
    AccessReviewer,
)
from vwserver.auth.guard import Guard
from vwserver.auth.tokens import TokenReviewer
from vwserver.controller import consent
from vwserver.k8s.client import KubeClient

Observe = Callable[[str], None]
TIMEOUT = 60.0


def _guard(client: KubeClient) -> Guard:
    return Guard(tokens=TokenReviewer(client=client), access=AccessReviewer(client=client))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(sharded_world: ShardedWorld) -> AsyncIterator[Served]:
    async with serving_slices(sharded_world, guard=_guard) as served:
        yield served


async def status_of(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        text = await resp.text()
        return resp.status, (json.loads(text) if text.startswith("{") else text)


async def answered(session: aiohttp.ClientSession, url: str, code: int) -> Any:
    """The body of a GET once vwserver answers ``code`` (fresh RBAC reaches kcp's authorizer
    after a moment; the Guard caches a denial for seconds)."""

    async def probe() -> list[Any] | None:
        got, body = await status_of(session, url)
        return [body] if got == code else None

    return (await eventually(probe, within=TIMEOUT, what=f"{code} from {url}"))[0]


async def test_a_second_shard_slice_serves_a_root_shard_export_only_while_granted(
    sharded_world: ShardedWorld, served: Served, observe: Observe
) -> None:
    """Issue #24 point 4, consent: a slice in ``root:slices`` (second shard) naming a new
    export of ``root:provider`` (root shard) that does not grant the slice's workspace is
    NotPermitted, lists no endpoint and answers 503; granted, it serves the objects of a
    consumer on the second shard; revoked, an open watch ends and it is refused again."""
    w = sharded_world
    front = w.bed.front
    export = await another_export(w, "consent", granted=False)
    consumer = await w.bed.create_workspace(unique("consent"), shard=SECOND_SHARD)
    await apply_retrying(front, consumer.url, json.dumps(export_binding(w, export)), within=60)
    obj = {
        "apiVersion": f"{w.world.group}/{w.world.version}",
        "kind": "Widget",
        "metadata": {"name": "granted-only", "namespace": "default", "labels": {"env": "prod"}},
        "spec": {"size": 1, "color": "red"},
    }
    await apply_retrying(front, consumer.url, json.dumps(obj), within=60)
    name = unique("consent")
    await served.create_slice(w.slices, name, selector=PROD, export_name=export)
    subject = consent.subject(w.slices.cluster)

    async def refused() -> dict[str, Any] | None:
        status = await served.slice_status(w.slices, name)
        valid = condition(status, "APIExportValid")
        return status if valid.get("reason") == "NotPermitted" else None

    status = await eventually(refused, within=TIMEOUT, what="APIExportValid NotPermitted")
    valid = condition(status, "APIExportValid")
    for part in (w.world.provider.path, w.slices.cluster, export, subject):
        assert part in valid["message"], part
    assert status.get("endpoints") == []
    plain = (
        f"{served.base}/services/filtered-apiexport/{w.slices.cluster}/{name}"
        f"/clusters/{consumer.cluster}/{w.world.api_path}/{w.world.resource}"
    )
    async with front.http_session(timeout=30) as session:
        body = await answered(session, plain, 503)
        assert "items" not in body and subject in body["message"]

        grant = export_grant(slice_cluster=w.slices.cluster, export_name=export)
        await apply_retrying(front, w.world.provider.url, grant, within=TIMEOUT)
        binding = export_grant_binding(slice_cluster=w.slices.cluster, export_name=export)
        try:
            await wait_slice_ready(front, w.slices, name, within=TIMEOUT)
            (url,) = (await endpoints_by_shard(w, served, name, count=1, export=export)).values()
            listing = widgets(w, url, consumer.cluster)
            listed = await answered(session, listing, 200)
            assert [i["metadata"]["name"] for i in listed["items"]] == ["granted-only"]
            params = {"watch": "true", "resourceVersion": listed["metadata"]["resourceVersion"]}
            async with session.get(listing, params=params) as watch:
                assert watch.status == 200
                loop = asyncio.get_running_loop()
                revoked = loop.time()
                await front.kubectl(
                    "delete", "clusterrolebinding", binding, server=w.world.provider.url
                )
                async with asyncio.timeout(TIMEOUT):
                    while await watch.content.readline():
                        pass
                observe(f"watch ended {loop.time() - revoked:.1f}s after the grant was revoked")
        finally:
            await front.kubectl(
                "delete",
                "clusterrolebinding",
                binding,
                "--ignore-not-found",
                server=w.world.provider.url,
            )
        await eventually(refused, within=TIMEOUT, what="NotPermitted again")
        await answered(session, plain, 503)


async def _access_review(
    w: ShardedWorld, ws: Workspace, user: dict[str, Any], slice_name: str
) -> bool:
    """kcp's own SubjectAccessReview in ``ws`` (through the front-proxy) for ``user`` (a
    TokenReview's) listing slice ``slice_name``'s content: the question vwserver's Guard asks."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user["username"],
            "groups": user.get("groups") or [],
            "extra": user.get("extra") or {},
            "resourceAttributes": {
                "group": CONTENT_GROUP,
                "resource": CONTENT_RESOURCE,
                "subresource": CONTENT_SUBRESOURCE,
                "name": slice_name,
                "verb": "list",
            },
        },
    }
    url = f"{w.bed.front.cluster_url(ws.cluster)}/apis/authorization.k8s.io/v1/subjectaccessreviews"
    async with w.bed.front.http_session(timeout=20) as session, session.post(url, json=review) as r:
        assert r.status == 201, await r.text()
        return bool((await r.json())["status"].get("allowed"))


async def test_a_service_account_token_works_on_its_own_workspaces_slice_from_either_shard(
    sharded_world: ShardedWorld, served: Served, observe: Observe
) -> None:
    """Issue #24 point 4, tokens across shards: a ServiceAccount of ``root:slices`` (second
    shard) and one of ``root:provider`` (root shard), each granted the content of a slice in
    *both* workspaces. Each reads its own workspace's slice through both shards' endpoints
    (200, that shard's objects only); the slice in the other workspace — whose reviews go to
    the other shard — is 403, as kcp's own SubjectAccessReview there says (foreign service
    account), while the same grant lets a plain user of that name in. Through its own slice
    it sees what kcp's VW of each shard shows with the selector."""
    w = sharded_world
    front = w.bed.front
    spaces = (w.slices, w.world.provider)  # second shard, root shard
    slices = {ws.cluster: unique("sa") for ws in spaces}
    for ws in spaces:
        await served.create_slice(ws, slices[ws.cluster], selector=PROD)
        await wait_slice_ready(front, ws, slices[ws.cluster], within=TIMEOUT)
    sa = unique("reader")
    user = f"system:serviceaccount:default:{sa}"
    tokens: dict[str, str] = {}
    for ws in spaces:
        await apply_retrying(front, ws.url, json.dumps(_service_account(sa)), within=TIMEOUT)
        tokens[ws.cluster] = (
            await front.kubectl("create", "token", sa, server=ws.url)
        ).stdout.strip()
        for slice_name in slices.values():
            await apply_retrying(front, ws.url, slice_grant(slice_name, user), within=TIMEOUT)

    for home, other in (spaces, spaces[::-1]):
        token = tokens[home.cluster]
        reviewed = await _token_review(w, front.cluster_url(other.cluster), token)
        assert reviewed["authenticated"] is True, reviewed
        assert reviewed["user"]["extra"]["authentication.kcp.io/scopes"] == [
            f"cluster:{home.cluster}"
        ]
        # kcp's answers in the other workspace: the grant is there (a plain user of the same
        # name passes), the scoped ServiceAccount does not.
        plain = {"username": user, "groups": ["system:authenticated"]}
        await eventually(
            functools.partial(_access_review, w, other, plain, slices[other.cluster]),
            within=TIMEOUT,
            what="the grant in the other workspace",
        )
        assert not await _access_review(w, other, reviewed["user"], slices[other.cluster])

        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=front.ssl_context()),
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as session:
            own = await endpoints_by_shard(w, served, slices[home.cluster], count=2, ws=home)
            for shard in SHARD_NAMES:
                body = await answered(session, widgets(w, own[shard], "*"), 200)
                # The same objects as kcp's VW of that shard with the selector. (kcp v0.32.3
                # fact seen here: that VW's clusters/* also shows a workspace that binds
                # another export of the same schema, test_a_second_shard_slice_...'s.)
                async with front.http_session(timeout=30) as admin:
                    _, direct = await status_of(
                        admin, widgets(w, w.vw_url(shard), "*") + "?labelSelector=env%3Dprod"
                    )
                assert keys(body) == keys(direct)
                (elsewhere,) = (c for c in w.world.consumers if c is not w.consumer_on(shard))
                clusters = {k[0] for k in keys(body)}
                assert w.consumer_on(shard).cluster in clusters
                assert elsewhere.cluster not in clusters
            foreign = await endpoints_by_shard(w, served, slices[other.cluster], count=2, ws=other)
            for shard in SHARD_NAMES:
                code, body = await status_of(session, widgets(w, foreign[shard], "*"))
                observe(f"SA of {home.name} on {other.name}'s slice via {shard}: {code}")
                assert (code, body["kind"], body["reason"]) == (403, "Status", "Forbidden")
                assert "items" not in body
