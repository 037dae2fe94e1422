"""The guarded write's plan (:mod:`vwserver.proxy.write_plan`), rule by rule, as tables.

Each case is a stored object (or None: missing), the client's request and the slice; the plan
is what is sent (with which precondition, and whether a conflict on it is the proxy's own) or
the Status the client gets. No I/O: the executor (:mod:`vwserver.proxy.write_io`) is tested
with the fake and real kcp (tests/security/test_write_cost*.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from vwserver.errors import Conflict, HeldFinalizer, Invalid, RequestError
from vwserver.holds import (
    HOLDS_ANNOTATION,
    RELEASE_ANNOTATION,
    Member,
    WritePlan,
    holder_label,
    label_pointer,
    slice_id,
)
from vwserver.proxy.filtering import decode_head
from vwserver.proxy.holding import Stored
from vwserver.proxy.patches import PatchError
from vwserver.proxy.paths import ApiRequest, Verb
from vwserver.proxy.write_plan import (
    JSON_PATCH,
    MERGE_PATCH,
    MISSING,
    Leaving,
    Send,
    apply_result_decided,
    apply_write_query,
    plan_delete,
    plan_patch,
    plan_status_patch,
    plan_update,
)
from vwserver.routes import Route
from vwserver.selector import Selector

SID = slice_id("root:provider", "prod")
OTHER = slice_id("root:provider", "dev")
SELECTORS = {SID: Selector.parse("env=prod"), OTHER: Selector.parse("env=dev")}
RV = "42"
UID = "u-1"


@dataclass(frozen=True)
class Target:
    """A write's target as the plan reads it (:class:`vwserver.proxy.context.WriteTarget`)."""

    api: ApiRequest
    route: Route = field(
        default_factory=lambda: Route(
            cluster="root:provider",
            name="prod",
            selector=SELECTORS[SID],
            upstream_url="https://kcp.invalid",
        )
    )
    member: Member = field(
        default_factory=lambda: Member(selector=SELECTORS[SID], id=SID, peers=SELECTORS.get)
    )
    records_holds: bool = True


def target(verb: Verb = Verb.UPDATE, *, subresource: str = "") -> Target:
    return Target(
        ApiRequest(
            discovery=False,
            verb=verb,
            group="example.io",
            version="v1alpha1",
            namespace="ns",
            resource="widgets",
            name="w",
            subresource=subresource,
        )
    )


def obj(
    *,
    labels: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    rv: str = RV,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "w",
        "namespace": "ns",
        "uid": UID,
        "resourceVersion": rv,
        "labels": {"env": "prod"} if labels is None else labels,
    }
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "metadata": meta, "spec": {}}


def stored(**kw: Any) -> Stored:
    body = json.dumps(obj(**kw)).encode()
    return Stored(head=decode_head(body), body=body)


def holds(sid: str, *finalizers: str, since: str = "") -> dict[str, str]:
    entry: dict[str, Any] = {"finalizers": list(finalizers)}
    if since:
        entry["leavingSince"] = since
    return {HOLDS_ANNOTATION: json.dumps({sid: entry})}


# A stored object this slice holds (finalizer "f" added through it) whose labels moved to dev.
LEAVING = {"labels": {"env": "dev"}, "finalizers": ["f"], "annotations": holds(SID, "f")}


def meta(send: Any) -> dict[str, Any]:
    assert isinstance(send, Send)
    assert isinstance(send.body, dict)
    out = send.body["metadata"]
    assert isinstance(out, dict)
    return out


# --- update -----------------------------------------------------------------------------------

UPDATE_CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, Any]] = [
    # (case, the client's body, stored (None: missing), expected: Send own? / MISSING / error)
    ("missing", obj(), None, MISSING),
    ("missing, moving out: the refusal whether or not it exists", obj(labels={}), None, Invalid),
    ("in the slice, no resourceVersion: the proxy's", obj(rv=""), {}, True),
    ("the client's own resourceVersion, current", obj(), {}, False),
    ("the client's own resourceVersion, stale: its 409", obj(rv="1"), {}, Conflict),
    ("moving out", obj(labels={"env": "dev"}), {}, Invalid),
    ("leaving: the release path", obj(labels={"env": "dev"}), LEAVING, Leaving("")),
    (
        "removing a finalizer another slice holds while it leaves",
        obj(finalizers=[]),
        {"finalizers": ["g"], "annotations": holds(OTHER, "g", since="2026-01-01T00:00:00Z")},
        HeldFinalizer,
    ),
]


