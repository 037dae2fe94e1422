"""Defence in depth on what the upstream sends back: nothing outside the request's own scope is
forwarded, whatever the upstream answers (``vwserver.proxy.filtering.Scope``).

The fake upstream's ``ignore_scope`` fault plays a shard mix-up: reads of one logical cluster
are answered with objects of every cluster and namespace, a GET with another object than the one
named. Every object is in the slice (``env=prod``), so only the scope check can keep the foreign
ones out. Every read path — kcp-answered LIST (plain, Table, PartialObjectMetadataList, YAML, a
client's own paging), GET in every shape, WATCH (plain, Table, the deprecated ``/watch/`` paths,
a ``metadata.name`` field selector), and the shared cache's LIST and WATCH (which stores the
wildcard watch's objects keyed by their cluster) — must answer only objects of the URL's cluster,
namespace and name; a GET answers 404 as for a missing object; the proxy counts what it dropped.

Writes too: the stored object a write is checked against, read by the proxy before writing, is
treated as missing when ``ignore_scope`` answers another one (404, nothing reaches kcp but
GETs). The ``foreign_answers`` fault carries every write out as asked and answers it with the
object moved to another cluster, namespace or name: the client gets 502 and none of that
object (the write happened upstream), counted. The read-only apibindings, which no slice's
membership filters, are still checked against the request's scope on every read path.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import CLUSTERS, PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.integration.test_handoff import World, leaving_a, world
from tests.support.cache import CachedAndDirect, cached_and_direct
from vwserver.k8s.types import ObjectMeta
from vwserver.proxy.filtering import Scope
from vwserver.proxy.writes import create_scope

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
YAML = "application/yaml"
NAMESPACES = ("ns1", "ns2")
API = "/apis/example.io/v1alpha1"


def name_of(cluster: str, ns: str, i: int) -> str:
    return f"{cluster}-{ns}-w{i}"


def seed(fake: FakeUpstream) -> None:
    for cluster in CLUSTERS:
        for ns in NAMESPACES:
            for i in range(3):
                fake.create(cluster=cluster, obj=widget(name_of(cluster, ns, i), ns=ns, env="prod"))


@pytest.fixture
async def pair() -> AsyncIterator[CachedAndDirect]:
    async with cached_and_direct(
        FakeUpstream(bookmark_interval=0.2), routes=routes_for, token=PROXY_TOKEN, seed=seed
    ) as pair:
        yield pair


def url(base: str, path: str, *, cluster: str = "c1") -> str:
    return f"{base}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/{cluster}{path}"


ALL_NAMES = {name_of(c, ns, i) for c in CLUSTERS for ns in NAMESPACES for i in range(3)}


def names_in(text: str) -> set[str]:
    return {n for n in ALL_NAMES if n in text}


def in_scope(*, ns: str = "ns1", name: str = "") -> set[str]:
    return {n for n in ALL_NAMES if n.startswith(f"c1-{ns}-") and (not name or n == name)}


async def read(session: aiohttp.ClientSession, target: str, **kwargs: Any) -> tuple[int, str]:
    async with session.get(target, **kwargs) as r:
        return r.status, await r.text()


async def out_of_scope_count(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vwserver_upstream_out_of_scope_total{")
    )


LISTS = [
    ("plain", None, {}),
    ("paged", None, {"limit": "4"}),  # the fourth object is in ns2
    ("table", TABLE, {}),
    ("table-no-object", TABLE, {"includeObject": "None"}),
    ("pom-list", POM_LIST, {}),
    ("yaml", YAML, {}),
    ("field-selector", None, {"fieldSelector": "metadata.namespace=ns1"}),
]


@pytest.mark.parametrize(
    ("accept", "query"), [(a, q) for _, a, q in LISTS], ids=[i for i, *_ in LISTS]
)
async def test_lists_forward_only_objects_in_scope(
    pair: CachedAndDirect, accept: str | None, query: dict[str, str]
) -> None:
    pair.fake.faults.ignore_scope = True
    headers = {"Accept": accept} if accept else {}
    for base in (pair.direct, pair.cached):
        status, text = await read(
            pair.session, url(base, f"{API}/namespaces/ns1/widgets"), params=query, headers=headers
        )
        assert status == 200, text
        shown = names_in(text)
        assert shown, text
        assert shown <= in_scope(), f"{base}: foreign objects {sorted(shown - in_scope())}"
    assert await out_of_scope_count(pair.session, pair.direct) > 0


async def test_a_named_field_selector_list_forwards_only_that_name(pair: CachedAndDirect) -> None:
    pair.fake.faults.ignore_scope = True
    wanted = name_of("c1", "ns1", 1)
    for base in (pair.direct, pair.cached):
        status, text = await read(
            pair.session,
            url(base, f"{API}/namespaces/ns1/widgets"),
            params={"fieldSelector": f"metadata.name={wanted}"},
        )
        assert status == 200, text
        assert names_in(text) == {wanted}, text


async def test_a_cluster_wide_cached_list_is_one_cluster(pair: CachedAndDirect) -> None:
    """The cache holds every cluster's objects (from the wildcard watch): a per-cluster URL
    gets that cluster's only."""
    for cluster in CLUSTERS:
        status, text = await read(pair.session, url(pair.cached, f"{API}/widgets", cluster=cluster))
        assert status == 200, text
        assert names_in(text) == {n for n in ALL_NAMES if n.startswith(f"{cluster}-")}


