"""Every option a client sends with a write reaches the upstream with its meaning, or the request
is refused (issue #22, finding 1's class) — property-based, against the fake upstream, which
records what the proxy sent and reads DeleteOptions as the apiserver does (body if any, else
query). Also: JSON-patch pointers (finding 8) and the upstream cost of the dependents check
(finding 12). The same options' effects in real kcp: ``test_write_options_kcp.py``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import Env, env, routes_for, widget
from tests.integration.test_proxy_writes import send
from tests.support.cache import cached_and_direct
from tests.support.properties import bounded_settings
from vwserver.errors import Invalid
from vwserver.proxy.options import DELETE_QUERY
from vwserver.proxy.writes import PointerError, _check_json_patch, pointer_tokens

__all__ = ["env"]  # the fixture, imported so that pytest finds it here

EXAMPLES = 60
_SETTINGS = bounded_settings(EXAMPLES, shrink=True)

# --- DeleteOptions --------------------------------------------------------------------------

_delete_query = st.fixed_dictionaries(
    {},
    optional={
        "dryRun": st.just("All"),
        "gracePeriodSeconds": st.integers(min_value=0, max_value=60).map(str),
        "propagationPolicy": st.sampled_from(["Orphan", "Background", "Foreground"]),
        "orphanDependents": st.sampled_from(["true", "false", "1", "0", "True", "FALSE", "t"]),
    },
)
_delete_body = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "dryRun": st.just(["All"]),
            "gracePeriodSeconds": st.integers(min_value=0, max_value=60),
            "propagationPolicy": st.sampled_from(["Orphan", "Background", "Foreground"]),
            "orphanDependents": st.booleans(),
        },
    ),
)
_TRUE = {"true", "1", "True", "t", "T", "TRUE"}


def _meant(query: dict[str, str]) -> dict[str, Any]:
    """What the query's DeleteOptions mean, typed as the apiserver decodes them."""
    out: dict[str, Any] = {}
    for k, v in query.items():
        if k == "dryRun":
            out[k] = [v]
        elif k == "gracePeriodSeconds":
            out[k] = int(v)
        elif k == "orphanDependents":
            out[k] = v in _TRUE
        else:
            out[k] = v
    return out


def _run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)


async def _delete_example(
    env: Env, *, collection: bool, query: dict[str, str], body: dict[str, Any] | None
) -> None:
    mark = uuid.uuid4().hex[:8]
    names = [f"w-{mark}-{i}" for i in range(2 if collection else 1)]
    for name in names:
        obj = widget(name, env="prod", region="eu")
        obj["metadata"]["labels"]["t"] = mark
        env.fake.create(cluster="c1", obj=obj)
    env.fake.faults.requests.clear()
    url = env.widgets() if collection else f"{env.widgets()}/{names[0]}"
    params = {**query, "labelSelector": f"t={mark}"} if collection else query
    status, doc = await send(env, "DELETE", url, body, params=params)
    deletes = [r for r in env.fake.faults.requests if r.method == "DELETE"]
    if body is not None and query:
        # two readings (the apiserver's: the body's; the client's: both): refused
        assert status == 400, doc
        assert all(k in doc["message"] for k in query)
        assert deletes == []
        return
    assert status == 200, doc
    meant = _meant(query) if body is None else body
    assert len(deletes) == len(names)
    for r in deletes:
        assert not set(r.query) & set(DELETE_QUERY), r.query  # never in the query
        sent = json.loads(r.body)
        for key, value in meant.items():
            assert sent.get(key) == value, (key, sent)
        assert set(sent) - {"preconditions", "kind", "apiVersion"} == set(meant)
    for r in env.fake.faults.requests:
        if r.method == "GET":
            assert not set(r.query) & set(DELETE_QUERY), r.query  # the list, the checks
    dry_run = "dryRun" in meant
    for name in names:
        assert (env.fake.get(cluster="c1", namespace="ns1", name=name) is not None) is dry_run


async def test_delete_options_reach_the_upstream_in_the_body(env: Env) -> None:
    loop = asyncio.get_running_loop()

    @_SETTINGS
    @given(collection=st.booleans(), query=_delete_query, body=_delete_body)
    def property_(collection: bool, query: dict[str, str], body: dict[str, Any] | None) -> None:
        _run(loop, _delete_example(env, collection=collection, query=query, body=body))

    await asyncio.to_thread(property_)


async def test_empty_body_means_the_query(env: Env) -> None:
    env.fake.faults.requests.clear()
    status, doc = await send(env, "DELETE", env.widgets() + "/w0", "  ", params={"dryRun": "All"})
    assert status == 200, doc
    assert env.fake.get(cluster="c1", namespace="ns1", name="w0") is not None


async def test_booleans_read_two_ways_are_refused(env: Env) -> None:
    # "f" is false to strconv.ParseBool and true to the apiserver's option decoder
    for value in ("f", "F", "yes", "fAlse"):
        status, doc = await send(
            env, "DELETE", env.widgets() + "/w0", params={"orphanDependents": value}
        )
        assert status == 400, (value, doc)
    assert env.fake.get(cluster="c1", namespace="ns1", name="w0") is not None