@pytest.mark.parametrize(
    ("body", "stored_kw", "expected"),
    [case[1:] for case in UPDATE_CASES],
    ids=[case[0] for case in UPDATE_CASES],
)
def test_update(body: dict[str, Any], stored_kw: dict[str, Any] | None, expected: Any) -> None:
    have = None if stored_kw is None else stored(**stored_kw)
    if isinstance(expected, type) and issubclass(expected, RequestError):
        with pytest.raises(expected):
            plan_update(target(), body, have)
        return
    decision = plan_update(target(), body, have)
    if isinstance(expected, bool):
        assert isinstance(decision, Send) and decision.own_precondition is expected
        assert meta(decision)["resourceVersion"] == RV
    else:
        assert decision == expected


def test_update_puts_the_proxys_annotations_back_and_records_a_hold() -> None:
    body = obj(finalizers=["f"], annotations={HOLDS_ANNOTATION: "{}", RELEASE_ANNOTATION: "x"})
    out = meta(plan_update(target(), body, stored()))
    assert json.loads(out["annotations"][HOLDS_ANNOTATION]) == {SID: {"finalizers": ["f"]}}
    assert RELEASE_ANNOTATION not in out["annotations"]
    # No holds where the slice does not record them.
    unrecorded = Target(target().api, records_holds=False)
    out = meta(plan_update(unrecorded, obj(finalizers=["f"]), stored()))
    assert HOLDS_ANNOTATION not in (out.get("annotations") or {})


STATUS_CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, Any]] = [
    ("missing", obj(), None, MISSING),
    # kcp's status strategy ignores metadata: labels that would move it out change nothing.
    ("labels are ignored", {**obj(labels={"env": "dev"}), "metadata": {}}, {}, True),
    ("the client's resourceVersion", obj(), {}, False),
    ("a stale client resourceVersion", obj(rv="7"), {}, Conflict),
    ("leaving", obj(), LEAVING, Leaving("")),
]


@pytest.mark.parametrize(
    ("body", "stored_kw", "expected"),
    [case[1:] for case in STATUS_CASES],
    ids=[case[0] for case in STATUS_CASES],
)
def test_status_update(
    body: dict[str, Any], stored_kw: dict[str, Any] | None, expected: Any
) -> None:
    have = None if stored_kw is None else stored(**stored_kw)
    api = target(subresource="status")
    if isinstance(expected, type):
        with pytest.raises(expected):
            plan_update(api, body, have)
        return
    decision = plan_update(api, body, have)
    if isinstance(expected, bool):
        assert isinstance(decision, Send) and decision.own_precondition is expected
        assert meta(decision)["resourceVersion"] == RV
        # The body goes as sent (no holds: the subresource keeps the stored metadata).
        assert HOLDS_ANNOTATION not in (meta(decision).get("annotations") or {})
    else:
        assert decision == expected


# --- status patches ---------------------------------------------------------------------------

TEST_RV = {"op": "test", "path": "/metadata/resourceVersion", "value": RV}
STATUS_PATCHES: list[tuple[str, Any, str, dict[str, Any] | None, Any]] = [
    ("merge", {"status": {"phase": "x"}}, MERGE_PATCH, {}, {"status": {"phase": "x"}}),
    (
        "merge, the client's resourceVersion",
        {"metadata": {"resourceVersion": RV}},
        MERGE_PATCH,
        {},
        {"metadata": {"resourceVersion": RV}},
    ),
    (
        "merge, a stale resourceVersion",
        {"metadata": {"resourceVersion": "1"}},
        MERGE_PATCH,
        {},
        Conflict,
    ),
    (
        "JSON patch: a leading test",
        [{"op": "add", "path": "/status", "value": {}}],
        JSON_PATCH,
        {},
        [TEST_RV, {"op": "add", "path": "/status", "value": {}}],
    ),
    ("missing", {"status": {}}, MERGE_PATCH, None, MISSING),
    # a controller still reports on an object leaving its slice (before it lets go)
    (
        "leaving",
        {"status": {}},
        MERGE_PATCH,
        LEAVING,
        Send({"status": {}, "metadata": {"resourceVersion": RV}}, True, leaving_since=""),
    ),
]


