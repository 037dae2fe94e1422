"""No existence oracle: through a slice, an object outside it answers exactly like a missing one.

For every verb x representation x query form the proxy accepts on a named object — GET and
HEAD (Accept JSON, YAML, protobuf, Table v1/v1beta1 with includeObject None/Metadata/Object,
PartialObjectMetadata, PartialObjectMetadataList; with resourceVersion, with ``watch=1``), the
status subresource, watches of one object (deprecated ``/watch/`` path, ``fieldSelector`` on the
collection, with initial events and bookmarks), PUT, PATCH (JSON, merge, strategic, apply YAML
and CBOR; with and without a resourceVersion precondition, dry run) and DELETE (no body, ``{}``,
uid-only and resourceVersion-only preconditions, with the object's real uid/resourceVersion or
made-up ones, dry run) — two requests are sent that differ only in the name: one names an object
that exists outside the slice (also one dressed up with members shaped like another
representation's: ``object``, ``rows``, ``spec.metadata`` with the slice's labels), the other a name that exists nowhere (of the same length). The
answers must be equal: status, Content-Type, the set of header names, and the body with the
name (and resourceVersions, which move) substituted. The object outside the slice must be
unchanged afterwards.

Not covered, on purpose: creating an object (POST, or server-side apply of a valid body to a
missing name, which creates it) answers AlreadyExists for a taken name in Kubernetes itself —
the name space of a namespace is shared, a slice cannot hide that. Apply bodies that the slice
refuses whatever the stored state (a label outside the slice, no fieldManager, malformed
metadata, a resourceVersion precondition) are covered.

Against the fake upstream (all cases, fast) and, for the cases marked ``kcp``, against real
kcp: the session's kcp and demo world (``tests/conftest.py``) and the in-process proxy of
``tests/e2e/test_proxy_kcp.py`` (slices ``prod``/``dev``, kcp-admin towards the virtual
workspace); ``-m e2e`` selects them, ``-m "not e2e"`` the fast half.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import yaml

from devenv.bootstrap import Bootstrap
from tests.e2e.test_proxy_kcp import Proxy, proxy
from tests.integration.conftest import Env, env
from tests.security.support import lookalike

__all__ = ["env", "proxy"]  # fixtures, imported so that pytest finds them here

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
TABLE_BETA = "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POM_BETA = "application/json;as=PartialObjectMetadata;v=v1beta1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"

# Header names whose values (or presence) legitimately differ between two requests.
_VOLATILE_HEADERS = frozenset({"date", "audit-id", "x-kubernetes-pf-flowschema-uid"})
_VOLATILE_HEADERS |= {"x-kubernetes-pf-prioritylevel-uid"}
_RV_JSON = re.compile(rb'"resourceVersion":\s*"[0-9]*"')
_RV_YAML = re.compile(rb"resourceVersion: \"?'?[0-9]*\"?'?")


@dataclass(frozen=True, slots=True)
class Target:
    """The object outside the slice: what an attacker may know of it (all of it)."""

    name: str
    namespace: str
    uid: str
    rv: str
    api_version: str = "example.io/v1alpha1"


Body = Callable[[str, Target], bytes]


def widget_body(*, labels: dict[str, str] | None = None, rv: str | None = None) -> Body:
    def build(name: str, t: Target) -> bytes:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": t.namespace,
            "labels": {"env": "prod"} if labels is None else labels,
        }
        if rv is not None:
            meta["resourceVersion"] = t.rv if rv == "real" else rv
        obj = {
            "apiVersion": t.api_version,
            "kind": "Widget",
            "metadata": meta,
            "spec": {"size": 3, "color": "blue"},
            "status": {"phase": "Probing"},
        }
        return json.dumps(obj).encode()

    return build


def raw(data: Any) -> Body:
    """A fixed body (JSON-encoded unless bytes); ``{rv}``/``{uid}`` strings are substituted."""

    def build(name: str, t: Target) -> bytes:
        text = data if isinstance(data, bytes) else json.dumps(data).encode()
        return text.replace(b"{rv}", t.rv.encode()).replace(b"{uid}", t.uid.encode())

    return build


def apply_body(**extra_meta: Any) -> Body:
    def build(name: str, t: Target) -> bytes:
        meta: dict[str, Any] = {"name": name, "namespace": t.namespace, **extra_meta}
        if meta.get("resourceVersion") == "real":
            meta["resourceVersion"] = t.rv
        if "metadata" in extra_meta:
            meta = extra_meta["metadata"]
        obj = {
            "apiVersion": t.api_version,
            "kind": "Widget",
            "metadata": meta,
            "spec": {"color": "green"},
        }
        return yaml.safe_dump(obj).encode()

    return build


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    method: str
    sub: str = ""
    accept: str | None = None
    query: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    body: Body | None = None
    form: str = "object"
    """object: .../widgets/<name>[/sub]; watch-path: the deprecated .../watch/.../<name>;
    field-watch / field-list: the collection with fieldSelector=metadata.name=<name>."""
    kcp: bool = False
    """Also run against real kcp."""
    streams: bool = False
    """A watch: the body is read until the server ends it (timeoutSeconds)."""


def _cases() -> list[Case]:
    cases: list[Case] = []
    read_accepts = {
        "none": None,
        "json": JSON,
        "yaml": YAML,
        "protobuf": PROTOBUF,
        "protobuf-json": f"{PROTOBUF}, {JSON}",
        "any": "*/*",
        "table": TABLE,
        "table-beta": TABLE_BETA,
        "pom": POM,
        "pom-beta": POM_BETA,
        "pom-list": POM_LIST,
        "table-or-json": f"{TABLE},{JSON}",
    }
    kcp_reads = {"none", "yaml", "protobuf", "table", "table-beta", "pom", "pom-list"}
    for sub in ("", "status"):
        for label, accept in read_accepts.items():
            queries: list[tuple[str, tuple[tuple[str, str], ...]]] = [
                ("", ()),
                ("rv0", (("resourceVersion", "0"),)),
                ("rv-real", (("resourceVersion", "{rv}"),)),
                ("watch", (("watch", "1"),)),
            ]
            if accept and "Table" in accept:
                queries += [
                    (f"include-{v}", (("includeObject", v),))
                    for v in ("None", "Metadata", "Object")
                ]
            for qlabel, query in queries:
                for method in ("GET", "HEAD"):
                    if method == "HEAD" and qlabel not in ("", "rv0"):
                        continue
                    cases.append(
                        Case(
                            id=f"{method}{'-status' if sub else ''}-{label}{'-' + qlabel if qlabel else ''}",
                            method=method,
                            sub=sub,
                            accept=accept,
                            query=query,
                            kcp=(
                                label in kcp_reads
                                and qlabel in ("", "include-None", "rv0")
                                and not sub
                            )
                            or (sub == "status" and label == "none" and qlabel == ""),
                        )
                    )
    # watches of one object
    watch_queries = {
        "plain": (("timeoutSeconds", "1"),),
        "initial-events": (
            ("timeoutSeconds", "1"),
            ("sendInitialEvents", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
        ),
        "rv0": (("timeoutSeconds", "1"), ("resourceVersion", "0")),
    }
    for form in ("watch-path", "field-watch"):
        for qlabel, query in watch_queries.items():
            full = (*query, ("watch", "1")) if form == "field-watch" else query
            for alabel, accept in (("json", None), ("table", TABLE), ("pom", POM)):
                cases.append(
                    Case(
                        id=f"WATCH-{form}-{qlabel}-{alabel}",
                        method="GET",
                        accept=accept,
                        query=full,
                        form=form,
                        streams=True,
                        kcp=alabel in ("json", "table") and qlabel != "rv0",
                    )
                )
    for alabel, accept in (
        ("json", None),
        ("table", TABLE),
        ("pom-list", POM_LIST),
        ("yaml", YAML),
    ):
        for qlabel, query in (("", ()), ("limit1", (("limit", "1"),))):
            cases.append(
                Case(
                    id=f"LIST-field-{alabel}{'-' + qlabel if qlabel else ''}",
                    method="GET",
                    accept=accept,
                    query=query,
                    form="field-list",
                    kcp=alabel in ("json", "table") and not qlabel,
                )
            )
    # PUT
    put_bodies: dict[str, Body] = {
        "plain": widget_body(),
        "rv-real": widget_body(rv="real"),
        "rv-stale": widget_body(rv="1"),
        "labels-outside": widget_body(labels={"env": "dev"}),
        "no-labels": widget_body(labels={}),
        "metadata-null": raw(
            {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "metadata": None}
        ),
        "not-json": raw(b"{not json"),
    }
    for sub in ("", "status"):
        for blabel, body in put_bodies.items():
            for qlabel, query in (
                ("", ()),
                ("dryrun", (("dryRun", "All"),)),
                ("fm", (("fieldManager", "probe"),)),
            ):
                cases.append(
                    Case(
                        id=f"PUT{'-status' if sub else ''}-{blabel}{'-' + qlabel if qlabel else ''}",
                        method="PUT",
                        sub=sub,
                        content_type=JSON,
                        body=body,
                        query=query,
                        kcp=qlabel == "dryrun" and blabel in ("plain", "rv-real", "metadata-null"),
                    )
                )
    # PATCH
    patches: dict[str, tuple[str, Body]] = {
        "json": (JSON_PATCH, raw([{"op": "replace", "path": "/spec/color", "value": "x"}])),
        "json-test-rv": (
            JSON_PATCH,
            raw(
                [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "{rv}"},
                    {"op": "replace", "path": "/spec/color", "value": "x"},
                ]
            ),
        ),
        "json-test-uid": (
            JSON_PATCH,
            raw([{"op": "test", "path": "/metadata/uid", "value": "{uid}"}]),
        ),
        "json-empty": (JSON_PATCH, raw([])),
        "json-relabel": (
            JSON_PATCH,
            raw([{"op": "replace", "path": "/metadata/labels/env", "value": "prod"}]),
        ),
        "json-rv-op": (
            JSON_PATCH,
            raw([{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}]),
        ),
        "json-malformed": (JSON_PATCH, raw({"op": "replace"})),
        "merge": (MERGE_PATCH, raw({"spec": {"color": "x"}})),
        "merge-rv-real": (MERGE_PATCH, raw({"metadata": {"resourceVersion": "{rv}"}})),
        "merge-rv-stale": (MERGE_PATCH, raw({"metadata": {"resourceVersion": "1"}})),
        "merge-labels-null": (MERGE_PATCH, raw({"metadata": {"labels": None}})),
        "merge-labels-outside": (MERGE_PATCH, raw({"metadata": {"labels": {"env": "dev"}}})),
        "merge-metadata-null": (MERGE_PATCH, raw({"metadata": None})),
        "merge-not-object": (MERGE_PATCH, raw([1])),
        "strategic": (STRATEGIC, raw({"spec": {"color": "x"}})),
        "apply-cbor": (APPLY_CBOR, raw(b"\xa0")),
        "unknown-type": ("application/x-unknown", raw({})),
    }
    # apply bodies that cannot create anything through the slice, whatever is stored
    apply_refused: dict[str, Body] = {
        "apply-labels-outside": apply_body(labels={"env": "dev"}),
        "apply-rv-real": apply_body(resourceVersion="real"),
        "apply-rv-stale": apply_body(resourceVersion="1"),
        "apply-metadata-null": apply_body(metadata=None),
        "apply-not-yaml": raw(b"{: ["),
    }
    for sub in ("", "status"):
        for plabel, (content_type, body) in patches.items():
            for qlabel, query in (("", ()), ("dryrun", (("dryRun", "All"),))):
                cases.append(
                    Case(
                        id=f"PATCH{'-status' if sub else ''}-{plabel}{'-' + qlabel if qlabel else ''}",
                        method="PATCH",
                        sub=sub,
                        content_type=content_type,
                        body=body,
                        query=query,
                        kcp=qlabel == "dryrun"
                        and plabel
                        in ("json", "json-test-rv", "merge", "merge-rv-real", "strategic"),
                    )
                )
        for plabel, body in apply_refused.items():
            for qlabel, query in (
                ("", (("fieldManager", "probe"),)),
                ("force", (("fieldManager", "probe"), ("force", "true"))),
                ("dryrun", (("fieldManager", "probe"), ("dryRun", "All"))),
            ):
                cases.append(
                    Case(
                        id=f"PATCH{'-status' if sub else ''}-{plabel}-{qlabel}",
                        method="PATCH",
                        sub=sub,
                        content_type=APPLY,
                        body=body,
                        query=query,
                        kcp=qlabel == "dryrun"
                        and plabel in ("apply-labels-outside", "apply-rv-real"),
                    )
                )
        # apply without a fieldManager is refused whatever is stored
        cases.append(
            Case(
                id=f"PATCH{'-status' if sub else ''}-apply-no-field-manager",
                method="PATCH",
                sub=sub,
                content_type=APPLY,
                body=apply_body(labels={"env": "prod"}),
                query=(("dryRun", "All"),),
                kcp=not sub,
            )
        )
    # the status subresource does not create: a valid apply must answer like a missing object
    cases.append(
        Case(
            id="PATCH-status-apply-valid",
            method="PATCH",
            sub="status",
            content_type=APPLY,
            body=apply_body(labels={"env": "prod"}),
            query=(("fieldManager", "probe"), ("dryRun", "All")),
            kcp=True,
        )
    )
    # DELETE
    delete_bodies: dict[str, Body | None] = {
        "no-body": None,
        "empty": raw({}),
        "uid-real": raw({"preconditions": {"uid": "{uid}"}}),
        "uid-other": raw({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}),
        "rv-real": raw({"preconditions": {"resourceVersion": "{rv}"}}),
        "rv-stale": raw({"preconditions": {"resourceVersion": "1"}}),
        "both-real": raw({"preconditions": {"uid": "{uid}", "resourceVersion": "{rv}"}}),
        "dryrun-body": raw({"dryRun": ["All"]}),
        "orphan": raw({"propagationPolicy": "Orphan"}),
        "bad-options": raw({"preconditions": "x"}),
    }
    for blabel, body in delete_bodies.items():
        for qlabel, query in (
            ("", ()),
            ("dryrun", (("dryRun", "All"),)),
            ("grace0", (("gracePeriodSeconds", "0"),)),
        ):
            cases.append(
                Case(
                    id=f"DELETE-{blabel}{'-' + qlabel if qlabel else ''}",
                    method="DELETE",
                    content_type=JSON if body is not None else None,
                    body=body,
                    query=query,
                    kcp=qlabel == "dryrun"
                    and blabel in ("no-body", "uid-real", "rv-real", "both-real"),
                )
            )
    cases.append(Case(id="DELETE-status", method="DELETE", sub="status", kcp=True))
    return cases


CASES = _cases()


@dataclass
class Answer:
    status: int
    content_type: str
    header_names: frozenset[str]
    content_length: str | None
    body: bytes
    raw_headers: dict[str, str] = field(default_factory=dict)


async def ask(
    session: aiohttp.ClientSession,
    base: str,
    case: Case,
    name: str,
    target: Target,
    *,
    resource: str = "widgets",
) -> Answer:
    """Send ``case`` for ``name``; ``base`` is the slice URL of the group/version
    (``.../clusters/<id>/apis/example.io/v1alpha1``)."""
    ns = target.namespace
    query = [(k, v.replace("{rv}", target.rv)) for k, v in case.query]
    if case.form == "object":
        url = f"{base}/namespaces/{ns}/{resource}/{name}" + (f"/{case.sub}" if case.sub else "")
    elif case.form == "watch-path":
        url = f"{base}/watch/namespaces/{ns}/{resource}/{name}"
    else:
        url = f"{base}/namespaces/{ns}/{resource}"
        query.append(("fieldSelector", f"metadata.name={name}"))
    headers = {}
    if case.accept is not None:
        headers["Accept"] = case.accept
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    data = case.body(name, target) if case.body is not None else None
    async with session.request(
        case.method,
        url,
        params=query,
        headers=headers,
        data=data,
        skip_auto_headers=("Accept", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=15),
    ) as response:
        body = await response.read()
        return Answer(
            status=response.status,
            content_type=response.headers.get("Content-Type", ""),
            header_names=frozenset(
                h.lower() for h in response.headers if h.lower() not in _VOLATILE_HEADERS
            ),
            content_length=response.headers.get("Content-Length"),
            body=body,
            raw_headers=dict(response.headers),
        )


_INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def without_progress_bookmarks(body: bytes) -> bytes:
    """A watch stream without its periodic BOOKMARK events.

    With ``allowWatchBookmarks`` a watch gets a BOOKMARK whenever the server's own stream
    passes one (kcp sends one about every minute): one of two concurrent one-second watches can
    get it and the other not. Such an event is an object with only a resourceVersion — it tells
    nothing about any object — so it is not compared; the ``initial-events-end`` BOOKMARK (part
    of the answer to ``sendInitialEvents``) and every other line still are.
    """
    kept = []
    for line in body.splitlines(keepends=True):
        try:
            event = json.loads(line)
        except ValueError:
            kept.append(line)
            continue
        annotations = (
            ((event.get("object") or {}).get("metadata") or {}).get("annotations") or {}
            if isinstance(event, dict)
            else {}
        )
        progress = (
            isinstance(event, dict)
            and event.get("type") == "BOOKMARK"
            and annotations.get(_INITIAL_EVENTS_END) != "true"
        )
        if not progress:
            kept.append(line)
    return b"".join(kept)


def normalized(answer: Answer, name: str, *, streams: bool = False) -> bytes:
    body = answer.body.replace(name.encode(), b"<NAME>")
    if streams:
        body = without_progress_bookmarks(body)
    body = _RV_JSON.sub(b'"resourceVersion":"<RV>"', body)
    return _RV_YAML.sub(b"resourceVersion: <RV>", body)


def compare(case: Case, foreign: Answer, missing: Answer, names: tuple[str, str]) -> list[str]:
    problems = []
    if foreign.status != missing.status:
        problems.append(
            f"status {foreign.status} (outside the slice) != {missing.status} (missing)"
        )
    if foreign.content_type != missing.content_type:
        problems.append(f"Content-Type {foreign.content_type!r} != {missing.content_type!r}")
    if foreign.header_names != missing.header_names:
        problems.append(
            f"headers {sorted(foreign.header_names ^ missing.header_names)} only on one side"
        )
    if not case.streams and foreign.content_length != missing.content_length:
        problems.append(f"Content-Length {foreign.content_length} != {missing.content_length}")
    if normalized(foreign, names[0], streams=case.streams) != normalized(
        missing, names[1], streams=case.streams
    ):
        problems.append(
            f"bodies differ:\n    outside: {foreign.body[:400]!r}\n    missing: {missing.body[:400]!r}"
        )
    if problems:
        problems.insert(
            0,
            f"{case.method} {case.sub or ''} form={case.form} Accept={case.accept!r} "
            f"query={list(case.query)} Content-Type={case.content_type!r} "
            f"body={case.body(names[0], _PLACEHOLDER) if case.body else None!r}",
        )
    return problems


_PLACEHOLDER = Target(name="<name>", namespace="<ns>", uid="<uid>", rv="<rv>")


# --- against the fake upstream -----------------------------------------------------------

FOREIGN, MISSING = "w1", "w9"  # w1: env=dev, ns1, cluster c1 (tests/integration/conftest.py)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_outside_the_slice_answers_like_missing(env: Env, case: Case) -> None:
    await _answers_like_missing(env, case)


LOOKALIKE_CASES = [c for c in CASES if c.method in ("GET", "HEAD")]


@pytest.mark.parametrize("case", LOOKALIKE_CASES, ids=[c.id for c in LOOKALIKE_CASES])
async def test_a_lookalike_outside_the_slice_answers_like_missing(env: Env, case: Case) -> None:
    """The object outside the slice carries members shaped like another representation's (a
    top-level ``object``, ``rows``, ``spec.metadata``) with the slice's labels and the holds
    annotation's name: its own metadata is what is judged, in every representation."""
    stored = env.fake.get(cluster="c1", namespace="ns1", name=FOREIGN)
    assert stored is not None
    env.fake.update(cluster="c1", obj={**stored, **lookalike(FOREIGN, "ns1")})
    await _answers_like_missing(env, case)