async def test_delete_options_of_the_wrong_type_are_refused(env: Env) -> None:
    for body in (
        {"dryRun": "All"},
        {"dryRun": ["Some"]},
        {"gracePeriodSeconds": "5"},
        {"gracePeriodSeconds": True},
        {"propagationPolicy": "orphan"},
        {"orphanDependents": "true"},
    ):
        status, doc = await send(env, "DELETE", env.widgets() + "/w0", body)
        assert status == 400, (body, doc)
    assert env.fake.get(cluster="c1", namespace="ns1", name="w0") is not None


# --- create, update, patch: query options forwarded as given ------------------------------------

_write_query = st.fixed_dictionaries(
    {},
    optional={
        "dryRun": st.just("All"),
        "fieldManager": st.text(
            alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20
        ),
        "fieldValidation": st.sampled_from(["Ignore", "Warn", "Strict"]),
        "pretty": st.sampled_from(["true", "false"]),
    },
)
# (strategic merge: custom resources answer 415)
_VERBS = ["create", "update", "update-status", "merge", "json", "apply", "status"]


async def _write_example(env: Env, *, verb: str, query: dict[str, str], force: bool) -> None:
    name = f"w-{uuid.uuid4().hex[:8]}"
    obj = env.fake.create(cluster="c1", obj=widget(name, env="prod", region="eu"))
    env.fake.faults.requests.clear()
    url = f"{env.widgets()}/{name}"
    headers = {"Content-Type": "application/json"}
    params = dict(query)
    body: Any
    if verb == "create":
        url, body = env.widgets(), widget(f"{name}-new", env="prod")
        method = "POST"
    elif verb in ("update", "update-status"):
        method, body = "PUT", {**obj, "spec": {"size": 9}}
        url += "/status" if verb == "update-status" else ""
    else:
        method = "PATCH"
        content = {
            "merge": "merge-patch",
            "json": "json-patch",
            "strategic": "strategic-merge-patch",
            "status": "merge-patch",
        }
        if verb == "apply":
            headers = {"Content-Type": "application/apply-patch+yaml"}
            params.setdefault("fieldManager", "hypothesis")
            if force:
                params["force"] = "true"
            body = yaml.safe_dump(
                {
                    "apiVersion": "example.io/v1alpha1",
                    "kind": "Widget",
                    "metadata": {"name": name, "labels": {"env": "prod"}},
                    "spec": {"size": 3},
                }
            )
        else:
            headers = {"Content-Type": f"application/{content[verb]}+json"}
            body = (
                [{"op": "replace", "path": "/spec/size", "value": 3}]
                if verb == "json"
                else {"spec": {"size": 3}}
            )
            url += "/status" if verb == "status" else ""
    status, doc = await send(env, method, url, body, params=params, headers=headers)
    assert status in (200, 201), (verb, params, doc)
    writes = [r for r in env.fake.faults.requests if r.method == method]
    assert writes, verb
    for r in writes:
        for key, value in params.items():
            assert r.query.get(key) == value, (verb, key, r.query)
        # the proxy's own dry run adds dryRun=All; nothing else is added
        assert set(r.query) - set(params) <= {"dryRun"}, (verb, r.query)
    if "dryRun" in params:
        assert all(r.query.get("dryRun") == "All" for r in writes)
        if verb == "create":
            assert env.fake.get(cluster="c1", namespace="ns1", name=f"{name}-new") is None
        else:
            assert env.fake.get(cluster="c1", namespace="ns1", name=name) == obj
    else:
        assert any("dryRun" not in r.query for r in writes), verb  # the write itself


async def test_write_options_reach_the_upstream(env: Env) -> None:
    loop = asyncio.get_running_loop()

    @_SETTINGS
    @given(verb=st.sampled_from(_VERBS), query=_write_query, force=st.booleans())
    def property_(verb: str, query: dict[str, str], force: bool) -> None:
        _run(loop, _write_example(env, verb=verb, query=query, force=force))

    await asyncio.to_thread(property_)


# --- JSON-patch pointers (RFC 6901) -----------------------------------------------------------------

_OWNED = {(), ("metadata",), ("metadata", "resourceVersion")}
_token_chars = st.sampled_from(
    [
        "metadata",
        "resourceVersion",
        "labels",
        "a",
        "~",
        "~0",
        "~1",
        "~2",
        "/",
        "",
        "x",
        "spec",
        "0",
        "-",
    ]
)
_pointer = st.lists(_token_chars, max_size=6).map("".join)


def _canonical(pointer: str) -> bool:
    """RFC 6901's grammar: ("/" *(unescaped / "~" ("0" / "1")))*."""
    if pointer == "":
        return True
    if not pointer.startswith("/"):
        return False
    i = 0
    while (i := pointer.find("~", i)) >= 0:
        if pointer[i + 1 : i + 2] not in ("0", "1"):
            return False
        i += 2
    return True


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