@pytest.mark.parametrize(
    ("patch", "content_type", "stored_kw", "expected"),
    [case[1:] for case in STATUS_PATCHES],
    ids=[case[0] for case in STATUS_PATCHES],
)
def test_status_patch(
    patch: Any, content_type: str, stored_kw: dict[str, Any] | None, expected: Any
) -> None:
    have = None if stored_kw is None else stored(**stored_kw)
    api = target(Verb.PATCH, subresource="status")
    if isinstance(expected, type):
        with pytest.raises(expected):
            plan_status_patch(api, patch, have, content_type=content_type)
        return
    decision = plan_status_patch(api, patch, have, content_type=content_type)
    if isinstance(expected, (dict, list)):
        assert isinstance(decision, Send)
        if isinstance(expected, dict):
            expected = {
                **expected,
                "metadata": {**expected.get("metadata", {}), "resourceVersion": RV},
            }
        assert decision.body == expected
    else:
        assert decision == expected


# --- delete -----------------------------------------------------------------------------------

DELETE_CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, Any]] = [
    ("missing", {}, None, MISSING),
    ("no preconditions: the proxy's", {}, {}, True),
    (
        "client-go's uid-only precondition: implied by the proxy's",
        {"preconditions": {"uid": UID}},
        {},
        True,
    ),
    (
        "the client's resourceVersion: its own",
        {"preconditions": {"resourceVersion": RV}},
        {},
        False,
    ),
    ("another uid: the client's 409", {"preconditions": {"uid": "u-2"}}, {}, Conflict),
    (
        "a stale resourceVersion: the client's 409",
        {"preconditions": {"resourceVersion": "1"}},
        {},
        Conflict,
    ),
    ("leaving", {}, LEAVING, Leaving("")),
]


@pytest.mark.parametrize(
    ("options", "stored_kw", "expected"),
    [case[1:] for case in DELETE_CASES],
    ids=[case[0] for case in DELETE_CASES],
)
def test_delete(options: dict[str, Any], stored_kw: dict[str, Any] | None, expected: Any) -> None:
    have = None if stored_kw is None else stored(**stored_kw)
    if isinstance(expected, type):
        with pytest.raises(expected):
            plan_delete(target(Verb.DELETE), options, have)
        return
    decision = plan_delete(target(Verb.DELETE), options, have)
    if isinstance(expected, bool):
        assert isinstance(decision, Send) and decision.own_precondition is expected
        assert isinstance(decision.body, dict)
        assert decision.body["preconditions"] == {"uid": UID, "resourceVersion": RV}
    else:
        assert decision == expected


# --- merge and JSON patches of the main resource ----------------------------------------------

PATCH_CASES: list[tuple[str, Any, str, dict[str, Any] | None, Any]] = [
    ("missing", {"spec": {"a": 1}}, MERGE_PATCH, None, MISSING),
    ("merge, stays", {"spec": {"a": 1}}, MERGE_PATCH, {}, True),
    ("merge, moves out", {"metadata": {"labels": {"env": "dev"}}}, MERGE_PATCH, {}, Invalid),
    ("merge, drops the label", {"metadata": {"labels": {"env": None}}}, MERGE_PATCH, {}, Invalid),
    (
        "merge, writes the holds",
        {"metadata": {"annotations": {HOLDS_ANNOTATION: "{}"}}},
        MERGE_PATCH,
        {},
        Invalid,
    ),
    (
        "merge, a stale resourceVersion",
        {"metadata": {"resourceVersion": "1"}},
        MERGE_PATCH,
        {},
        Conflict,
    ),
    (
        "merge, the client's resourceVersion",
        {"metadata": {"resourceVersion": RV}},
        MERGE_PATCH,
        {},
        False,
    ),
    ("JSON, stays", [{"op": "add", "path": "/spec/a", "value": 1}], JSON_PATCH, {}, True),
    (
        "JSON, moves out",
        [{"op": "replace", "path": "/metadata/labels/env", "value": "dev"}],
        JSON_PATCH,
        {},
        Invalid,
    ),
    (
        "JSON, copies a spec value into the label",
        [
            {"op": "add", "path": "/spec/c", "value": "dev"},
            {"op": "copy", "from": "/spec/c", "path": "/metadata/labels/env"},
        ],
        JSON_PATCH,
        {},
        Invalid,
    ),
    (
        "JSON, a failing test: kcp's 422",
        [{"op": "test", "path": "/spec", "value": 1}],
        JSON_PATCH,
        {},
        PatchError,
    ),
    (
        "JSON, a missing path: kcp's 422",
        [{"op": "remove", "path": "/spec/nope"}],
        JSON_PATCH,
        {},
        PatchError,
    ),
    ("leaving", {"spec": {}}, MERGE_PATCH, LEAVING, Leaving("")),
    (
        "removing a finalizer another slice holds while it leaves",
        {"metadata": {"finalizers": []}},
        MERGE_PATCH,
        {"finalizers": ["g"], "annotations": holds(OTHER, "g", since="2026-01-01T00:00:00Z")},
        HeldFinalizer,
    ),
]


