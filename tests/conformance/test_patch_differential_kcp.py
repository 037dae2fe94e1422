"""Merge patches and JSON patches applied by :mod:`vwserver.proxy.patches` against kcp's own result.

Random documents (hypothesis, derandomized) are written to real objects through kcp's APIExport
virtual workspace — ``blobs`` of the shapes export (:mod:`tests.support.shapes`, every field
preserved) and the demo's ``widgets`` (a declared schema: unknown fields pruned, ``status`` a
subresource, ``spec.size >= 0``) — and a random patch, valid or not (missing paths, bad and
negative indices, ``-``, failing ``test``s, type mismatches, nested nulls, arrays), is sent to
each with ``dryRun=All``. The same patch is applied locally to the object kcp answered for the
write (what the proxy holds). Then:

* both applied it: the objects are equal, apart from what the server sets
  (``resourceVersion``, ``managedFields``, ``generation``) and, for widgets, what the schema
  prunes and the status subresource keeps (the test prunes the local result the same way);
* kcp refused it: the module refuses it with the same code (and, for refusals of the patch
  mechanism, the same message) — or the module's result, sent to kcp as a ``dryRun=All``
  update, is refused with the same code (kcp's validation of the result, which the real write
  meets anyway);
* kcp applied it and the module refused it: never.

Size: ``VWSERVER_PATCH_EXAMPLES`` cases of each kind (merge / JSON) per resource, default 100
(400 cases, two requests each, a third when kcp's validation refuses the result); the full
length is 2500 (10,000 cases).

A second test shows the admission fact of :data:`vwserver.proxy.patches.ADMISSION` on kcp.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from devenv.bootstrap import Bootstrap, poll
from devenv.kcp import KcpInstance
from tests.support.admission import PROBE, mutating_policy
from tests.support.properties import bounded_settings
from tests.support.shapes import API as SHAPES_API
from tests.support.shapes import shapes_world
from tests.support.widgets import API as WIDGETS_API
from tests.support.widgets import make_namespace, remove_namespace
from vwserver.proxy.patches import PatchError, PatchPanic, apply_json_patch, apply_merge_patch

EXAMPLES = int(os.environ.get("VWSERVER_PATCH_EXAMPLES", "100"))
NS = "patch-differential"
SLOTS = 6  # objects per resource, written concurrently
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
SERVER_SET = ("resourceVersion", "managedFields", "generation")
DISCONNECTED = 0  # the "status" of a request kcp answered by closing the connection
_encoder = msgspec.json.Encoder()

# -- documents -----------------------------------------------------------------------------

_KEYS = st.sampled_from(["a", "b", "c", "<", "~", "/", "0", "1", "-", "", "x y"])
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(-(2**70), 2**70),
    st.sampled_from([1.5, 1e21, 1e-7, 0.5, 2.0, -0.0, 1e20, 1e-5, 123.456]),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from(["x", "a<b", "&", "\u2028", "\x01", "é", "", "1", "\\", '"']),
    st.text(max_size=3),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=8,
)
# Root members of a blob: anything but the object's own head, and no "items" (the apiserver's
# unstructured decoder would take the object for a list: tests/support/shapes.py).
_ROOT_KEYS = st.sampled_from(["spec", "data", "a", "b", "<", "~", "/", "0", "-"])
_LABEL_KEYS = st.sampled_from(["env", "app", "tier", "b.example.io/x"])
_BAD_LABEL_KEYS = st.sampled_from(["Bad Key", "kcp.io/x", "-x"])
_LABEL_VALUES = st.sampled_from(["prod", "dev", "", "a.b-c", "x"])
_BAD_LABEL_VALUES = st.sampled_from(["a b", "x" * 64, "-x"])
_ANNOTATION_KEYS = st.sampled_from(
    ["note", "example.io/a", "sync.edge-connect.eu/holds", "kcp.io/path"]
)
_FINALIZERS = st.sampled_from(["example.io/f", "example.io/g", "kubernetes", "orphan"])


@st.composite
def _metadata(draw: st.DrawFn) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if draw(st.booleans()):
        meta["labels"] = draw(st.dictionaries(_LABEL_KEYS, _LABEL_VALUES, max_size=3))
    if draw(st.booleans()):
        keys = _ANNOTATION_KEYS.filter(lambda k: k != "kcp.io/path")
        meta["annotations"] = draw(st.dictionaries(keys, st.text(max_size=4), max_size=2))
    if draw(st.booleans()):
        meta["finalizers"] = draw(st.lists(_FINALIZERS, max_size=3))
    return meta


def _blob_docs() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda meta, root: {"metadata": meta, **root},
        _metadata(),
        st.dictionaries(_ROOT_KEYS, _VALUES, max_size=3),
    )


_SIZES = st.one_of(st.integers(0, 5), st.just(2**40))


def _widget_docs() -> st.SearchStrategy[dict[str, Any]]:
    spec = st.fixed_dictionaries({}, optional={"size": _SIZES, "color": st.text(max_size=3)})
    return st.builds(lambda meta, s: {"metadata": meta, "spec": s}, _metadata(), spec)


# -- patches -------------------------------------------------------------------------------


def _paths(value: Any, prefix: str = "") -> list[str]:
    out = [prefix]
    if isinstance(value, dict):
        for key, member in value.items():
            token = key.replace("~", "~0").replace("/", "~1")
            out += _paths(member, f"{prefix}/{token}")
    elif isinstance(value, list):
        for i, member in enumerate(value):
            out += _paths(member, f"{prefix}/{i}")
    return out


_META_PATHS = [
    "/metadata/labels",
    "/metadata/annotations",
    "/metadata/finalizers",
    "/metadata/finalizers/-",
    "/metadata/finalizers/0",
    "/metadata/finalizers/-1",
    "/metadata/labels/env",
    "/metadata/labels/b.example.io~1x",
    "/metadata/annotations/kcp.io~1path",
    "/metadata/annotations/note",
    "/metadata/foo",
    "/spec/size",
    "/spec/color",
    "/status/phase",
]
_TAILS = st.one_of(
    st.just(""),
    st.just(""),
    st.just(""),
    st.sampled_from(
        ["/a", "/-", "/0", "/1", "/-1", "/-2", "/01", "/+1", "/9", "/x", "/~0", "/~1", "/b/c"]
    ),
)
# What the proxy refuses before kcp sees it (vwserver.proxy.writes._check_json_patch), or what
# makes the object another one: never generated.
_NEVER = ("", "/metadata", "/metadata/resourceVersion", "/metadata/name", "/metadata/namespace")


def _metadata_values(path: str) -> st.SearchStrategy[Any]:
    if path.startswith("/metadata/labels/"):
        return st.one_of(_LABEL_VALUES, _BAD_LABEL_VALUES, _VALUES)
    if path == "/metadata/labels":
        return st.one_of(
            st.dictionaries(st.one_of(_LABEL_KEYS, _BAD_LABEL_KEYS), _LABEL_VALUES, max_size=2),
            _VALUES,
        )
    if path.startswith("/metadata/finalizers"):
        return st.one_of(_FINALIZERS, st.lists(_FINALIZERS, max_size=2), _VALUES)
    if path.startswith("/metadata/annotations/"):
        return st.one_of(st.text(max_size=4), _VALUES)
    if path == "/spec/size":
        return st.one_of(_SIZES, st.just(-1), _VALUES)
    return _VALUES


def _at(doc: Any, path: str) -> Any:
    for token in path.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


@st.composite
def _json_patches(draw: st.DrawFn, doc: dict[str, Any]) -> list[dict[str, Any]]:
    known = [p for p in _paths(doc) if p not in _NEVER and not p.startswith("/metadata/name")]
    known += _META_PATHS
    ops: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(known)) + draw(_TAILS)
        if path in _NEVER:
            path = "/a"
        kind = draw(st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "test"]))
        op: dict[str, Any] = {"op": kind, "path": path}
        if kind in ("move", "copy"):
            source = draw(st.sampled_from(known)) + draw(st.sampled_from(["", "", "/a", "/-1"]))
            op["from"] = "/a" if source in _NEVER else source
        if kind in ("add", "replace", "test") and draw(st.integers(0, 9)) > 0:
            if kind == "test" and draw(st.integers(0, 3)) > 0:
                try:
                    op["value"] = copy.deepcopy(_at(doc, path))
                except (KeyError, IndexError, ValueError, TypeError):
                    op["value"] = draw(_VALUES)
            else:
                op["value"] = draw(_metadata_values(path))
        ops.append(op)
    return ops


@st.composite
def _merge_patches(draw: st.DrawFn) -> dict[str, Any]:
    patch: dict[str, Any] = draw(st.dictionaries(_ROOT_KEYS, _VALUES, max_size=3))
    meta: dict[str, Any] = {}
    if draw(st.booleans()):
        labels = st.one_of(_LABEL_VALUES, st.none(), _BAD_LABEL_VALUES)
        meta["labels"] = draw(
            st.one_of(st.none(), st.dictionaries(_LABEL_KEYS, labels, max_size=2))
        )
    if draw(st.booleans()):
        values = st.one_of(st.text(max_size=3), st.none())
        meta["annotations"] = draw(
            st.one_of(st.none(), st.dictionaries(_ANNOTATION_KEYS, values, max_size=2))
        )
    if draw(st.booleans()):
        meta["finalizers"] = draw(st.one_of(st.none(), st.lists(_FINALIZERS, max_size=2)))
    if draw(st.integers(0, 9)) == 0:
        meta["foo"] = draw(_VALUES)
    if meta or draw(st.integers(0, 9)) == 0:
        patch["metadata"] = meta
    if draw(st.booleans()):
        spec = st.fixed_dictionaries(
            {}, optional={"size": st.one_of(_SIZES, st.none(), st.just(-1)), "x": _VALUES}
        )
        patch["spec"] = draw(st.one_of(spec, _VALUES))
    if draw(st.integers(0, 4)) == 0:
        patch["status"] = draw(st.one_of(st.none(), st.fixed_dictionaries({"phase": _VALUES})))
    return patch


# -- cases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    resource: str  # blobs | widgets
    doc: dict[str, Any]
    content_type: str
    patch: Any


def _cases() -> list[Case]:
    cases: list[Case] = []
    for resource, docs in (("blobs", _blob_docs()), ("widgets", _widget_docs())):

        @bounded_settings(EXAMPLES)
        @given(st.just(resource), docs, st.data())
        def json_cases(resource: str, doc: dict[str, Any], data: st.DataObject) -> None:
            cases.append(Case(resource, doc, JSON_PATCH, data.draw(_json_patches(doc))))

        @bounded_settings(EXAMPLES)
        @given(st.just(resource), docs, _merge_patches())
        def merge_cases(resource: str, doc: dict[str, Any], patch: Any) -> None:
            cases.append(Case(resource, doc, MERGE_PATCH, patch))

        json_cases()
        merge_cases()
    return cases


# -- the objects ---------------------------------------------------------------------------


@dataclass
class Slot:
    """One object that cases are written to, one after another."""

    url: str
    collection: str
    body: dict[str, Any]
    resource_version: str = ""


@dataclass
class Outcome:
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    differences: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class World:
    session: aiohttp.ClientSession
    base: dict[str, str]  # resource -> collection URL in NS


@pytest_asyncio.fixture(loop_scope="session")
async def patch_world(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[World]:
    shapes = await shapes_world(kcp, world)
    consumer = world.consumers[0]
    await make_namespace(kcp, [consumer], NS)
    base = {
        "blobs": f"{shapes.vw_url}/clusters/{consumer.cluster}/{SHAPES_API}/namespaces/{NS}/blobs",
        "widgets": f"{world.vw_url}/clusters/{consumer.cluster}/{WIDGETS_API}/namespaces/{NS}"
        "/widgets",
    }
    try:
        async with kcp.http_session(timeout=60) as session:
            yield World(session=session, base=base)
            for collection in base.values():  # no finalizer may keep the namespace
                async with session.get(collection) as resp:
                    items = (await resp.json()).get("items", [])
                for item in items:
                    release = {"metadata": {"finalizers": None}}
                    url = f"{collection}/{item['metadata']['name']}"
                    async with session.patch(
                        url, data=_encoder.encode(release), headers={"Content-Type": MERGE_PATCH}
                    ) as resp:
                        assert resp.status == 200, await resp.text()
    finally:
        await remove_namespace(kcp, [consumer], NS)


async def _call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any,
    *,
    content_type: str = "application/json",
    dry_run: bool = False,
) -> tuple[int, Any]:
    params = {"dryRun": "All"} if dry_run else {}
    try:
        async with session.request(
            method,
            url,
            params=params,
            data=_encoder.encode(body),
            headers={"Content-Type": content_type},
        ) as resp:
            raw = await resp.read()
    except aiohttp.ServerDisconnectedError as e:
        # kcp's answer to a panic in its handler: the connection closed, no response at all.
        return DISCONNECTED, str(e)
    try:
        return resp.status, msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return resp.status, raw.decode(errors="replace")


def _head(resource: str) -> dict[str, str]:
    if resource == "blobs":
        return {"apiVersion": "shapes.example.io/v1", "kind": "Blob"}
    return {"apiVersion": "example.io/v1alpha1", "kind": "Widget"}


async def _make_slots(w: World) -> dict[str, list[Slot]]:
    slots: dict[str, list[Slot]] = {}
    for resource, collection in w.base.items():
        slots[resource] = []
        for i in range(SLOTS):
            name = f"p{i}"
            body = {**_head(resource), "metadata": {"name": name, "namespace": NS}}
            status, answer = await _call(w.session, "POST", collection, body)
            if status == 409:
                status, answer = await _call(w.session, "GET", f"{collection}/{name}", None)
            assert status in (200, 201), answer
            slot = Slot(url=f"{collection}/{name}", collection=collection, body=body)
            slot.resource_version = answer["metadata"]["resourceVersion"]
            slots[resource].append(slot)
    return slots


# -- comparing -----------------------------------------------------------------------------


def _comparable(obj: Any) -> Any:
    obj = copy.deepcopy(obj)
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
        for key in SERVER_SET:
            obj["metadata"].pop(key, None)
    return obj


_WIDGET_ROOT = ("apiVersion", "kind", "metadata", "spec", "status")
_OBJECT_META = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
    "selfLink",
)


_WIDGET_FIELDS = {"spec": ("size", "color"), "status": ("phase",)}
_OMITTED_WHEN_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences", "managedFields")


def _as_kcp_stores(resource: str, result: Any, stored: dict[str, Any]) -> Any:
    """The local result as kcp keeps it: ObjectMeta drops members it does not know, members
    that are null and empty maps and lists (``omitempty``); for widgets the schema prunes
    unknown fields and nulls (no field is nullable), and the main resource keeps the stored
    status (status subresource)."""
    result = copy.deepcopy(result)
    meta = result.get("metadata")
    if isinstance(meta, dict):
        result["metadata"] = {
            k: v
            for k, v in meta.items()
            if k in _OBJECT_META
            and v is not None
            and not (k in _OMITTED_WHEN_EMPTY and v == {})
            and not (k in _OMITTED_WHEN_EMPTY and v == [])
        }
    if resource == "widgets":
        result = {k: v for k, v in result.items() if k in _WIDGET_ROOT and v is not None}
        for name, known in _WIDGET_FIELDS.items():
            part = result.get(name)
            if isinstance(part, dict):
                result[name] = {k: v for k, v in part.items() if k in known and v is not None}
        if "status" in stored:
            result["status"] = stored["status"]
        else:
            result.pop("status", None)
    return result


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON texts read back (1 and 1.0 differ; key order does not matter)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _differing(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(a.keys() | b.keys()):
            if key not in a or key not in b:
                out.append(f"{path}/{key}")
            else:
                out += _differing(a[key], b[key], f"{path}/{key}")
        return out
    return [] if _same(a, b) else [path or "/"]


def _local(case: Case, stored: dict[str, Any]) -> Any:
    if case.content_type == JSON_PATCH:
        return apply_json_patch(stored, case.patch)
    return apply_merge_patch(stored, case.patch)


async def _run_case(w: World, slot: Slot, case: Case, outcome: Outcome) -> None:
    body = copy.deepcopy(case.doc)
    body.update(_head(case.resource))
    body["metadata"] = {
        **body["metadata"],
        "name": slot.body["metadata"]["name"],
        "namespace": NS,
        "resourceVersion": slot.resource_version,
    }
    status, stored = await _call(w.session, "PUT", slot.url, body)
    assert status == 200, f"PUT {slot.url}: {status} {stored}"
    slot.resource_version = stored["metadata"]["resourceVersion"]

    status, answer = await _call(
        w.session, "PATCH", slot.url, case.patch, content_type=case.content_type, dry_run=True
    )
    where = f"{case.resource} {case.content_type} doc={stored!r} patch={case.patch!r}"
    try:
        local = _local(case, stored)
        refused: PatchError | None = None
    except PatchError as e:
        local, refused = None, e

    if status == 200 and refused is None:
        expected = _comparable(_as_kcp_stores(case.resource, local, stored))
        actual = _comparable(answer)
        if _same(expected, actual):
            outcome.counts["applied: same object"] += 1
            return
        paths = _differing(expected, actual)
        membership = [
            p
            for p in paths
            if p.startswith(("/metadata/labels", "/metadata/annotations", "/metadata/finalizers"))
        ]
        known = [p for p in paths if p == "/metadata/annotations/kcp.io/path"]
        for p in paths:
            outcome.differences[p] += 1
        if membership and membership == known:
            # pathannotation admission: kcp rewrites a kcp.io/path annotation that is present.
            outcome.counts["applied: kcp.io/path rewritten by kcp admission"] += 1
            return
        outcome.failures.append(
            f"different objects at {paths}: kcp {actual!r} local {expected!r}; {where}"
        )
        return
    if status == 200:
        assert refused is not None
        outcome.failures.append(f"kcp applied, module refused {refused.code} {refused}; {where}")
        return
    kcp_message = answer.get("message") if isinstance(answer, dict) else answer
    if refused is not None:
        if isinstance(refused, PatchPanic) and status == DISCONNECTED:
            outcome.counts["kcp's library panics (connection closed); module: PatchPanic"] += 1
        elif refused.also is not None and status in (refused.code, DISCONNECTED):
            outcome.counts["refused by both: 422 or panic, as Go's map order falls"] += 1
        elif refused.code != status:
            outcome.failures.append(
                f"codes differ: kcp {status} {kcp_message!r}, module {refused.code} {refused}; "
                f"{where}"
            )
        elif refused.message != kcp_message and not (
            _DECODING in refused.message
            and _DECODING in str(kcp_message)
            and _tail(refused.message) == _tail(kcp_message)
        ):
            outcome.failures.append(
                f"messages differ: kcp {kcp_message!r}, module {refused.message!r}; {where}"
            )
        else:
            outcome.counts[f"refused by both: {status}"] += 1
        return
    # kcp refused a patch the module applied: kcp's validation of the result. The local result,
    # written over the whole object by one JSON patch (the same decoding and validation as the
    # patch's), must be refused the same way.
    update = copy.deepcopy(local)
    update["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
    again, again_answer = await _call(
        w.session,
        "PATCH",
        slot.url,
        [{"op": "replace", "path": "", "value": update}],
        content_type=JSON_PATCH,
        dry_run=True,
    )
    again_message = again_answer.get("message") if isinstance(again_answer, dict) else ""
    if again == status and _same_refusal(again_message, kcp_message):
        outcome.counts[f"result refused by kcp's validation: {status}"] += 1
    else:
        outcome.failures.append(
            f"kcp refused the patch with {status} {kcp_message!r} but its local result with "
            f"{again} {again_message!r}; {where}"
        )


_DECODING = ' "" is invalid: patch: Invalid value: '
"""kcp's 422 for a patched object it cannot decode; it quotes the patched JSON, whose text
(member order inside patch values) the module does not reproduce exactly."""


def _same_refusal(a: Any, b: Any) -> bool:
    """The same errors, in any order (kcp's validation walks maps in Go's random order)."""

    def errors(message: Any) -> list[str]:
        listed = str(message).partition(" is invalid: ")[2].strip("[]")
        return sorted(e.removeprefix("metadata.") for e in listed.split(", metadata."))

    return _tail(a) == _tail(b) or errors(a) == errors(b)


def _tail(message: Any) -> str:
    """A refusal's message without the patched object's text (which kcp quotes)."""
    return str(message).rpartition('": ')[2]


async def _run_slot(w: World, slot: Slot, cases: list[Case], outcome: Outcome) -> None:
    for case in cases:
        await _run_case(w, slot, case, outcome)


@pytest.mark.timeout(3600)
async def test_patches_applied_like_kcp(patch_world: World) -> None:
    cases = _cases()
    slots = await _make_slots(patch_world)
    outcome = Outcome()
    work = []
    for resource, mine in slots.items():
        ours = [c for c in cases if c.resource == resource]
        work += [
            _run_slot(patch_world, slot, ours[i :: len(mine)], outcome)
            for i, slot in enumerate(mine)
        ]
    await asyncio.gather(*work)
    print(f"\n{len(cases)} cases: {dict(outcome.counts)}")
    print(f"differences (path: count): {dict(outcome.differences)}")
    kinds = Counter(f.partition(":")[0] for f in outcome.failures)
    assert not outcome.failures, (
        f"{len(outcome.failures)} of {len(cases)} cases differ ({dict(kinds)}):\n"
        + "\n".join(outcome.failures[:15])
    )
    assert sum(outcome.counts.values()) == len(cases)
    # Both kinds of outcome occur: the test can tell applying from refusing.
    assert outcome.counts["applied: same object"] > len(cases) // 10
    assert sum(n for k, n in outcome.counts.items() if k.startswith("refused")) > len(cases) // 10


# -- admission --------------------------------------------------------------------------------


def _mutating_policy(name: str) -> str:
    """A policy that adds a label, an annotation and a finalizer named after ``name``."""
    return mutating_policy(
        name,
        labels={f"mutated-by-{name}": "yes"},
        annotations={f"note-{name}": "x"},
        finalizers=[f"example.io/{name}"],
    )


async def test_mutating_admission_of_the_export_workspace_changes_what_a_patch_stores(
    kcp: KcpInstance, world: Bootstrap
) -> None:
    """The fact behind :data:`vwserver.proxy.patches.ADMISSION`: a MutatingAdmissionPolicy in
    the APIExport's (provider's) workspace changes labels, annotations and finalizers of a
    consumer's object patched through the APIExport VW — the local result is not kcp's then;
    the same policy in the consumer's workspace does not apply to the bound resource."""
    consumer = world.consumers[0]
    sample = next(w for w in world.widgets if w.cluster == consumer.cluster)
    url = (
        f"{world.vw_url}/clusters/{consumer.cluster}/{WIDGETS_API}/namespaces/"
        f"{sample.namespace}/widgets/{sample.name}"
    )
    patch = {"metadata": {"labels": {PROBE: "yes"}}}
    placed = [(world.provider.url, "provider"), (consumer.url, "consumer")]
    try:
        for server, name in placed:
            await kcp.kubectl("apply", "-f", "-", server=server, input=_mutating_policy(name))
        async with kcp.http_session(timeout=30) as session:

            async def mutated() -> dict[str, Any] | None:
                status, answer = await _call(
                    session, "PATCH", url, patch, content_type=MERGE_PATCH, dry_run=True
                )
                assert status == 200, answer
                labels = answer["metadata"].get("labels", {})
                return answer if "mutated-by-provider" in labels else None

            answer = await poll("the provider's policy mutating widgets", mutated, within=60)
            status, stored = await _call(session, "GET", url, None)
            assert status == 200, stored
    finally:
        for server, name in placed:
            await kcp.kubectl(
                "delete", "-f", "-", "--ignore-not-found", server=server,
                input=_mutating_policy(name), check=False,
            )  # fmt: skip
    meta = answer["metadata"]
    assert meta["annotations"]["note-provider"] == "x"
    assert "example.io/provider" in meta["finalizers"]
    # The consumer's own policy is not consulted for a resource bound from an export.
    assert "mutated-by-consumer" not in meta["labels"]
    assert "example.io/consumer" not in meta.get("finalizers", [])
    local = apply_merge_patch(stored, patch)
    assert "mutated-by-provider" not in local["metadata"]["labels"]