@settings(max_examples=2000, derandomize=True, database=None)
@given(
    op=st.sampled_from(["add", "remove", "replace", "move", "copy", "test"]),
    path=_pointer,
    from_=_pointer,
)
def test_accepted_pointers_are_canonical_and_miss_the_proxys(
    op: str, path: str, from_: str
) -> None:
    patch: dict[str, Any] = {"op": op, "path": path, "value": "v"}
    if op in ("move", "copy"):
        patch["from"] = from_
    try:
        _check_json_patch([patch])
    except Invalid:
        return
    pointers = [path] + ([from_] if op in ("move", "copy") else [])
    for pointer in pointers:
        assert _canonical(pointer), pointer
        tokens = pointer_tokens(pointer)
        # the tokens are what the pointer says (re-escaped, the same pointer)
        assert "".join("/" + _escape(t) for t in tokens) == pointer
    if op != "test":
        assert pointer_tokens(path) not in _OWNED, path
    if op == "move":
        assert pointer_tokens(from_) not in _OWNED, from_


def test_pointer_tokens() -> None:
    assert pointer_tokens("") == ()
    assert pointer_tokens("/") == ("",)
    assert pointer_tokens("/metadata/labels/a~1b") == ("metadata", "labels", "a/b")
    assert pointer_tokens("/~01") == ("~1",)
    assert pointer_tokens("/metadata/resource~0Version") == ("metadata", "resource~Version")
    for bad in ("x/metadata", "metadata", "/a~", "/a~2", "~1/x", " /metadata"):
        try:
            pointer_tokens(bad)
        except PointerError:
            continue
        raise AssertionError(bad)


def test_label_checks_read_decoded_tokens() -> None:
    import pytest

    from vwserver.errors import BadRequest

    with pytest.raises(BadRequest):  # /metadata/labels/a~1b is a label: its value must be a str
        _check_json_patch([{"op": "add", "path": "/metadata/labels/a~1b", "value": 1}])
    with pytest.raises(BadRequest):  # the whole map, spelled with an escape-free pointer
        _check_json_patch([{"op": "replace", "path": "/metadata/labels", "value": {"a": 1}}])
    with pytest.raises(Invalid):  # the precondition behind a dangling escape
        _check_json_patch([{"op": "remove", "path": "/metadata/resourceVersion~"}])


# --- finding 12: the dependents check costs no kcp request per DELETE --------------------------


def _seed(fake: FakeUpstream) -> None:
    owner = fake.create(cluster="c1", obj=widget("owner", env="prod", region="eu"))
    uid = owner["metadata"]["uid"]
    for i in range(5):
        fake.create(cluster="c1", obj=widget(f"plain-{i}", env="prod", region="eu"))
    hidden = widget("hidden", env="dev", region="eu")
    hidden["metadata"]["ownerReferences"] = [
        {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "name": "owner", "uid": uid}
    ]
    fake.create(cluster="c1", obj=hidden)


async def test_dependents_check_is_bounded_and_refuses_hidden_dependents() -> None:
    async with cached_and_direct(
        FakeUpstream(bookmark_interval=0.2),
        routes=routes_for,
        token="vwserver-own-token",
        seed=_seed,
    ) as pair:
        base = f"{pair.cached}/services/filtered-apiexport/slicews/prod/clusters/c1"
        url = f"{base}/apis/example.io/v1alpha1/namespaces/ns1/widgets"
        pair.fake.faults.requests.clear()
        for _ in range(5):
            async with pair.session.delete(f"{url}/owner") as r:
                doc = await r.json()
                assert r.status == 409, doc
                assert "dependents outside the slice" in doc["message"]
                assert "hidden" not in doc["message"]
        lists = [
            r
            for r in pair.fake.faults.requests
            if r.method == "GET" and r.path.endswith("/widgets") and "watch" not in r.query
        ]
        # one list of the shared cache for five deletes (plus the five checks' GETs of the owner)
        assert len(lists) == 1, [(r.path, r.query) for r in lists]
        assert not [r for r in pair.fake.faults.requests if r.method == "DELETE"]
        # deletecollection: the page (owner, plain-0) is checked before any of it is deleted
        async with pair.session.delete(url) as r:
            assert r.status == 409, await r.text()
        assert not [r for r in pair.fake.faults.requests if r.method == "DELETE"]
        # an object with no hidden dependents is deleted
        async with pair.session.delete(f"{url}/plain-0") as r:
            assert r.status == 200, await r.text()
        # Orphan: allowed
        async with pair.session.delete(f"{url}/owner", params={"propagationPolicy": "Orphan"}) as r:
            assert r.status == 200, await r.text()
        # the server without the cache does not check (documented)
        direct = f"{pair.direct}/services/filtered-apiexport/slicews/prod/clusters/c1"
        async with pair.session.delete(
            f"{direct}/apis/example.io/v1alpha1/namespaces/ns1/widgets/plain-1"
        ) as r:
            assert r.status == 200, await r.text()
