"""Server-side apply through a slice against the same apply sent straight to kcp's APIExport
virtual workspace (issue 23 §1).

Random cases (hypothesis, derandomized): a widget with a history — created by a POST or by an
apply, then applied to or merge-patched by other field managers, with random labels in and out
of the slice's selector (``env=prod,tier notin (x)``), annotations, finalizers and spec — is
made twice, directly in kcp's virtual workspace: the *slice's* object and its *twin*. (A
history that keeps the object in the slice may also apply through the slice: the twin then gets
the same apply directly, labelled as the proxy labels it; the holds the proxy records for its
finalizers are on the slice's object only.) Then one apply configuration (a random subset of
labels, annotations, finalizers and spec fields, with or without ``metadata.resourceVersion`` —
current or stale —, ``force`` true or false, field manager A or B, or one that creates the
object) is sent to the slice's object through the slice and to the twin directly. The twin gets
the configuration as the proxy sends it: labelled like a create (``env=prod`` added when it
states no ``env``: :func:`vwserver.proxy.writes._label_for_create`). Then:

* both answered the same code (and reason): the two objects, read back from kcp, are equal apart
  from what names the object or the moment (name, uid, resourceVersion, creationTimestamp,
  managedFields times) and the proxy's record of the holds of finalizers added through the
  slice (the holds annotation, the holder labels, their fields in managedFields);
* the slice answered 404: its object was missing or outside the slice before; 422 (the
  slice's own refusal): the configuration states labels the selector refuses, so kcp's result — when kcp
  applied it — is outside the slice; either way the slice's object is unchanged;
* never: the slice answered 2xx and its object is outside the slice.

The cost of each apply through the slice is counted from the proxy's upstream requests for that
object (:class:`tests.support.upstream_record.RecordingUpstream`; the shared cache, which serves
the membership check — the test waits until it has the object's last version —, reads through
its own client): an apply :func:`vwserver.proxy.write_plan.apply_result_decided` calls decided
must cost exactly one upstream write (no dry run; a GET more only after a 409, to tell a field
conflict from a lost race); the others take the dry run. The split is printed.

Size: ``VWSERVER_APPLY_EXAMPLES`` cases, default 300 (about 50 s against a running kcp); the
full length is 3000 (about 4 minutes).

Facts seen on kcp v0.32.3 (this module's runs; each holds alike through the slice and directly):

* kcp's virtual workspace answers an apply's field conflict (``force`` false) with the same 409
  ``Conflict`` through the slice as directly: the proxy forwards it as it is (one GET more tells
  it from its own precondition's 409).
* An apply that creates the object is answered 200 (not 201), directly as through the slice.
* An apply naming ``metadata.resourceVersion`` of an object that does not exist is kcp's 500
  (the apiserver's create path: "resourceVersion should not be set on objects to be
  created"); the slice answers 404 NotFound, as for any missing object.
* kcp's virtual workspace records the fields of an apply that creates the object under its
  manager's ``Update`` operation, and later applies of that manager split its fields between an
  ``Apply`` and an ``Update`` entry: seen directly just as through the slice, so it is kcp's
  (the note of ``test_back_to_back_applies_cost_one_request_each``: a second apply changing
  those fields conflicts with its own manager unless forced). The holds annotation the proxy
  adds to an apply is among them: the applier's next apply that changed it conflicted with the
  applier itself (found here at full length, :data:`_HOLDS_OWNED_BY_UPDATE`; the proxy now
  forces that write, :func:`vwserver.proxy.write_plan.apply_write_query`).
* managedFields entries are ordered by operation, then time (to the second), then manager: two
  objects with the same history may differ in that order only.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import example, given
from hypothesis import strategies as st

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.properties import bounded_settings
from tests.support.rest import RestCalls
from tests.support.slices import slice_url, slices_over_kcp
from tests.support.upstream_record import RecordingUpstream
from tests.support.widgets import API as WIDGETS_API
from tests.support.widgets import make_namespace, remove_namespace
from tests.support.write_cost import until_cached, widgets_cache
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.holds import HOLDS_ANNOTATION, is_holder_label
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.proxy.context import WriteTarget
from vwserver.proxy.filtering import decode_head
from vwserver.proxy.holding import Stored
from vwserver.proxy.write_plan import apply_result_decided
from vwserver.selector import Selector

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

EXAMPLES = int(os.environ.get("VWSERVER_APPLY_EXAMPLES", "300"))
WORKERS = 4  # cases run concurrently (each on its own two objects)
SLICE = "prod"
SELECTOR = Selector.parse("env=prod,tier notin (x)")
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
HEAD = {"apiVersion": "example.io/v1alpha1", "kind": "Widget"}
MANAGERS = ("applier-a", "applier-b")
NAMING = ("name", "uid", "resourceVersion", "creationTimestamp")

# -- cases ---------------------------------------------------------------------------------

_LABELS = st.dictionaries(
    st.sampled_from(["env", "tier", "app"]), st.sampled_from(["prod", "dev", "x", "y"]), max_size=3
)
_ANNOTATIONS = st.dictionaries(
    st.sampled_from(["note", "example.io/a"]), st.sampled_from(["1", "2"]), max_size=2
)
_FINALIZERS = st.lists(st.sampled_from(["example.io/f", "example.io/g"]), max_size=2, unique=True)
_SPEC = st.fixed_dictionaries(
    {}, optional={"size": st.sampled_from([0, 1, 2, 3, -1]), "color": st.sampled_from(["r", "b"])}
)


# A stored object's labels: a history of labels in the slice (env=prod, tier y or absent),
# or of any labels.
_IN_SLICE = st.fixed_dictionaries(
    {"env": st.just("prod")},
    optional={"tier": st.just("y"), "app": st.sampled_from(["a", "b"])},
)
_ANY_LABELS = st.one_of(_IN_SLICE, _LABELS)


@st.composite
def _metadata(
    draw: st.DrawFn, *, labels: st.SearchStrategy[dict[str, str]], stated: bool = True
) -> dict[str, Any]:
    """Metadata with ``labels`` (``stated``: always, else mostly), maybe annotations and
    finalizers."""
    meta: dict[str, Any] = {}
    if stated or draw(st.integers(0, 4)) > 0:
        meta["labels"] = draw(labels)
    if draw(st.booleans()):
        meta["annotations"] = draw(_ANNOTATIONS)
    if draw(st.integers(0, 2)) == 0:
        meta["finalizers"] = draw(_FINALIZERS)
    return meta


@dataclass(frozen=True)
class Step:
    """One write of an object's history, made to both objects directly in kcp."""

    kind: str  # create | apply | merge | slice (an apply through the slice)
    manager: str
    meta: dict[str, Any]
    spec: dict[str, Any]


