"""A bogus token learns nothing about which slice clusters exist (no existence oracle).

kcp answers a TokenReview posted to a workspace that does not exist (or where vwserver may not
review) with a 403 instead of the review. That used to become a 502 while an invalid token in a
real workspace was a 401, so anyone could probe cluster names without a credential. Both are now
the same 401, cached alike; kcp unreachable or failing stays a 503, and an answer that does not
depend on the workspace (vwserver's own credentials refused) a 502.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from fakekcp.auth import FakeAuth
from tests.support.serve import serve_app
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import Guard
from vwserver.auth.tokens import REFUSAL_TTL, TokenReviewer
from vwserver.errors import BadGateway, Unauthorized, UpstreamUnavailable
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.status import from_error, status_body

REVIEWER = "reviewer-token"
EXISTING, MISSING, GONE, BROKEN = "2fx3m0rnxzbs8mq9", "0000nonexistent", "0000gone", "0000broken"

# What kcp v0.32.3 answers (checked against it) to a TokenReview posted by a ServiceAccount with
# cluster-admin in its own workspace: in a logical cluster that does not exist, and as well in
# one that exists without RBAC for it, this 403 (kcp-admin gets it too); in a workspace *path*
# that does not exist, a 404 (vwserver's URLs carry cluster IDs, but the answer is handled).
_KCP_ANSWERS = {
    MISSING: (
        403,
        "Forbidden",
        'tokenreviews.authentication.k8s.io is forbidden: User "system:serviceaccount:default:'
        'vwserver" cannot create resource "tokenreviews" in API group "authentication.k8s.io" '
        "at the cluster scope: access denied",
    ),
    GONE: (404, "NotFound", 'workspaces.tenancy.kcp.io "root:nope" not found'),
    BROKEN: (401, "Unauthorized", "Unauthorized"),  # vwserver's own token: not the workspace's
}


@web.middleware
async def workspaces(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    """Plays kcp's answers for the clusters above; the rest goes to :class:`FakeAuth`."""
    answer = _KCP_ANSWERS.get(request.match_info.get("cluster", ""))
    if answer is None:
        return await handler(request)
    code, reason, message = answer
    body = status_body(code=code, reason=reason, message=message)
    return web.Response(status=code, body=body, content_type="application/json")


@dataclass
class World:
    fake: FakeAuth
    guard: Guard

    async def authenticate(self, token: str, cluster: str) -> bytes:
        """The Status the caller gets (raises if it is not a 401)."""
        request = make_mocked_request("GET", "/", headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(Unauthorized) as refused:
            await self.guard.authenticate(request, cluster=cluster)
        return from_error(refused.value)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    fake = FakeAuth(reviewer_token=REVIEWER)
    fake.add_user("alice-token", "alice")
    app = web.Application(middlewares=[workspaces])
    fake.install(app)
    async with (
        serve_app(app) as url,
        KubeClient(auth=ClientAuth(server=url, token=REVIEWER), timeout=5) as client,
    ):
        tokens = TokenReviewer(client=client, ttl=10, negative_ttl=5)
        yield World(fake, Guard(tokens=tokens, access=AccessReviewer(client=client)))


async def test_a_missing_workspace_answers_like_a_bad_token(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    in_existing = await world.authenticate("bogus-token", EXISTING)
    assert await world.authenticate("bogus-token", MISSING) == in_existing
    assert await world.authenticate("bogus-token", GONE) == in_existing
    assert await world.authenticate("alice-token", MISSING) == in_existing
    assert "cannot create resource" in caplog.text  # the operator still sees why
    assert "bogus-token" not in caplog.text and "alice-token" not in caplog.text


async def test_the_refusal_is_cached_like_a_rejected_token(world: World) -> None:
    for _ in range(3):
        await world.authenticate("bogus-token", MISSING)
    tokens = world.guard._tokens
    assert len(tokens.cache) == 1
    (entry,) = tokens.cache.keys()
    assert entry[0] == MISSING and b"bogus-token" not in entry[1]


async def test_failures_that_do_not_depend_on_the_workspace_stay_5xx(world: World) -> None:
    request = make_mocked_request("GET", "/", headers={"Authorization": "Bearer bogus-token"})
    with pytest.raises(BadGateway):
        await world.guard.authenticate(request, cluster=BROKEN)
    world.fake.fail_with = 503
    with pytest.raises(UpstreamUnavailable):
        await world.guard.authenticate(request, cluster=EXISTING)
    async with KubeClient(auth=ClientAuth(server="http://127.0.0.1:9"), timeout=2) as down:
        guard = Guard(tokens=TokenReviewer(client=down), access=AccessReviewer(client=down))
        with pytest.raises(UpstreamUnavailable):
            await guard.authenticate(request, cluster=MISSING)


async def test_a_refusal_where_a_slice_is_served_is_kcps_trouble_not_the_tokens(
    world: World,
) -> None:
    """kcp refuses reviews for a few seconds while it restarts. In a workspace where vwserver
    serves a slice (so it exists), that is no verdict on the token: 503 with Retry-After, never
    a 401 that would make a client drop a valid token. Elsewhere it stays the 401 above."""
    served = {MISSING}
    guard = Guard(
        tokens=world.guard._tokens,
        access=AccessReviewer(client=world.guard._tokens._client),
        serves_cluster=served.__contains__,
    )
    for token in ("alice-token", "bogus-token"):
        request = make_mocked_request("GET", "/", headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(UpstreamUnavailable) as unavailable:
            await guard.authenticate(request, cluster=MISSING)
        assert unavailable.value.code == 503 and unavailable.value.retry_after == 1
        assert "Bearer" not in unavailable.value.message and token not in unavailable.value.message
        with pytest.raises(Unauthorized):  # not served here: the same 401 as a bad token
            await guard.authenticate(request, cluster=GONE)


async def test_a_refusal_is_cached_for_a_second_at_most() -> None:
    """A refused review must not keep a valid token out for the whole negative TTL once kcp
    reviews again; a rejected token is cached for the negative TTL."""
    now = [0.0]
    fake = FakeAuth(reviewer_token=REVIEWER)
    app = web.Application(middlewares=[workspaces])
    fake.install(app)
    async with (
        serve_app(app) as url,
        KubeClient(auth=ClientAuth(server=url, token=REVIEWER), timeout=5) as client,
    ):
        tokens = TokenReviewer(client=client, ttl=10, negative_ttl=5, clock=lambda: now[0])
        refused = await tokens.authenticate("alice-token", cluster=MISSING)
        rejected = await tokens.authenticate("bogus-token", cluster=EXISTING)
        assert refused.refused and refused.identity is None
        assert not rejected.refused and rejected.identity is None
        assert len(tokens.cache) == 2
        now[0] = REFUSAL_TTL + 0.01
        held = tokens.cache.keys()
        assert [key[0] for key in held if tokens.cache.get(key) is not None] == [EXISTING]