async def _answers_like_missing(env: Env, case: Case) -> None:
    stored = env.fake.get(cluster="c1", namespace="ns1", name=FOREIGN)
    assert stored is not None and stored["metadata"]["labels"]["env"] == "dev"
    assert env.fake.get(cluster="c1", namespace="ns1", name=MISSING) is None
    target = Target(
        name=FOREIGN,
        namespace="ns1",
        uid=stored["metadata"]["uid"],
        rv=stored["metadata"]["resourceVersion"],
    )
    base = env.slice_url("prod", "c1") + "/apis/example.io/v1alpha1"
    foreign, missing = await asyncio.gather(
        ask(env.session, base, case, FOREIGN, target),
        ask(env.session, base, case, MISSING, target),
    )
    problems = compare(case, foreign, missing, (FOREIGN, MISSING))
    after = env.fake.get(cluster="c1", namespace="ns1", name=FOREIGN)
    if after != stored:
        problems.append(f"the object outside the slice changed: {stored} -> {after}")
    assert not problems, "\n  ".join(problems)


def test_only_progress_bookmarks_are_left_out_of_compared_streams() -> None:
    end = {"metadata": {"resourceVersion": "7", "annotations": {_INITIAL_EVENTS_END: "true"}}}
    lines = [
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}},
        {"type": "BOOKMARK", "object": end},
        {"type": "ADDED", "object": {"metadata": {"name": "x"}}},
    ]
    body = b"".join(json.dumps(e).encode() + b"\n" for e in lines)
    assert without_progress_bookmarks(body) == b"".join(
        json.dumps(e).encode() + b"\n" for e in lines[1:]
    )