@dataclass(frozen=True)
class Config:
    """The apply under test."""

    manager: str
    force: bool
    meta: dict[str, Any]
    spec: dict[str, Any] | None
    version: str  # none | current | stale


@dataclass(frozen=True)
class Case:
    history: tuple[Step, ...]  # empty: the apply creates the object
    apply: Config


@st.composite
def _steps(draw: st.DrawFn) -> tuple[Step, ...]:
    if draw(st.sampled_from([True, False, False, False, False])):
        return ()  # the apply creates the object
    stored_labels = draw(st.sampled_from([_IN_SLICE, _IN_SLICE, _IN_SLICE, _ANY_LABELS]))
    first = draw(st.sampled_from(["create", "apply"]))
    manager = "creator" if first == "create" else draw(st.sampled_from(MANAGERS))
    spec = draw(_SPEC.filter(lambda s: s.get("size") != -1))
    steps = [Step(first, manager, draw(_metadata(labels=stored_labels)), spec)]
    # Applies through the slice only while the object stays in it (the twin's history would
    # be another one where the slice refuses).
    kinds = ["apply", "merge", "slice"] if stored_labels is _IN_SLICE else ["apply", "merge"]
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(kinds))
        manager = "editor" if kind == "merge" else draw(st.sampled_from(MANAGERS))
        spec = draw(_SPEC.filter(lambda s: s.get("size") != -1))
        steps.append(Step(kind, manager, draw(_metadata(labels=stored_labels)), spec))
    return tuple(steps)