@pytest.mark.parametrize(
    ("patch", "content_type", "stored_kw", "expected"),
    [case[1:] for case in PATCH_CASES],
    ids=[case[0] for case in PATCH_CASES],
)
def test_patch(
    patch: Any, content_type: str, stored_kw: dict[str, Any] | None, expected: Any
) -> None:
    have = None if stored_kw is None else stored(**stored_kw)
    api = target(Verb.PATCH)
    if isinstance(expected, type):
        with pytest.raises(expected):
            plan_patch(api, patch, have, content_type=content_type)
        return
    decision = plan_patch(api, patch, have, content_type=content_type)
    if isinstance(expected, bool):
        assert isinstance(decision, Send) and decision.own_precondition is expected
        if content_type == JSON_PATCH:
            assert isinstance(decision.body, list) and decision.body[0] == TEST_RV
        else:
            assert meta(decision)["resourceVersion"] == RV
    else:
        assert decision == expected


@pytest.mark.parametrize(
    ("patch", "content_type", "stored_kw", "last"),
    [
        # A merge patch that adds a finalizer records it in the same write.
        ({"metadata": {"finalizers": ["f"]}}, MERGE_PATCH, {}, None),
        # A JSON patch: one more operation, after the client's (annotations missing: add them).
        (
            [{"op": "add", "path": "/metadata/finalizers", "value": ["f"]}],
            JSON_PATCH,
            {},
            "/metadata/annotations",
        ),
        (
            [{"op": "add", "path": "/metadata/finalizers", "value": ["f"]}],
            JSON_PATCH,
            {"annotations": {"a": "b"}},
            "/metadata/annotations/sync.edge-connect.eu~1holds",
        ),
    ],
    ids=["merge", "json, no annotations", "json, annotations"],
)
def test_a_patch_that_adds_a_finalizer_records_the_hold(
    patch: Any, content_type: str, stored_kw: dict[str, Any], last: str | None
) -> None:
    decision = plan_patch(target(Verb.PATCH), patch, stored(**stored_kw), content_type=content_type)
    assert isinstance(decision, Send)
    if last is None:
        value = meta(decision)["annotations"][HOLDS_ANNOTATION]
    else:
        assert isinstance(decision.body, list)
        # After the client's operations: the holds annotation's, then the holder label's.
        *_, op, label_op = decision.body
        assert op["path"] == last
        value = op["value"] if last.endswith("holds") else op["value"][HOLDS_ANNOTATION]
        assert label_op["op"] == "add" and label_op["value"] == "true"
        assert label_op["path"] == label_pointer(holder_label(SID))
    assert json.loads(value) == {SID: {"finalizers": ["f"]}}


# --- server-side apply: when no dry run is needed ---------------------------------------------