def test_cases_cover_the_matrix() -> None:
    """The matrix is what the module docstring says (a guard against silently lost cases)."""
    methods = {(c.method, c.sub, c.form) for c in CASES}
    for wanted in [
        ("GET", "", "object"),
        ("GET", "status", "object"),
        ("HEAD", "", "object"),
        ("HEAD", "status", "object"),
        ("GET", "", "watch-path"),
        ("GET", "", "field-watch"),
        ("GET", "", "field-list"),
        ("PUT", "", "object"),
        ("PUT", "status", "object"),
        ("PATCH", "", "object"),
        ("PATCH", "status", "object"),
        ("DELETE", "", "object"),
        ("DELETE", "status", "object"),
    ]:
        assert wanted in methods
    patch_types = {c.content_type for c in CASES if c.method == "PATCH"}
    assert {JSON_PATCH, MERGE_PATCH, STRATEGIC, APPLY, APPLY_CBOR} <= patch_types
    accepts = {c.accept for c in CASES if c.method == "GET"}
    assert {None, JSON, YAML, PROTOBUF, TABLE, TABLE_BETA, POM, POM_BETA, POM_LIST} <= accepts
    assert len({c.id for c in CASES}) == len(CASES)
    assert sum(c.kcp for c in CASES) >= 40