# A configuration's labels: often without env (the proxy adds env=prod), any of them else.
_CONFIG_LABELS = st.one_of(
    st.dictionaries(st.sampled_from(["tier", "app"]), st.sampled_from(["x", "y", "a"]), max_size=2),
    _IN_SLICE,
    _LABELS,
)
_CONFIGS = st.builds(
    Config,
    manager=st.sampled_from(MANAGERS),
    force=st.booleans(),
    meta=_metadata(labels=_CONFIG_LABELS, stated=False),
    spec=st.one_of(st.none(), _SPEC),
    version=st.sampled_from(["none", "none", "current", "stale"]),
)


_HOLDS_OWNED_BY_UPDATE = (
    (
        Step("create", "creator", {"labels": {"env": "prod"}}, {"size": 2}),
        Step("slice", "applier-a", {"labels": {"env": "prod"}, "finalizers": ["example.io/f"]}, {}),
    ),
    Config("applier-a", False, {"finalizers": ["example.io/f", "example.io/g"]}, None, "none"),
)
"""Found at the full length: an applier that added a finalizer through the slice adds another,
without force. kcp's virtual workspace had recorded the holds annotation the proxy wrote with
the first apply under the applier's ``Update`` operation, so the second apply's new holds
conflicted with the applier itself (409) where kcp directly applies it
(:func:`vwserver.proxy.write_plan.apply_write_query`)."""


def _cases() -> list[Case]:
    cases: list[Case] = []

    @bounded_settings(EXAMPLES)
    @given(_steps(), _CONFIGS)
    @example(*_HOLDS_OWNED_BY_UPDATE)
    def collect(history: tuple[Step, ...], apply: Config) -> None:
        cases.append(Case(history, apply))

    collect()
    return cases


# -- the world -------------------------------------------------------------------------------


@dataclass
class World(RestCalls):
    session: aiohttp.ClientSession  # to kcp's virtual workspace, as kcp's admin
    client: aiohttp.ClientSession  # to the proxy
    direct: str  # the widgets of the namespace in kcp's virtual workspace
    through: str  # the same through the slice
    cluster: str
    namespace: str
    registry: CacheRegistry
    recorder: RecordingUpstream

    def session_for(self, url: str) -> aiohttp.ClientSession:
        return self.client if url.startswith(self.through) else self.session


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def apply_world(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[World]:
    consumer = world.consumers[0]
    namespace = f"apply-diff-{uuid.uuid4().hex[:6]}"
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    recorders: list[RecordingUpstream] = []

    def recording(**kw: Any) -> RecordingUpstream:
        recorders.append(RecordingUpstream(**kw))
        return recorders[-1]

    await make_namespace(kcp, [consumer], namespace)
    async with contextlib.AsyncExitStack() as stack:
        kube = await stack.enter_async_context(KubeClient(auth=auth))
        # Writes read the shared cache but do not keep it running: after the LIST below it
        # stays for the whole run only if its idle period outlasts the run.
        registry = CacheRegistry(client=kube, clock=SystemClock(), idle_seconds=7200)
        stack.push_async_callback(registry.aclose)
        base = await stack.enter_async_context(
            slices_over_kcp(
                kcp,
                world,
                slices={SLICE: SELECTOR},
                page_size=50,
                cache=registry,
                upstream=recording,
            )
        )
        admin = await stack.enter_async_context(kcp.http_session(timeout=60))
        client = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        )
        w = World(
            session=admin,
            client=client,
            direct=f"{world.vw_url}/clusters/{consumer.cluster}/{WIDGETS_API}/namespaces/"
            f"{namespace}/widgets",
            through=f"{slice_url(base, world, SLICE, consumer.cluster)}/{WIDGETS_API}/"
            f"namespaces/{namespace}/widgets",
            cluster=consumer.cluster,
            namespace=namespace,
            registry=registry,
            recorder=recorders[0],
        )
        try:
            # A LIST through the slice starts the widgets' shared cache (as a controller's
            # watch would): the membership checks read it.
            async with client.get(w.through) as resp:
                assert resp.status == 200, await resp.text()
            assert widgets_cache(registry).synced
            yield w
        finally:
            try:
                await _release_all(w)
            finally:
                await remove_namespace(kcp, [consumer], namespace)