def config(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    """An apply configuration as the proxy sends it (labelled for the slice, with the checked
    resourceVersion): the object's fields the slice decides by, no uid or spec."""
    out = obj(labels=labels, annotations=annotations, finalizers=finalizers)
    del out["metadata"]["uid"], out["spec"]
    return out


NOT_IN = Route(
    cluster="root:provider",
    name="prod",
    selector=Selector.parse("env=prod,tier notin (db)"),
    upstream_url="https://kcp.invalid",
)

APPLY_CASES: list[tuple[str, dict[str, Any], dict[str, Any], Route | None, bool]] = [
    # (case, the configuration sent, stored, the slice's route (None: env=prod), decided)
    ("plain: labels in the slice, no holds", config(), {}, None, True),
    (
        "a stored label not configured, which the apply may keep",
        config(),
        {"labels": {"env": "prod", "x": "1"}},
        None,
        True,
    ),
    (
        "a configured finalizer: the holds need the result",
        config(finalizers=["f"]),
        {},
        None,
        False,
    ),
    ("an empty finalizer list states none", config(finalizers=[]), {}, None, True),
    ("a stored finalizer the apply may remove", config(), {"finalizers": ["f"]}, None, False),
    ("a stored hold", config(), {"finalizers": ["f"], "annotations": holds(SID, "f")}, None, False),
    (
        "a stored holds annotation without finalizers",
        config(),
        {"annotations": holds(SID, "f")},
        None,
        False,
    ),
    (
        "a configured proxy annotation: refused on the dry-run path",
        config(annotations={RELEASE_ANNOTATION: "x"}),
        {},
        None,
        False,
    ),
    (
        "a configured holder label",
        config(labels={"env": "prod", holder_label(SID): "x"}),
        {},
        None,
        False,
    ),
    (
        "a stored holder label",
        config(),
        {"labels": {"env": "prod", holder_label(OTHER): "x"}},
        None,
        False,
    ),
    (
        "other annotations: no membership",
        config(annotations={"a": "b"}),
        {"annotations": {"c": "d"}},
        None,
        True,
    ),
    # notin: the stored tier=db is kept unless this manager alone owned it; the dry run decides.
    (
        "a stored label that excludes it, if the apply keeps it",
        config(),
        {"labels": {"env": "prod", "tier": "db"}},
        NOT_IN,
        False,
    ),
    (
        "the configuration overrides that stored label",
        config(labels={"env": "prod", "tier": "web"}),
        {"labels": {"env": "prod", "tier": "db"}},
        NOT_IN,
        True,
    ),
    (
        "a stored label the selector allows",
        config(),
        {"labels": {"env": "prod", "tier": "web"}},
        NOT_IN,
        True,
    ),
    ("a configuration outside the slice", config(labels={"env": "dev"}), {}, None, False),
    ("labels that are not a map", {**config(), "metadata": {"labels": ["env"]}}, {}, None, False),
]


@pytest.mark.parametrize(
    ("case", "apply", "stored_kw", "route", "decided"), APPLY_CASES, ids=[c[0] for c in APPLY_CASES]
)
def test_an_apply_needs_no_dry_run_only_when_its_result_is_decided(
    case: str, apply: dict[str, Any], stored_kw: dict[str, Any], route: Route | None, decided: bool
) -> None:
    t = target(Verb.PATCH)
    if route is not None:
        t = Target(t.api, route=route, member=Member(selector=route.selector, id=SID))
    assert apply_result_decided(t, apply, stored(**stored_kw)) is decided


# An apply's write after its dry run: forced only when it changes the proxy's bookkeeping (the
# dry run, under the same resourceVersion, showed the client's own fields free of conflicts;
# kcp's VW may record the holds annotation under the applier's Update operation, so changing
# it conflicts with the applier itself: test_apply_differential_kcp).
_MANAGER = (("fieldManager", "a"),)
APPLY_WRITE_QUERIES = [
    ("no bookkeeping changed", _MANAGER, WritePlan(annotation=None, changed=False), _MANAGER),
    (
        "the holds annotation changes",
        _MANAGER,
        WritePlan(annotation="{}", changed=True),
        (*_MANAGER, ("force", "true")),
    ),
    (
        "a holder label changes",
        _MANAGER,
        WritePlan(annotation="{}", changed=False, labels={"holder.x/y": "true"}),
        (*_MANAGER, ("force", "true")),
    ),
    (
        "the client's force=false is overridden for the bookkeeping alone",
        (*_MANAGER, ("force", "false")),
        WritePlan(annotation=None, changed=True),
        (*_MANAGER, ("force", "true")),
    ),
    (
        "the client's own force is kept when nothing changes",
        (*_MANAGER, ("force", "false")),
        WritePlan(annotation="{}", changed=False),
        (*_MANAGER, ("force", "false")),
    ),
]


@pytest.mark.parametrize(
    ("case", "query", "plan", "expected"),
    APPLY_WRITE_QUERIES,
    ids=[c[0] for c in APPLY_WRITE_QUERIES],
)
def test_an_apply_s_write_is_forced_only_for_the_proxy_s_bookkeeping(
    case: str,
    query: tuple[tuple[str, str], ...],
    plan: WritePlan,
    expected: tuple[tuple[str, str], ...],
) -> None:
    assert apply_write_query(query, plan) == list(expected)