# --- against real kcp ------------------------------------------------------------------------

KCP_CASES = [c for c in CASES if c.kcp]
KCP_FOREIGN, KCP_MISSING = "dev-eu", "zzz-eu"  # the bootstrap's env=dev widget; nothing
KCP_NAMESPACE = "team-red"


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("case", KCP_CASES, ids=[c.id for c in KCP_CASES])
async def test_outside_the_slice_answers_like_missing_on_kcp(
    proxy: Proxy, world: Bootstrap, case: Case
) -> None:
    ws = world.consumer("consumer-a")
    kcp = proxy.kcp
    direct = f"{ws.url}/apis/example.io/v1alpha1/namespaces/{KCP_NAMESPACE}/widgets"
    async with kcp.http_session() as admin:
        async with admin.get(f"{direct}/{KCP_FOREIGN}") as r:
            assert r.status == 200, await r.text()
            stored = await r.json()
        async with admin.get(f"{direct}/{KCP_MISSING}") as r:
            assert r.status == 404
    assert stored["metadata"]["labels"]["env"] == "dev"
    target = Target(
        name=KCP_FOREIGN,
        namespace=KCP_NAMESPACE,
        uid=stored["metadata"]["uid"],
        rv=stored["metadata"]["resourceVersion"],
    )
    base = proxy.url("prod", ws.cluster) + "/apis/example.io/v1alpha1"
    async with aiohttp.ClientSession() as session:
        foreign, missing = await asyncio.gather(
            ask(session, base, case, KCP_FOREIGN, target),
            ask(session, base, case, KCP_MISSING, target),
        )
    problems = compare(case, foreign, missing, (KCP_FOREIGN, KCP_MISSING))
    async with kcp.http_session() as admin, admin.get(f"{direct}/{KCP_FOREIGN}") as r:
        after = await r.json()
    if after["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
        problems.append(f"the object outside the slice changed: {stored} -> {after}")
    async with kcp.http_session() as admin, admin.get(f"{direct}/{KCP_MISSING}") as r:
        if r.status != 404:
            problems.append(f"the missing name now exists ({r.status})")
    assert not problems, "\n  ".join(problems)