@pytest.mark.parametrize("accept", [None, TABLE, POM, YAML], ids=["object", "table", "pom", "yaml"])
async def test_get_of_another_object_answers_like_missing(
    pair: CachedAndDirect, accept: str | None
) -> None:
    headers = {"Accept": accept} if accept else {}
    target = url(pair.direct, f"{API}/namespaces/ns1/widgets/{name_of('c1', 'ns1', 0)}")
    missing = url(pair.direct, f"{API}/namespaces/ns1/widgets/nothing-here")
    status, text = await read(pair.session, target, headers=headers)
    assert status == 200 and names_in(text) == {name_of("c1", "ns1", 0)}, text
    pair.fake.faults.ignore_scope = True
    status, text = await read(pair.session, target, headers=headers)
    _, missing_text = await read(pair.session, missing, headers=headers)
    assert status == 404, text
    assert not names_in(text.replace(name_of("c1", "ns1", 0), "")), text
    assert text.replace(name_of("c1", "ns1", 0), "X") == missing_text.replace("nothing-here", "X")
    assert await out_of_scope_count(pair.session, pair.direct) > 0


WATCHES = [
    ("plain", f"{API}/namespaces/ns1/widgets", None, {}, ""),
    ("table", f"{API}/namespaces/ns1/widgets", TABLE, {}, ""),
    ("legacy", f"{API}/watch/namespaces/ns1/widgets", None, {}, ""),
    (
        "legacy-named",
        f"{API}/watch/namespaces/ns1/widgets/{name_of('c1', 'ns1', 2)}",
        None,
        {},
        name_of("c1", "ns1", 2),
    ),
    (
        "field-selector-name",
        f"{API}/namespaces/ns1/widgets",
        None,
        {"fieldSelector": f"metadata.name={name_of('c1', 'ns1', 2)}"},
        name_of("c1", "ns1", 2),
    ),
    (
        "field-selector-namespace",
        f"{API}/widgets",
        None,
        {"fieldSelector": "metadata.namespace=ns1"},
        "",
    ),
]


@pytest.mark.parametrize(
    ("path", "accept", "query", "name"),
    [(p, a, q, n) for _, p, a, q, n in WATCHES],
    ids=[i for i, *_ in WATCHES],
)
async def test_watches_forward_only_events_in_scope(
    pair: CachedAndDirect, path: str, accept: str | None, query: dict[str, str], name: str
) -> None:
    """A watch with its initial state (no resourceVersion) and a change of every object."""
    pair.fake.faults.ignore_scope = True
    headers = {"Accept": accept} if accept else {}
    params = {**query, "watch": "true", "timeoutSeconds": "1"}
    for base in (pair.direct, pair.cached):
        status, text = await read(pair.session, url(base, path), params=params, headers=headers)
        assert status == 200, text
        events = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert all(e["type"] != "ERROR" for e in events), text
        shown = names_in(text)
        assert shown, f"{base}: {text}"
        assert shown <= in_scope(name=name), f"{base}: foreign {sorted(shown - in_scope())}"
    assert await out_of_scope_count(pair.session, pair.direct) > 0