async def _release_all(w: World) -> None:
    """No finalizer may keep the namespace, and no widget of this module outlives it: they are
    deleted here and waited for (the namespace's deletion is asynchronous, and the modules
    after this one compare two reads of the world's widgets — kcp's namespace controller
    deleting these between them would make the reads differ)."""
    async with asyncio.timeout(60):
        while True:
            async with w.session.get(w.direct) as resp:
                items = (await resp.json()).get("items", [])
            if not items:
                return
            for item in items:
                if item["metadata"].get("finalizers"):
                    await w.call(
                        "PATCH",
                        f"{w.direct}/{item['metadata']['name']}",
                        {"metadata": {"finalizers": None}},
                        ctype=MERGE,
                    )
            async with w.session.delete(w.direct) as resp:
                assert resp.status == 200, await resp.text()
            await asyncio.sleep(0.5)


def _apply_params(manager: str, *, force: bool) -> dict[str, str]:
    params = {"fieldManager": manager}
    if force:
        params["force"] = "true"
    return params


async def _write_step(w: World, name: str, step: Step, *, mine: bool) -> tuple[int, Any]:
    """``step`` made to the slice's object (``mine``) or to the twin: directly in kcp, but for
    a ``slice`` step, which is an apply through the slice for the slice's object (recording
    holds for its finalizers) and the same apply, labelled as the proxy labels it, for the
    twin."""
    meta = {**copy.deepcopy(step.meta), "name": name}
    body: dict[str, Any] = {**HEAD, "metadata": meta, "spec": step.spec}
    if step.kind == "create":
        return await w.call("POST", w.direct, body, params={"fieldManager": step.manager})
    params = _apply_params(step.manager, force=True)
    if step.kind == "slice" and mine:
        return await w.call("PATCH", f"{w.through}/{name}", body, ctype=APPLY, params=params)
    if step.kind == "slice":
        body["metadata"] = _labelled(meta)
    if step.kind in ("apply", "slice"):
        return await w.call("PATCH", f"{w.direct}/{name}", body, ctype=APPLY, params=params)
    del meta["name"]
    patch = {"metadata": meta, "spec": step.spec}
    return await w.call(
        "PATCH",
        f"{w.direct}/{name}",
        patch,
        ctype=MERGE,
        params={"fieldManager": step.manager},
    )


def _labelled(meta: dict[str, Any]) -> dict[str, Any]:
    """An apply configuration's metadata as the proxy sends it: labelled like a create (the
    selector's only required label, ``env=prod``, added when not stated)."""
    meta = copy.deepcopy(meta)
    labels = meta.setdefault("labels", {})
    labels.setdefault("env", "prod")
    return meta


def _config(case: Case, name: str, versions: list[str], *, labelled: bool) -> dict[str, Any]:
    config = case.apply
    meta = _labelled(config.meta) if labelled else copy.deepcopy(config.meta)
    meta["name"] = name
    if config.version == "current" and versions:
        meta["resourceVersion"] = versions[-1]
    elif config.version == "stale":
        meta["resourceVersion"] = versions[0] if len(versions) > 1 else "1"
    body: dict[str, Any] = {**HEAD, "metadata": meta}
    if config.spec is not None:
        body["spec"] = config.spec
    return body


# -- comparing -------------------------------------------------------------------------------


