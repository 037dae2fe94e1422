"""What the sharded kcp of the test bed does, recorded as tests (vwserver not involved): the
placement of workspaces, the per-shard endpoint URLs kcp publishes, and what each shard's
APIExport virtual workspace answers for a consumer cluster that lives on the other shard."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from devenv.bootstrap import SAMPLE_NAMESPACES
from devenv.shards import ROOT_SHARD, SECOND_SHARD, SHARD_NAMES
from tests.shards.conftest import PLACEMENT, ShardedWorld

Observe = Callable[[str], None]


async def _get(w: ShardedWorld, url: str) -> tuple[int, Any]:
    async with w.bed.front.http_session(timeout=20) as session, session.get(url) as resp:
        body = await resp.json(content_type=None)
        return resp.status, body


def _widgets(w: ShardedWorld, vw: str, cluster: str) -> str:
    return f"{vw}/clusters/{cluster}/{w.world.api_path}/{w.world.resource}"


async def test_workspaces_are_scheduled_onto_the_shards_their_selector_names(
    sharded_world: ShardedWorld,
) -> None:
    """``spec.location.selector`` over the Shard labels places each workspace; kcp records the
    shard in the Workspace's ``core.kcp.io/shard`` annotation."""
    w = sharded_world
    for name, shard in {**PLACEMENT, w.slices.name: SECOND_SHARD}.items():
        assert await w.bed.workspace_shard(name) == shard, name


async def test_each_shard_holds_only_its_own_workspaces(
    sharded_world: ShardedWorld, observe: Observe
) -> None:
    """A shard's own URL serves the logical clusters it holds; the front-proxy serves all."""
    w = sharded_world
    for ws in w.world.consumers:
        home = PLACEMENT[ws.name]
        other = SECOND_SHARD if home == ROOT_SHARD else ROOT_SHARD
        url = f"/clusters/{ws.cluster}/api/v1/namespaces/{SAMPLE_NAMESPACES[0]}"
        code_front, _ = await _get(w, w.bed.front.url + url)
        code_home, _ = await _get(w, w.bed.shard(home).url + url)
        code_other, body = await _get(w, w.bed.shard(other).url + url)
        observe(f"{ws.name}: front {code_front}, home {code_home}, other shard {code_other} {body}")
        assert (code_front, code_home) == (200, 200)
        # kcp v0.32.3: 403 Forbidden ("access denied") — the shard has no such logical cluster.
        assert (code_other, body["reason"]) == (403, "Forbidden")


async def test_endpoint_slice_lists_one_vw_url_per_shard_with_a_binding(
    sharded_world: ShardedWorld,
) -> None:
    """Consumers on both shards: kcp's APIExportEndpointSlice lists each shard's VW URL, which
    is at the shard's own base URL (``--shard-virtual-workspace-url`` defaults to it)."""
    w = sharded_world
    assert len(w.world.vw_urls) == 2
    assert sorted(w.bed.shard_of_url(u) for u in w.world.vw_urls) == sorted(SHARD_NAMES)


async def test_a_shards_vw_serves_only_the_consumers_on_that_shard(
    sharded_world: ShardedWorld, observe: Observe
) -> None:
    """The wildcard list of a shard's VW shows exactly the widgets of the consumers on that
    shard. kcp v0.32.3 fact: a request for a consumer cluster that lives on the other shard is
    403 Forbidden ("cannot list resource ... access denied") — the shard holds no APIBinding
    for that cluster, so its VW authorizer refuses (the same answer as for a cluster that does
    not bind the export), never another shard's objects."""
    w = sharded_world
    for shard in SHARD_NAMES:
        vw = w.vw_url(shard)
        mine = w.consumer_on(shard)
        code, body = await _get(w, _widgets(w, vw, "*"))
        assert code == 200
        clusters = {i["metadata"]["annotations"]["kcp.io/cluster"] for i in body["items"]}
        # Other modules of the session add workspaces on each shard (bound to this export, or
        # to another export of the same schema, which kcp v0.32.3's VW on clusters/* shows too):
        # the shard's own consumer is there, the other shard's never.
        assert mine.cluster in clusters and not clusters & w.clusters_not_on(shard), clusters
        (elsewhere,) = (c for c in w.world.consumers if c is not mine)
        code, body = await _get(w, _widgets(w, vw, elsewhere.cluster))
        observe(f"VW of {shard}, cluster {elsewhere.name} of the other shard: {code} {body}")
        assert (code, body["kind"], body["reason"]) == (403, "Status", "Forbidden")


async def _token_review(w: ShardedWorld, where: str, token: str) -> dict[str, Any]:
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }
    url = f"{where}/apis/authentication.k8s.io/v1/tokenreviews"
    async with (
        w.bed.front.http_session(timeout=20) as session,
        session.post(url, json=review) as resp,
    ):
        assert resp.status == 201, await resp.text()
        status: dict[str, Any] = (await resp.json()).get("status") or {}
        return status


async def test_a_service_account_token_is_reviewed_in_any_workspace_through_the_front_proxy(
    sharded_world: ShardedWorld, observe: Observe
) -> None:
    """A ServiceAccount token of a workspace on the root shard, reviewed (TokenReview through
    the front-proxy) in its own workspace and in a workspace on the second shard — where
    vwserver reviews a caller's token: in the slice's workspace. Every shard has the same
    service-account signing key (as kcp's sharded setup requires). kcp v0.32.3: the second shard
    authenticates it too, as the same user, with the token's home cluster in the extras
    (``authentication.kcp.io/cluster-name``, scope ``cluster:<home>``), which a
    SubjectAccessReview in another workspace honours (a scoped token)."""
    w = sharded_world
    front = w.bed.front
    home = w.consumer_on(ROOT_SHARD)
    await front.kubectl(
        "apply", "-f", "-", server=home.url, input=json.dumps(_service_account("reviewer"))
    )
    token = (await front.kubectl("create", "token", "reviewer", server=home.url)).stdout.strip()
    own = await _token_review(w, front.cluster_url(home.cluster), token)
    other = await _token_review(w, front.cluster_url(w.slices.cluster), token)
    observe(f"SA token of {home.name} (root shard): own workspace {own}")
    observe(f"... reviewed in {w.slices.name} (second shard): {other}")
    for status in (own, other):
        assert status.get("authenticated") is True
        assert status["user"]["username"] == "system:serviceaccount:default:reviewer"
        extra = status["user"]["extra"]
        assert extra["authentication.kcp.io/cluster-name"] == [home.cluster]
        assert extra["authentication.kcp.io/scopes"] == [f"cluster:{home.cluster}"]


def _service_account(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": "default"},
    }
