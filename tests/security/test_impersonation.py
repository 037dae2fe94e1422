"""A request that asks to be served as someone else is refused, never answered as its caller
(issue #22, the class of finding 1: an option the client sent reaches kcp with its meaning, or
is refused).

``Impersonate-User``/``-Group``/``-Uid``/``-Extra-<key>`` (``kubectl --as``) and an
authenticating proxy's ``X-Remote-User``/``-Group``/``-Extra-<key>`` mean "act as this
identity" to kube-apiserver and kcp. vwserver dropped them and answered as the caller himself:
``kubectl --as=x get widgets`` got the caller's list. Now every such request is a 403
``Forbidden`` Status saying impersonation is not supported through a slice — in both auth modes,
for every verb, with or without (valid) credentials, decided by the field names alone: nothing
reaches kcp, no token or access review is made (so the refusal tells nothing about the caller
or the slice). The fake kcp records every request it gets.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.integration.test_auth import ALICE, Env, proxy_env, status_of
from tests.security.support import env_int
from tests.support.properties import bounded_settings
from vwserver.auth.guard import AuthMode
from vwserver.errors import Forbidden
from vwserver.proxy.request_headers import refuse_impersonation

EXAMPLES = env_int("VWSERVER_IMPERSONATION_EXAMPLES", 200)
REFUSAL = "impersonation is not supported through a slice"

HEADERS = [
    ("Impersonate-User", "system:admin"),
    ("Impersonate-Group", "system:masters"),
    ("Impersonate-Uid", "0"),
    ("Impersonate-Extra-Scopes", "none"),
    ("Impersonate-Extra-acme.com%2Fproject", "p1"),  # an extra key, percent-encoded (client-go)
    ("X-Remote-User", "system:admin"),
    ("X-Remote-Group", "system:masters"),
    ("X-Remote-Extra-Foo", "bar"),
    ("impersonate-user", "bob"),  # field names are case-insensitive
    ("IMPERSONATE-GROUP", "g"),
    ("x-remote-uSER", "bob"),
    ("Impersonate-User", ""),  # an empty value asks for impersonation all the same
]
CREDENTIALS: dict[str, dict[str, str]] = {
    "alice": ALICE,  # may use the slice
    "none": {},  # would be a 401
    "wrong": {"Authorization": "Bearer wrong"},  # would be a 401 after a review
}
# (method, path under the slice's clusters/c1, JSON body): one request per verb.
W = "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
REQUESTS: list[tuple[str, str, Any]] = [
    ("GET", W, None),  # list
    ("GET", W + "?watch=1", None),  # watch
    ("GET", W + "/p1", None),  # get
    ("POST", W, {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "metadata": {}}),
    ("PUT", W + "/p1", {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "metadata": {}}),
    ("PATCH", W + "/p1", {"metadata": {"labels": {"env": "dev"}}}),
    ("DELETE", W + "/p1", None),
    ("DELETE", W, None),  # deletecollection
    ("GET", "/apis/example.io/v1alpha1", None),  # discovery
]


async def send(env: Env, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
    content = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with env.session.request(
        method, env.url(path=path), json=body, headers={**headers, **content}
    ) as r:
        return r.status, (await status_of(r)) if r.status >= 300 else None


def nothing_asked(env: Env) -> None:
    assert env.vw_requests() == [], [f"{r.method} {r.path}" for r in env.vw_requests()]
    assert env.auth.token_reviews == [] and env.auth.access_reviews == []


@pytest.mark.parametrize("mode", list(AuthMode))
@pytest.mark.parametrize(("name", "value"), HEADERS, ids=[f"{n}={v}" for n, v in HEADERS])
async def test_an_impersonation_header_is_a_403_before_anything_is_asked(
    mode: AuthMode, name: str, value: str
) -> None:
    async with proxy_env(mode) as env:
        for credentials in CREDENTIALS.values():
            for method, path, body in REQUESTS:
                status, doc = await send(env, method, path, body, {**credentials, name: value})
                where = (credentials, method, path)
                assert status == 403, where
                assert (doc["reason"], doc["code"]) == ("Forbidden", 403), where
                assert doc["message"].startswith(REFUSAL) and name in doc["message"], doc
        nothing_asked(env)
        # the same request without the field is served as alice
        status, _ = await send(env, "GET", W, None, ALICE)
        assert status == 200


async def test_kubectl_as_with_groups_and_uid_is_one_refusal() -> None:
    """What ``kubectl --as=x --as-group=g1 --as-group=g2 --as-uid=u`` sends: several fields,
    a repeated one among them."""
    async with proxy_env() as env:
        async with env.session.get(
            env.url(),
            headers=[
                *ALICE.items(),
                ("Impersonate-User", "x"),
                ("Impersonate-Group", "g1"),
                ("Impersonate-Group", "g2"),
                ("Impersonate-Uid", "u"),
            ],
        ) as r:
            assert r.status == 403
            assert (await status_of(r))["message"].startswith(REFUSAL)
        nothing_asked(env)


def test_fields_that_only_look_alike_are_not_refused() -> None:
    refuse_impersonation(["Impersonate", "X-Impersonate-User", "X-Remotely", "X-Remote", "Accept"])
    for name, _ in HEADERS:
        with pytest.raises(Forbidden, match=REFUSAL):
            refuse_impersonation(["Accept", name])


# --- property: any spelling of the prefixes, any key, any visible value --------------------------

PREFIXES = st.sampled_from(["Impersonate-", "X-Remote-"]).flatmap(
    lambda p: st.lists(st.booleans(), min_size=len(p), max_size=len(p)).map(
        lambda upper: "".join(c.upper() if u else c.lower() for c, u in zip(p, upper, strict=True))
    )
)
KEYS = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.%", max_size=24
)
VALUES = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@pytest.mark.parametrize("mode", list(AuthMode))
async def test_any_impersonation_field_is_refused_without_asking_anyone(mode: AuthMode) -> None:
    loop = asyncio.get_running_loop()
    failures: list[str] = []
    async with proxy_env(mode) as env:

        async def one(prefix: str, key: str, value: str, request: int, who: str) -> None:
            method, path, body = REQUESTS[request]
            headers = {**CREDENTIALS[who], prefix + key: value.strip()}
            status, doc = await send(env, method, path, body, headers)
            if status != 403 or not doc["message"].startswith(REFUSAL):
                failures.append(f"{prefix + key}: {value!r} {method} {path} as {who}: {status}")

        @bounded_settings(EXAMPLES)
        @given(
            PREFIXES,
            KEYS,
            VALUES,
            st.integers(0, len(REQUESTS) - 1),
            st.sampled_from(sorted(CREDENTIALS)),
        )
        @example("Impersonate-", "User", "system:admin", 0, "alice")
        @example("x-remote-", "extra-", "", 3, "none")
        def property_(prefix: str, key: str, value: str, request: int, who: str) -> None:
            asyncio.run_coroutine_threadsafe(one(prefix, key, value, request, who), loop).result(
                timeout=30
            )

        # hypothesis drives the examples from a worker thread; the server runs on this loop.
        await asyncio.to_thread(property_)
        nothing_asked(env)
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:20])