def _without_holds(fields: Any) -> Any:
    """A managedFields entry's ``fieldsV1`` without the fields of the holds annotation and the
    holder labels (and the map's own field when that was all)."""
    fields = copy.deepcopy(fields)
    meta = fields.get("f:metadata", {})
    for member, bookkeeping in (
        ("f:annotations", lambda key: key == f"f:{HOLDS_ANNOTATION}"),
        ("f:labels", lambda key: is_holder_label(key.removeprefix("f:"))),
    ):
        owned = meta.get(member)
        if isinstance(owned, dict):
            for key in [k for k in owned if bookkeeping(k)]:
                del owned[key]
            if set(owned) <= {"."}:
                del meta[member]
    return fields


def _comparable(obj: dict[str, Any] | None) -> Any:
    """``obj`` without what names it or the moment, and without the proxy's bookkeeping of the
    holds it records for a finalizer added through the slice (the holds annotation, the
    holder labels, their fields in managedFields)."""
    if obj is None:
        return None
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    for key in NAMING:
        meta.pop(key, None)
    annotations = meta.get("annotations") or {}
    annotations.pop(HOLDS_ANNOTATION, None)
    if not annotations:
        meta.pop("annotations", None)
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if not is_holder_label(k)}
    meta.pop("labels", None)
    if labels:
        meta["labels"] = labels
    entries = []
    for entry in meta.get("managedFields") or []:
        entry.pop("time", None)
        entry["fieldsV1"] = _without_holds(entry.get("fieldsV1", {}))
        if entry["fieldsV1"].get("f:metadata") == {}:
            del entry["fieldsV1"]["f:metadata"]
        if entry["fieldsV1"]:
            entries.append(entry)
    if entries:
        # The apiserver orders the entries by operation, then time (to the second), then
        # manager: two objects written at the same pace may still straddle a second.
        meta["managedFields"] = sorted(entries, key=lambda e: (e["operation"], e["manager"]))
    else:
        meta.pop("managedFields", None)
    return obj


def _in_slice(obj: dict[str, Any] | None) -> bool:
    return obj is not None and SELECTOR.matches(obj["metadata"].get("labels"))