# --- writes --------------------------------------------------------------------------------

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
TARGET = name_of("c1", "ns1", 0)
WIDGET_API = "example.io/v1alpha1"


def _object_path(name: str = TARGET, sub: str = "") -> str:
    return f"{API}/namespaces/ns1/widgets/{name}{sub}"


def _writes(name: str = TARGET) -> list[tuple[str, str, str, dict[str, Any], bytes]]:
    """(id, method, path, query, headers-and-body) of every write on one existing object."""
    body = widget(name, env="prod")
    put = json.dumps({**body, "spec": {"size": 2}}).encode()
    apply = json.dumps({"apiVersion": WIDGET_API, "kind": "Widget", "metadata": {"name": name}})
    return [
        ("put", "PUT", _object_path(name), {}, put),
        ("put-status", "PUT", _object_path(name, "/status"), {}, put),
        ("merge", "PATCH", _object_path(name), {"ct": MERGE}, b'{"spec":{"size":3}}'),
        (
            "json-patch",
            "PATCH",
            _object_path(name),
            {"ct": JSON_PATCH},
            b'[{"op":"replace","path":"/spec/size","value":4}]',
        ),
        ("apply", "PATCH", _object_path(name), {"ct": APPLY, "fieldManager": "t"}, apply.encode()),
        (
            "merge-dry-run",
            "PATCH",
            _object_path(name),
            {"ct": MERGE, "dryRun": "All"},
            b'{"spec":{"size":5}}',
        ),
        ("delete", "DELETE", _object_path(name), {}, b""),
    ]


WRITES = _writes()


async def _send(
    pair: CachedAndDirect, base: str, method: str, path: str, query: dict[str, Any], body: bytes
) -> tuple[int, str]:
    params = {k: v for k, v in query.items() if k != "ct"}
    headers = {"Content-Type": query.get("ct", "application/json")}
    async with pair.session.request(
        method, url(base, path), params=params, headers=headers, data=body or None
    ) as r:
        return r.status, await r.text()


def _upstream_writes(fake: FakeUpstream) -> list[str]:
    return [f"{r.method} {r.path}" for r in fake.faults.requests if r.method != "GET"]


@pytest.mark.parametrize(
    ("method", "path", "query", "body"),
    [w[1:] for w in WRITES],
    ids=[w[0] for w in WRITES],
)
async def test_a_stored_object_out_of_scope_is_missing_and_nothing_is_written(
    pair: CachedAndDirect, method: str, path: str, query: dict[str, Any], body: bytes
) -> None:
    """The proxy's own GET before a write answers another object: the write is answered like
    one of a missing object, and nothing but reads reaches kcp (not even an apply's create)."""
    missing = "nothing-here"
    pair.fake.faults.ignore_scope = True
    before = await out_of_scope_count(pair.session, pair.direct)
    for base in (pair.direct, pair.cached):
        pair.fake.faults.requests.clear()
        status, text = await _send(pair, base, method, path, query, body)
        if base == pair.cached and method == "DELETE" and status == 200:
            # The cached server's DELETE checks the object's dependents in the shared cache,
            # which may then hold the stored object itself (in scope, in the slice): checked
            # from it, no object is read from kcp — nothing kcp could answer out of scope —
            # and the delete conditional on that object is made.
            assert not [
                r for r in pair.fake.faults.requests if r.method == "GET" and TARGET in r.path
            ]
            assert pair.fake.get(cluster="c1", namespace="ns1", name=TARGET) is None
            continue
        assert status == 404, text
        assert not names_in(text.replace(TARGET, "")), text
        assert _upstream_writes(pair.fake) == [], text
        # the same answer as for an object that does not exist (without the fault)
        pair.fake.faults.ignore_scope = False
        other = path.replace(TARGET, missing)
        if query.get("ct") != APPLY:  # an apply of a missing object creates it
            _, missing_text = await _send(pair, base, method, other, query, body)
            assert text.replace(TARGET, "X") == missing_text.replace(missing, "X")
        pair.fake.faults.ignore_scope = True
    if method != "DELETE":
        assert pair.fake.get(cluster="c1", namespace="ns1", name=TARGET) is not None
    assert await out_of_scope_count(pair.session, pair.direct) > before


