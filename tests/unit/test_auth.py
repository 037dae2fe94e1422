"""vwserver.auth: caches (fake clock), certificate identities, and the Guard against a fake kcp.

The Guard talks real HTTP to :class:`~fakekcp.auth.FakeAuth` (an in-process aiohttp
server answering TokenReview and SubjectAccessReview like kcp), so what is counted here is what
would have reached kcp.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from fakekcp.auth import SCOPES_KEY, FakeAuth
from tests.support.serve import serve_app
from vwserver.auth.access import AccessReviewer
from vwserver.auth.cache import TTLCache
from vwserver.auth.certs import identity_from_peercert
from vwserver.auth.guard import (
    NO_AUTH_ACKNOWLEDGEMENT,
    NO_AUTH_USER,
    AuthMode,
    Guard,
    NoAuth,
    bearer_token,
)
from vwserver.auth.identity import Identity
from vwserver.auth.tokens import MALFORMED, TokenReviewer
from vwserver.errors import BadGateway, Forbidden, Unauthorized, UpstreamUnavailable
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.status import from_error


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- TTLCache ---------------------------------------------------------------------------------


def test_cache_expires_by_the_injected_clock() -> None:
    clock = FakeClock()
    cache: TTLCache[str, str] = TTLCache(max_entries=10, clock=clock)
    cache.put("a", "1", ttl=5)
    cache.put("b", "2", ttl=0)  # not cached at all
    assert cache.get("a") == "1"
    assert cache.get("b") is None
    clock.advance(4.9)
    assert cache.get("a") == "1"
    clock.advance(0.1)
    assert cache.get("a") is None
    assert len(cache) == 0


def test_cache_is_bounded_least_recently_used_first() -> None:
    cache: TTLCache[int, int] = TTLCache(max_entries=3, clock=FakeClock())
    for i in range(3):
        cache.put(i, i, ttl=60)
    assert cache.get(0) == 0  # 0 is now the most recently used
    cache.put(3, 3, ttl=60)
    assert len(cache) == 3
    assert cache.get(1) is None
    assert [cache.get(k) for k in (0, 2, 3)] == [0, 2, 3]


async def test_cache_coalesces_concurrent_loads() -> None:
    cache: TTLCache[str, str] = TTLCache(max_entries=10, clock=FakeClock())
    calls = 0
    release = asyncio.Event()

    async def load() -> tuple[str, float]:
        nonlocal calls
        calls += 1
        await release.wait()
        return "v", 60.0

    tasks = [asyncio.create_task(cache.get_or_load("k", load)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*tasks) == ["v"] * 5
    assert calls == 1


async def test_cache_failed_load_is_shared_and_not_cached() -> None:
    cache: TTLCache[str, str] = TTLCache(max_entries=10, clock=FakeClock())
    release = asyncio.Event()

    async def failing() -> tuple[str, float]:
        await release.wait()
        raise UpstreamUnavailable("down")

    tasks = [asyncio.create_task(cache.get_or_load("k", failing)) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, UpstreamUnavailable) for r in results)

    async def working() -> tuple[str, float]:
        return "ok", 60.0

    assert await cache.get_or_load("k", working) == "ok"


async def test_cache_waiter_loads_itself_when_the_leader_is_cancelled() -> None:
    cache: TTLCache[str, str] = TTLCache(max_entries=10, clock=FakeClock())
    never = asyncio.Event()

    async def hangs() -> tuple[str, float]:
        await never.wait()
        raise AssertionError("unreachable")

    async def works() -> tuple[str, float]:
        return "mine", 60.0

    leader = asyncio.create_task(cache.get_or_load("k", hangs))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cache.get_or_load("k", works))
    await asyncio.sleep(0)
    leader.cancel()
    assert await asyncio.wait_for(waiter, 5) == "mine"
    with pytest.raises(asyncio.CancelledError):
        await leader


# --- identities -------------------------------------------------------------------------------


def test_identity_from_a_verified_certificate() -> None:
    peercert = {
        "subject": (
            (("countryName", "DE"),),
            (("organizationName", "team-a"),),
            (("organizationName", "ops"),),
            (("commonName", "alice"),),
        )
    }
    identity = identity_from_peercert(peercert)
    assert identity == Identity.create("alice", groups=["team-a", "ops", "system:authenticated"])
    assert identity_from_peercert({}) is None  # unverified certificates decode as {}
    assert identity_from_peercert(None) is None
    assert identity_from_peercert({"subject": ((("organizationName", "x"),),)}) is None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("  Bearer   abc  ", "abc"),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic YWxpY2U6eA==", None),
        ("Bearer a b", None),
        ("", None),
        # not visible ASCII (UTF-8, DEL): nobody's (bytes that are not UTF-8 arrive as lone
        # surrogates, which a mocked request cannot carry: tests/security/test_header_bytes.py)
        ("Bearer caf\u00e9", None),
        ("Bearer a\x7f", None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    assert bearer_token(make_mocked_request("GET", "/", headers=headers)) == token


# --- Guard against a fake kcp -----------------------------------------------------------------

SLICE_CLUSTER = "slicews"
REVIEWER = "vwserver-token"


@dataclass
class World:
    fake: FakeAuth
    clock: FakeClock
    tokens: TokenReviewer
    access: AccessReviewer
    guard: Guard

    async def admit(
        self, token: str | None, *, slice_name: str = "a", verb: str = "list", **headers: str
    ) -> Identity:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = make_mocked_request("GET", "/", headers=headers)
        return await self.guard.admit(
            request, slice_cluster=SLICE_CLUSTER, slice_name=slice_name, verb=verb
        )


@pytest.fixture
async def world() -> AsyncIterator[World]:
    fake = FakeAuth(reviewer_token=REVIEWER)
    fake.add_user("alice-token", "alice", uid="uid-a", groups=["team-a"])
    fake.add_user("bob-token", "bob")
    fake.grant(cluster=SLICE_CLUSTER, slice_name="a", user="alice")
    fake.grant(cluster=SLICE_CLUSTER, slice_name="ro", group="team-a", verbs=["get", "list"])
    clock = FakeClock()
    async with (
        serve_app(fake.app()) as url,
        KubeClient(auth=ClientAuth(server=url, token=REVIEWER), timeout=5) as client,
    ):
        tokens = TokenReviewer(client=client, ttl=10, negative_ttl=5, clock=clock)
        access = AccessReviewer(client=client, allow_ttl=120, deny_ttl=10, clock=clock)
        yield World(fake, clock, tokens, access, Guard(tokens=tokens, access=access))


async def test_no_or_bad_token_is_401_with_the_apiservers_body(world: World) -> None:
    for token in (None, "wrong"):
        with pytest.raises(Unauthorized) as info:
            await world.admit(token)
        assert from_error(info.value) == (
            b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
            b'"message":"Unauthorized","reason":"Unauthorized","code":401}\n'
        )
    assert len(world.fake.token_reviews) == 1  # no token: nothing to ask kcp
    assert world.fake.access_reviews == []


async def test_granted_user_is_admitted_with_kcps_identity(world: World) -> None:
    identity = await world.admit("alice-token")
    assert identity == Identity.create(
        "alice", uid="uid-a", groups=["team-a", "system:authenticated"]
    )
    (review,) = world.fake.access_reviews
    assert review["cluster"] == SLICE_CLUSTER
    assert review["spec"] == {
        "user": "alice",
        "groups": ["team-a", "system:authenticated"],
        "uid": "uid-a",
        "resourceAttributes": {
            "verb": "list",
            "group": "sync.edge-connect.eu",
            "resource": "filteredapiexportendpointslices",
            "subresource": "content",
            "name": "a",
        },
    }
    # The TokenReview goes to the slice's workspace too.
    assert [r["cluster"] for r in world.fake.token_reviews] == [SLICE_CLUSTER]


async def test_denied_is_403_naming_slice_and_verb(world: World) -> None:
    with pytest.raises(Forbidden) as info:
        await world.admit("bob-token", slice_name="a", verb="watch")
    message = info.value.message
    assert 'filteredapiexportendpointslices.sync.edge-connect.eu "a" is forbidden' in message
    assert 'User "bob" cannot watch' in message
    assert SLICE_CLUSTER in message
    assert info.value.details == {
        "name": "a",
        "group": "sync.edge-connect.eu",
        "kind": "filteredapiexportendpointslices",
    }
    # verbs are checked one by one: a read-only grant allows list but not delete
    await world.admit("alice-token", slice_name="ro", verb="list")
    with pytest.raises(Forbidden):
        await world.admit("alice-token", slice_name="ro", verb="delete")


async def test_token_answers_are_cached_positive_and_negative(world: World) -> None:
    await world.admit("alice-token")
    await world.admit("alice-token", verb="get")
    assert len(world.fake.token_reviews) == 1
    world.clock.advance(10)
    await world.admit("alice-token")
    assert len(world.fake.token_reviews) == 2
    for _ in range(3):
        with pytest.raises(Unauthorized):
            await world.admit("wrong")
    assert len(world.fake.token_reviews) == 3
    # a token that kcp starts to accept is accepted once the negative TTL (5 s) has passed
    world.fake.add_user("wrong", "carol")
    world.clock.advance(4.9)
    with pytest.raises(Unauthorized):
        await world.admit("wrong")
    world.clock.advance(0.1)
    with pytest.raises(Forbidden):  # authenticated now; carol has no grant
        await world.admit("wrong")


async def test_a_malformed_token_is_nobodys_without_a_review(world: World) -> None:
    for token in ("\udcff\udcfe", "caf\u00e9", "a b", ""):
        result = await world.tokens.authenticate(token, cluster=SLICE_CLUSTER)
        assert (result.identity, result.error) == (None, MALFORMED)
    assert world.fake.token_reviews == []


async def test_kcps_reason_for_a_rejected_token_never_quotes_it() -> None:
    async def review(request: web.Request) -> web.Response:
        token = (await request.json())["spec"]["token"]
        return web.json_response({"status": {"error": f"unknown token {token!r}"}}, status=201)

    app = web.Application()
    app.router.add_post("/clusters/{c}/apis/authentication.k8s.io/v1/tokenreviews", review)
    async with (
        serve_app(app) as url,
        KubeClient(auth=ClientAuth(server=url, token=REVIEWER), timeout=5) as client,
    ):
        result = await TokenReviewer(client=client).authenticate("s3cret", cluster="c")
    assert result.identity is None
    assert "s3cret" not in result.error and "<token>" in result.error


async def test_cache_keys_never_hold_the_token(world: World) -> None:
    await world.admit("alice-token")
    keys = world.tokens.cache.keys()
    assert len(keys) == 1
    assert b"alice-token" not in repr(keys).encode()
    assert all(b"alice-token" not in part for _, part in keys)


async def test_grants_are_cached_longer_than_denials(world: World) -> None:
    await world.admit("alice-token")
    world.fake.revoke_all()
    world.clock.advance(119)
    await world.admit("alice-token")  # still allowed from the cache
    assert len(world.fake.access_reviews) == 1
    world.clock.advance(1)
    with pytest.raises(Forbidden):
        await world.admit("alice-token")
    world.fake.grant(cluster=SLICE_CLUSTER, slice_name="a", user="alice")
    with pytest.raises(Forbidden):  # the denial is cached for 10 s
        await world.admit("alice-token")
    world.clock.advance(10)
    await world.admit("alice-token")
    assert len(world.fake.access_reviews) == 3


async def test_scoped_identity_keeps_its_scope(world: World) -> None:
    """kcp scopes service-account tokens to their workspace via extra; vwserver forwards it."""
    world.fake.add_user(
        "sa-token", "system:serviceaccount:default:x", extra={SCOPES_KEY: ["cluster:other"]}
    )
    world.fake.grant(cluster=SLICE_CLUSTER, slice_name="a", user="system:serviceaccount:default:x")
    with pytest.raises(Forbidden):
        await world.admit("sa-token")
    assert world.fake.access_reviews[-1]["spec"]["extra"] == {SCOPES_KEY: ["cluster:other"]}


async def test_review_failures_are_5xx_and_not_cached(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.fake.fail_with = 500
    with pytest.raises(UpstreamUnavailable) as unavailable:
        await world.admit("alice-token")
    assert unavailable.value.retry_after == 1
    world.fake.fail_with = None
    # vwserver's identity lacks RBAC: kcp's 403 is the one it gives for a workspace that does
    # not exist, so the caller gets the 401 of a rejected token (tests/unit/test_tokens.py),
    # cached as briefly; the log says why.
    world.fake.reviewer_token = "something-else"
    with pytest.raises(Unauthorized) as refused:
        await world.admit("alice-token")
    assert refused.value.message == "Unauthorized"
    assert "cannot create resource" in caplog.text
    assert "alice-token" not in caplog.text
    world.fake.reviewer_token = REVIEWER
    world.clock.advance(5)
    assert (await world.admit("alice-token")).user == "alice"
    world.fake.reviewer_token = "something-else"  # and a refused access review is a 502
    with pytest.raises(BadGateway) as bad:
        await world.admit("alice-token", verb="get")
    assert "vwserver" not in bad.value.message  # details go to the log, not the caller
    world.fake.reviewer_token = REVIEWER


async def test_kcp_unreachable_is_503(world: World) -> None:
    async with KubeClient(auth=ClientAuth(server="http://127.0.0.1:9"), timeout=2) as client:
        guard = Guard(tokens=TokenReviewer(client=client), access=AccessReviewer(client=client))
        request = make_mocked_request("GET", "/", headers={"Authorization": "Bearer t"})
        with pytest.raises(UpstreamUnavailable):
            await guard.admit(request, slice_cluster="c", slice_name="s", verb="get")


def _with_peercert(peercert: dict[str, Any] | None, **headers: str) -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        peercert if name == "peercert" else default
    )
    return make_mocked_request("GET", "/", headers=headers, transport=transport)


ALICE_CERT = {"subject": ((("commonName", "alice"),),)}


async def test_client_certificate_needs_no_token_review(world: World) -> None:
    request = _with_peercert(ALICE_CERT)
    identity = await world.guard.admit(
        request, slice_cluster=SLICE_CLUSTER, slice_name="a", verb="get"
    )
    assert identity.user == "alice"
    assert world.fake.token_reviews == []
    assert world.guard.upstream_token(request) is None


async def test_passthrough_forwards_the_token_and_needs_one(world: World) -> None:
    passthrough = Guard(tokens=world.tokens, access=world.access, mode=AuthMode.PASSTHROUGH)
    request = _with_peercert(ALICE_CERT)
    with pytest.raises(Unauthorized):  # a certificate cannot be forwarded
        await passthrough.admit(request, slice_cluster=SLICE_CLUSTER, slice_name="a", verb="get")
    request = _with_peercert(None, Authorization="Bearer alice-token")
    await passthrough.admit(request, slice_cluster=SLICE_CLUSTER, slice_name="a", verb="get")
    assert passthrough.upstream_token(request) == "alice-token"
    assert world.guard.upstream_token(request) is None


# ----------------------------------------------------------------------------- the named seam


async def test_no_auth_is_asked_for_by_name_and_admits_everyone() -> None:
    """No authentication is a type of its own that demands its acknowledgement word for word;
    the app has no default guard."""
    with pytest.raises(ValueError, match="acknowledge"):
        NoAuth(acknowledge="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        NoAuth()  # type: ignore[call-arg]
    gate = NoAuth(acknowledge=NO_AUTH_ACKNOWLEDGEMENT)
    request = make_mocked_request("GET", "/")
    identity = await gate.authenticate(request, cluster="c")
    assert identity.user == NO_AUTH_USER
    await gate.authorize(identity, slice_cluster="c", slice_name="s", verb="delete")
    assert gate.mode is AuthMode.DELEGATED
    assert gate.upstream_token(request) is None


def test_build_app_requires_a_guard() -> None:
    from vwserver.proxy.upstream import UpstreamClient
    from vwserver.routes import Routes
    from vwserver.server import build_app

    with pytest.raises(TypeError, match="guard"):
        build_app(  # type: ignore[call-arg]
            routes=Routes(), upstream=UpstreamClient(auth=ClientAuth(server="http://x"))
        )