def _decided(config: dict[str, Any], stored: dict[str, Any] | None) -> bool:
    """Whether the proxy takes the one-write path for ``config`` (as the proxy sends it)
    over ``stored`` (the object it checked, in the slice)."""
    if (
        stored is None
        or not _in_slice(stored)
        or config["metadata"].get("resourceVersion")
        not in (
            None,
            stored["metadata"]["resourceVersion"],
        )
    ):
        return False
    sent = copy.deepcopy(config)
    sent["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
    raw = json.dumps(stored).encode()
    # What apply_result_decided reads of the write's target: the slice's selector.
    target = cast(WriteTarget, SimpleNamespace(route=SimpleNamespace(selector=SELECTOR)))
    return apply_result_decided(target, sent, Stored(head=decode_head(raw), body=raw))


@dataclass
class Outcome:
    counts: Counter[str] = field(default_factory=Counter)
    paths: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def _reason(doc: Any) -> str:
    return (
        str(doc.get("reason", "")) if isinstance(doc, dict) and doc.get("kind") == "Status" else ""
    )


async def _run_case(w: World, index: int, case: Case, outcome: Outcome) -> None:
    mine, twin = f"s{index}", f"t{index}"
    where = f"case {index}: {case!r}"
    versions: dict[str, list[str]] = {mine: [], twin: []}
    for step in case.history:
        answers = [await _write_step(w, name, step, mine=name == mine) for name in (mine, twin)]
        if answers[0][0] != answers[1][0]:
            outcome.failures.append(f"history differs: {answers}; {where}")
            return
        for name, (status, doc) in zip((mine, twin), answers, strict=True):
            if status in (200, 201):
                versions[name].append(doc["metadata"]["resourceVersion"])
    before = await w.get(f"{w.direct}/{mine}")
    if before is not None:  # the membership check reads the cache: it has this version
        rv = int(before["metadata"]["resourceVersion"])
        await until_cached(w.registry, (w.cluster, w.namespace, mine), newer_than=rv - 1)

    through = _config(case, mine, versions[mine], labelled=False)
    params = _apply_params(case.apply.manager, force=case.apply.force)
    start = len(w.recorder.sent)
    status, doc = await w.call("PATCH", f"{w.through}/{mine}", through, ctype=APPLY, params=params)
    sent = [s for s in w.recorder.sent[start:] if s.path.endswith(f"/widgets/{mine}")]
    direct = _config(case, twin, versions[twin], labelled=True)
    kcp_status, kcp_doc = await w.call(
        "PATCH", f"{w.direct}/{twin}", direct, ctype=APPLY, params=params
    )
    after, twin_after = await w.get(f"{w.direct}/{mine}"), await w.get(f"{w.direct}/{twin}")
    where += f" slice {status} {doc!r} kcp {kcp_status} {kcp_doc!r}"

    writes = [s for s in sent if s.method != "GET"]
    dry = [s for s in writes if s.query.get("dryRun") == "All"]
    path = "refused before a write" if not writes else "dry run" if dry else "one write"
    outcome.paths[path] += 1
    if _decided(_config(case, mine, versions[mine], labelled=True), before):
        outcome.paths["decided by apply_result_decided"] += 1
        if len(writes) != 1 or dry or (status != 409 and len(sent) != 1):
            outcome.failures.append(f"decided, but sent {sent}; {where}")
    elif path == "one write" and before is not None:
        outcome.failures.append(f"not decided, but written without a dry run: {sent}; {where}")
    elif path == "dry run" and status in (200, 201) and len(writes) != 2:
        outcome.failures.append(f"a dry run and a write expected, sent {sent}; {where}")

    if status in (200, 201) and not _in_slice(after):
        outcome.failures.append(f"the slice answered {status}, the object is outside; {where}")
        return
    if status == kcp_status and _reason(doc) == _reason(kcp_doc):
        if _comparable(after) == _comparable(twin_after):
            new = " (created)" if before is None and status in (200, 201) else ""
            outcome.counts[f"same answer: {status} {_reason(doc)}".rstrip() + new] += 1
        else:
            outcome.failures.append(
                f"objects differ: slice {_comparable(after)!r} kcp {_comparable(twin_after)!r}; "
                f"{where}"
            )
        return
    if status not in (404, 422) or (before or {}) != (after or {}):
        outcome.failures.append(f"answers differ: {where}")
        return
    if status == 404 and not _in_slice(before):
        outcome.counts[f"404: {'missing' if before is None else 'outside'}; kcp {kcp_status}"] += 1
        return
    message = doc.get("message", "") if isinstance(doc, dict) else ""
    leaves = not SELECTOR.matches(_labelled(case.apply.meta)["labels"])
    if (
        status == 422
        and "slice" in message
        and leaves
        and (kcp_status not in (200, 201) or not _in_slice(twin_after))
    ):
        outcome.counts[f"422: the configuration leaves the slice; kcp {kcp_status}"] += 1
        return
    outcome.failures.append(f"the slice refused what kcp's result does not explain: {where}")


async def _worker(w: World, work: list[tuple[int, Case]], outcome: Outcome) -> None:
    for index, case in work:
        await _run_case(w, index, case, outcome)


@pytest.mark.timeout(3600)
async def test_applies_through_a_slice_answer_like_kcp(apply_world: World) -> None:
    cases = list(enumerate(_cases()))
    outcome = Outcome()
    await asyncio.gather(
        *(_worker(apply_world, cases[i::WORKERS], outcome) for i in range(WORKERS))
    )
    print(f"\n{len(cases)} applies: {dict(outcome.counts)}")
    print(f"paths through the slice: {dict(outcome.paths)}")
    assert not outcome.failures, (
        f"{len(outcome.failures)} of {len(cases)} cases differ:\n"
        + "\n".join(outcome.failures[:12])
    )
    assert sum(outcome.counts.values()) == len(cases)
    # The cases reach every kind of outcome and both paths.
    assert outcome.paths["one write"] > len(cases) // 20
    assert outcome.paths["dry run"] > len(cases) // 20
    assert (
        sum(n for k, n in outcome.counts.items() if k.startswith("same answer: 2"))
        > len(cases) // 5
    )