def _assert_bad_gateway(status: int, text: str) -> None:
    assert status == 502, text
    answer = json.loads(text)
    assert answer["kind"] == "Status" and answer["code"] == 502, text
    assert "foreign" not in text and "spec" not in answer, text


@pytest.mark.parametrize("where", ["cluster", "namespace", "name"])
@pytest.mark.parametrize(
    ("method", "path", "query", "body"),
    [w[1:] for w in WRITES],
    ids=[w[0] for w in WRITES],
)
async def test_a_write_answered_out_of_scope_is_bad_gateway(
    pair: CachedAndDirect,
    where: str,
    method: str,
    path: str,
    query: dict[str, Any],
    body: bytes,
) -> None:
    """Every write's answer (a patch's dry run included) outside the request's scope: 502,
    no part of the answer forwarded, counted."""
    for base in (pair.direct, pair.cached):
        before = await out_of_scope_count(pair.session, base)
        pair.fake.faults.foreign_answers = where
        status, text = await _send(pair, base, method, path, query, body)
        pair.fake.faults.foreign_answers = ""
        _assert_bad_gateway(status, text)
        assert await out_of_scope_count(pair.session, base) == before + 1
        if method == "DELETE":
            pair.fake.create(cluster="c1", obj=widget(TARGET, env="prod"))


async def test_a_patch_whose_real_answer_is_out_of_scope_is_bad_gateway(
    pair: CachedAndDirect,
) -> None:
    """The dry run answers in scope, the patch itself out of it: the patch was carried out
    (kcp has it), its answer is not forwarded."""
    pair.fake.faults.foreign_answers = "cluster"
    pair.fake.faults.foreign_dry_runs = False
    status, text = await _send(
        pair, pair.direct, "PATCH", _object_path(), {"ct": MERGE}, b'{"spec":{"size":7}}'
    )
    _assert_bad_gateway(status, text)
    assert "carried out" in json.loads(text)["message"]
    stored = pair.fake.get(cluster="c1", namespace="ns1", name=TARGET)
    assert stored is not None and stored["spec"]["size"] == 7


CREATES = [
    ("named", {"name": "new-w"}),
    ("generated", {"generateName": "gen-"}),
    ("generated-long", {"generateName": "g" * 70}),
    ("named-and-generated", {"name": "new-w", "generateName": "gen-"}),
]


@pytest.mark.parametrize("meta", [m for _, m in CREATES], ids=[i for i, _ in CREATES])
async def test_a_create_answered_out_of_scope_is_bad_gateway(
    pair: CachedAndDirect, meta: dict[str, str]
) -> None:
    """A create's answer: the name sent, or one generated from generateName (a prefix), in the
    URL's cluster and namespace."""
    body = widget("x", env="prod")
    body["metadata"] = {**{k: v for k, v in body["metadata"].items() if k != "name"}, **meta}
    for base in (pair.direct, pair.cached):
        for dry_run in ({}, {"dryRun": "All"}):
            status, text = await _send(
                pair,
                base,
                "POST",
                f"{API}/namespaces/ns1/widgets",
                dry_run,
                json.dumps(body).encode(),
            )
            assert status == 201, text  # in scope: answered as kcp answers
            if not dry_run and "name" in meta:
                pair.fake.delete(cluster="c1", namespace="ns1", name=meta["name"])
            for where in ("cluster", "namespace", "name"):
                pair.fake.faults.foreign_answers = where
                status, text = await _send(
                    pair,
                    base,
                    "POST",
                    f"{API}/namespaces/ns1/widgets",
                    dry_run,
                    json.dumps(body).encode(),
                )
                pair.fake.faults.foreign_answers = ""
                _assert_bad_gateway(status, text)
                if not dry_run and "name" in meta:
                    pair.fake.delete(cluster="c1", namespace="ns1", name=meta["name"])


async def test_deletecollection_answered_out_of_scope_is_bad_gateway(pair: CachedAndDirect) -> None:
    for base in (pair.direct, pair.cached):
        before = await out_of_scope_count(pair.session, base)
        pair.fake.faults.foreign_answers = "cluster"
        async with pair.session.delete(url(base, f"{API}/namespaces/ns1/widgets")) as r:
            status, text = r.status, await r.text()
        pair.fake.faults.foreign_answers = ""
        _assert_bad_gateway(status, text)
        assert await out_of_scope_count(pair.session, base) > before
        seed_c1(pair.fake)
    async with pair.session.delete(url(pair.direct, f"{API}/namespaces/ns1/widgets")) as r:
        assert r.status == 200, await r.text()
        assert names_in(await r.text()) == in_scope()


def seed_c1(fake: FakeUpstream) -> None:
    for i in range(3):
        name = name_of("c1", "ns1", i)
        if fake.get(cluster="c1", namespace="ns1", name=name) is None:
            fake.create(cluster="c1", obj=widget(name, env="prod"))


# --- apibindings -----------------------------------------------------------------------------

BINDINGS = "/apis/apis.kcp.io/v1alpha2/apibindings"


def _binding_clusters(entries: list[dict[str, Any]], *, table: bool) -> list[str]:
    objects = [e.get("object") for e in entries] if table else entries
    return [
        ((o or {}).get("metadata", {}).get("annotations") or {}).get("kcp.io/cluster", "?")
        for o in objects
    ]


APIBINDING_LISTS = [
    ("plain", None, {}),
    ("table", TABLE, {}),
    ("table-no-object", TABLE, {"includeObject": "None"}),
    ("pom-list", POM_LIST, {}),
]


@pytest.mark.parametrize(
    ("accept", "query"),
    [(a, q) for _, a, q in APIBINDING_LISTS],
    ids=[i for i, *_ in APIBINDING_LISTS],
)
async def test_apibindings_list_forwards_only_the_clusters_own(
    pair: CachedAndDirect, accept: str | None, query: dict[str, str]
) -> None:
    headers = {"Accept": accept} if accept else {}
    table = accept == TABLE
    for base in (pair.direct, pair.cached):
        status, text = await read(pair.session, url(base, BINDINGS), params=query, headers=headers)
        assert status == 200, text
        honest = json.loads(text)["rows" if table else "items"]
        pair.fake.faults.ignore_scope = True
        status, text = await read(pair.session, url(base, BINDINGS), params=query, headers=headers)
        pair.fake.faults.ignore_scope = False
        assert status == 200, text
        entries = json.loads(text)["rows" if table else "items"]
        assert len(entries) == len(honest) == 1, text
        if query.get("includeObject") == "None":
            assert all(e.get("object") is None for e in entries), text
        else:
            assert _binding_clusters(entries, table=table) == ["c1"], text
        # the wildcard cluster has every cluster's
        status, text = await read(
            pair.session, url(base, BINDINGS, cluster="*"), params=query, headers=headers
        )
        assert len(json.loads(text)["rows" if table else "items"]) == len(CLUSTERS), text
    assert await out_of_scope_count(pair.session, pair.direct) > 0


async def test_apibindings_yaml_list_forwards_only_the_clusters_own(pair: CachedAndDirect) -> None:
    pair.fake.faults.ignore_scope = True
    status, text = await read(pair.session, url(pair.direct, BINDINGS), headers={"Accept": YAML})
    assert status == 200, text
    assert "kcp.io/cluster: c1" in text and "kcp.io/cluster: c2" not in text, text


@pytest.mark.parametrize("accept", [None, TABLE, POM], ids=["object", "table", "pom"])
async def test_apibindings_get_of_another_clusters_is_missing(
    pair: CachedAndDirect, accept: str | None
) -> None:
    headers = {"Accept": accept} if accept else {}
    name = pair.fake.bind(cluster="c1")["metadata"]["name"]
    target = url(pair.direct, f"{BINDINGS}/{name}")
    status, text = await read(pair.session, target, headers=headers)
    assert status == 200 and '"kcp.io/cluster":"c1"' in text.replace(" ", ""), text
    pair.fake.faults.ignore_scope = True
    status, text = await read(pair.session, target, headers=headers)
    assert status == 404, text
    assert "c2" not in text, text


@pytest.mark.parametrize("accept", [None, TABLE], ids=["plain", "table"])
async def test_apibindings_watch_forwards_only_the_clusters_own(
    pair: CachedAndDirect, accept: str | None
) -> None:
    headers = {"Accept": accept} if accept else {}
    params = {"watch": "true", "timeoutSeconds": "1"}
    pair.fake.faults.ignore_scope = True
    status, text = await read(
        pair.session, url(pair.direct, BINDINGS), params=params, headers=headers
    )
    assert status == 200, text
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    objects = [e["object"] for e in events if e["type"] in ("ADDED", "MODIFIED", "DELETED")]
    if accept == TABLE:
        objects = [row["object"] for o in objects for row in o["rows"]]
    clusters = [o["metadata"]["annotations"]["kcp.io/cluster"] for o in objects]
    assert clusters == ["c1"], text
    assert await out_of_scope_count(pair.session, pair.direct) > 0


# --- an object leaving a slice: the release written by the proxy -------------------------------

__all__ = ["world"]  # the handoff tests' fixture (a slice that records holds)


@pytest.mark.parametrize("dry_runs", [True, False], ids=["dry-run", "release"])
async def test_a_release_answered_out_of_scope_is_bad_gateway(world: World, dry_runs: bool) -> None:
    """Through a slice the object is leaving, the one write left releases the slice's own
    finalizer (the client's write dry-run, then the proxy's JSON patch): an answer out of
    scope at either step is 502 — after the dry run nothing was written, after the patch it
    was."""
    shown = await leaving_a(world, "mover")
    release = json.loads(json.dumps(shown))
    release["metadata"]["finalizers"] = []
    world.fake.faults.foreign_answers = "cluster"
    world.fake.faults.foreign_dry_runs = dry_runs
    code, status = await world.call("PUT", world.url("a", "mover"), release)
    world.fake.faults.foreign_answers = ""
    assert code == 502, status
    assert status["kind"] == "Status" and "foreign" not in json.dumps(status), status
    finalizers = world.stored("mover")["metadata"].get("finalizers") or []
    assert bool(finalizers) is dry_runs, finalizers


# --- the rule itself -------------------------------------------------------------------------

_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=80)


def _meta(*, cluster: str, namespace: str, name: str) -> ObjectMeta:
    return ObjectMeta(name=name, namespace=namespace, annotations={"kcp.io/cluster": cluster})


@given(
    generate=_NAMES, suffix=st.text(alphabet="bcdfghjklmnpqrstvwxz2456789", min_size=5, max_size=5)
)
def test_a_generated_name_is_admitted_and_another_cluster_or_namespace_is_not(
    generate: str, suffix: str
) -> None:
    """What a create's answer may be: the name kcp generates from generateName (its base cut
    to 58 characters), in the request's cluster and namespace — nothing else."""
    scope = create_scope(
        Scope(cluster="c1", namespace="ns1"), {"metadata": {"generateName": generate}}
    )
    generated = generate[:58] + suffix
    assert scope.admits(_meta(cluster="c1", namespace="ns1", name=generated))
    assert not scope.admits(_meta(cluster="c2", namespace="ns1", name=generated))
    assert not scope.admits(_meta(cluster="c1", namespace="ns2", name=generated))
    assert not scope.admits(_meta(cluster="c1", namespace="ns1", name="." + generated))
    assert not scope.admits(ObjectMeta(name=generated, namespace="ns1"))  # no cluster at all


@given(name=_NAMES, generate=_NAMES, other=_NAMES)
def test_a_named_create_admits_that_name_only(name: str, generate: str, other: str) -> None:
    scope = create_scope(
        Scope(cluster="c1", namespace="ns1"),
        {"metadata": {"name": name, "generateName": generate}},
    )
    assert scope.admits(_meta(cluster="c1", namespace="ns1", name=name))
    assert scope.admits(_meta(cluster="c1", namespace="ns1", name=other)) is (other == name)
