"""The syncer's decision table (vwserver.syncer.sync_plan.plan) and its status helpers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from vwserver.syncer.config import ResourceConfig
from vwserver.syncer.naming import ObjectKey, downstream_namespace
from vwserver.syncer.sync_plan import (
    Apply,
    Blocked,
    Context,
    Delete,
    EnsureNamespace,
    PatchStatus,
    SetFinalizers,
    Stuck,
    contains,
    desired_downstream,
    merge_diff,
    mirrored_status,
    plan,
    set_condition,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
FIN = "sync.edge-connect.eu/syncer-eu"
KEY = ObjectKey("c1", "default", "db")
NS = downstream_namespace("c1", "default", prefix="kcp-")
RESOURCE = ResourceConfig(
    group="mongodbcommunity.mongodb.com",
    version="v1",
    resource="mongodbcommunity",
    kind="MongoDBCommunity",
    status_exclude=["mongoUri", "secret.name"],
)


def ctx(**overrides: Any) -> Context:
    values: dict[str, Any] = {
        "syncer": "eu",
        "finalizer": FIN,
        "resource": RESOURCE,
        "namespace_prefix": "kcp-",
        "may_delete_orphans": True,
        "now": NOW,
    }
    values.update(overrides)
    return Context(**values)


def upstream(
    *, finalizers: tuple[str, ...] = (FIN,), deleting: bool = False, **extra: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "db",
        "namespace": "default",
        "uid": "u-1",
        "resourceVersion": "10",
        "generation": 2,
        "labels": {"team": "x", "claimed.internal.apis.kcp.io/h": "y"},
        "annotations": {"kcp.io/cluster": "c1"},
        "finalizers": list(finalizers),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "mongodbcommunity.mongodb.com/v1",
        "kind": "MongoDBCommunity",
        "metadata": meta,
        "spec": {"members": 3, "version": "6.0"},
        **extra,
    }


def downstream_of(
    up: dict[str, Any], *, status: dict[str, Any] | None = None, **meta: Any
) -> dict[str, Any]:
    obj = desired_downstream(KEY, up, namespace=NS, ctx=ctx())
    obj["metadata"].update(uid="d-1", resourceVersion="5", **meta)
    obj["spec"] = {**obj["spec"], "defaulted": True}  # downstream defaulting
    if status is not None:
        obj["status"] = status
    return obj


def kinds(actions: list[Any]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_new_object_gets_finalizer_namespace_apply_and_condition() -> None:
    up = upstream(finalizers=("other",))
    actions = plan(KEY, up, None, tombstone=None, ctx=ctx())
    assert kinds(actions) == ["SetFinalizers", "EnsureNamespace", "Apply", "PatchStatus"]
    assert actions[0] == SetFinalizers(("other", FIN), "10")
    assert isinstance(actions[1], EnsureNamespace) and actions[1].name == NS
    apply = actions[2]
    assert isinstance(apply, Apply)
    meta = apply.body["metadata"]
    assert (meta["namespace"], meta["name"]) == (NS, "db")
    assert meta["labels"]["team"] == "x"
    assert "claimed.internal.apis.kcp.io/h" not in meta["labels"]
    assert "kcp.io/cluster" not in meta["annotations"]
    assert meta["labels"]["sync.edge-connect.eu/syncer"] == "eu"
    assert apply.body["spec"] == {"members": 3, "version": "6.0"}
    status = actions[3]
    assert isinstance(status, PatchStatus)
    (condition,) = status.patch["status"]["conditions"]
    assert condition["type"] == "Synced" and condition["status"] == "True"
    assert condition["observedGeneration"] == 2


def test_in_sync_object_needs_nothing() -> None:
    up = upstream()
    down = downstream_of(up, status={"phase": "Running", "mongoUri": "secret"})
    first = plan(KEY, up, down, tombstone=None, ctx=ctx())
    assert kinds(first) == ["EnsureNamespace", "PatchStatus"]
    (status,) = [a for a in first if isinstance(a, PatchStatus)]
    assert status.patch["status"]["phase"] == "Running"
    assert "mongoUri" not in status.patch["status"]
    up["status"] = status.patch["status"]
    assert kinds(plan(KEY, up, down, tombstone=None, ctx=ctx())) == ["EnsureNamespace"]


def test_spec_change_and_drift_are_applied() -> None:
    up = upstream()
    down = downstream_of(up)
    changed = upstream()
    changed["spec"]["version"] = "7.0"
    assert "Apply" in kinds(plan(KEY, changed, down, tombstone=None, ctx=ctx()))
    removed = upstream()
    del removed["spec"]["members"]  # a removal: the downstream copy still "contains" the intent
    assert "Apply" in kinds(plan(KEY, removed, down, tombstone=None, ctx=ctx()))
    drifted = downstream_of(up)
    drifted["spec"]["version"] = "edited-downstream"
    assert "Apply" in kinds(plan(KEY, up, drifted, tombstone=None, ctx=ctx()))


def test_foreign_downstream_object_blocks() -> None:
    up = upstream()
    foreign = {"metadata": {"name": "db", "namespace": NS, "labels": {}}}
    actions = plan(KEY, up, foreign, tombstone=None, ctx=ctx())
    assert kinds(actions) == ["Blocked"]
    assert isinstance(actions[0], Blocked) and "not owned by syncer eu" in actions[0].message
    other_syncer = downstream_of(up)
    other_syncer["metadata"]["labels"]["sync.edge-connect.eu/syncer"] = "us"
    assert kinds(plan(KEY, up, other_syncer, tombstone=None, ctx=ctx())) == ["Blocked"]


def test_downstream_being_deleted_is_waited_for() -> None:
    up = upstream()
    down = downstream_of(up, deletionTimestamp="2026-01-01T00:00:00Z")
    assert kinds(plan(KEY, up, down, tombstone=None, ctx=ctx())) == ["Wait"]


def test_deletion_deletes_downstream_then_waits_then_releases() -> None:
    up = upstream(finalizers=(FIN, "other"), deleting=True)
    down = downstream_of(up)
    actions = plan(KEY, up, down, tombstone=None, ctx=ctx())
    assert kinds(actions) == ["Delete", "PatchStatus", "Wait"]
    assert actions[0] == Delete(NS, "db", "d-1")
    terminating = downstream_of(up, deletionTimestamp="2026-01-01T00:00:00Z")
    assert kinds(plan(KEY, up, terminating, tombstone=None, ctx=ctx())) == ["PatchStatus", "Wait"]
    assert plan(KEY, up, None, tombstone=None, ctx=ctx()) == [
        SetFinalizers(("other",), "10", verify_gone=(NS, "db"))
    ]


def test_deletion_without_our_finalizer_only_cleans_our_copy() -> None:
    up = upstream(finalizers=(), deleting=True)
    assert plan(KEY, up, None, tombstone=None, ctx=ctx()) == []
    assert kinds(plan(KEY, up, downstream_of(up), tombstone=None, ctx=ctx())) == ["Delete"]
    foreign = {"metadata": {"name": "db", "namespace": NS, "labels": {}}}
    assert plan(KEY, up, foreign, tombstone=None, ctx=ctx()) == []


def test_orphans_are_deleted_only_when_the_caches_are_synced() -> None:
    down = downstream_of(upstream())
    assert plan(KEY, None, down, tombstone=None, ctx=ctx(may_delete_orphans=False)) == []
    (delete,) = plan(KEY, None, down, tombstone=None, ctx=ctx())
    assert delete == Delete(NS, "db", "d-1", confirm_upstream_absent=True)
    foreign = {"metadata": {"name": "db", "namespace": NS, "labels": {}}}
    assert plan(KEY, None, foreign, tombstone=None, ctx=ctx()) == []


def test_left_the_view_holding_our_finalizer_is_stuck() -> None:
    last = upstream()  # live, our finalizer: a DELETED from a label-selector watch
    down = downstream_of(last)
    actions = plan(KEY, None, down, tombstone=last, ctx=ctx(may_delete_orphans=False))
    assert kinds(actions) == ["Delete", "Stuck"]
    assert isinstance(actions[1], Stuck) and FIN in actions[1].message
    # the copy already gone: still stuck
    assert kinds(plan(KEY, None, None, tombstone=last, ctx=ctx())) == ["Stuck"]


@pytest.mark.parametrize(
    "tombstone",
    [
        upstream(finalizers=()),  # never ours
        upstream(deleting=True),  # the real end: DELETED after our finalizer was removed
    ],
)
def test_ordinary_deletions_are_not_stuck(tombstone: dict[str, Any]) -> None:
    assert plan(KEY, None, None, tombstone=tombstone, ctx=ctx()) == []


def test_mirrored_status_drops_excluded_paths() -> None:
    status = {"phase": "Running", "mongoUri": "x", "secret": {"name": "s", "keep": 1}}
    assert mirrored_status(status, ["mongoUri", "secret.name", "absent.path"]) == {
        "phase": "Running",
        "secret": {"keep": 1},
    }
    assert status["mongoUri"] == "x"  # a copy


def test_set_condition_keeps_transition_time_while_status_is_the_same() -> None:
    old = [{"type": "Synced", "status": "True", "lastTransitionTime": "T0", "reason": "Synced"}]
    same = set_condition(old, {"type": "Synced", "status": "True", "reason": "Synced"}, now=NOW)
    assert same == old
    flipped = set_condition(old, {"type": "Synced", "status": "False", "reason": "X"}, now=NOW)
    assert flipped[0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    other = set_condition([{"type": "Ready"}], {"type": "Synced", "status": "True"}, now=NOW)
    assert [c["type"] for c in other] == ["Ready", "Synced"]


def test_merge_diff() -> None:
    assert merge_diff({"a": 1}, {"a": 1}) is None
    assert merge_diff({"a": 1, "b": {"c": 1, "d": 2}}, {"b": {"c": 1}}) == {
        "a": None,
        "b": {"d": None},
    }
    assert merge_diff({}, {"a": {"b": None, "c": 1}}) == {"a": {"c": 1}}
    assert merge_diff({"l": [1]}, {"l": [1, 2]}) == {"l": [1, 2]}


def test_contains_ignores_added_fields_but_not_changed_ones() -> None:
    assert contains({"a": 1, "b": 2}, {"a": 1})
    assert not contains({"a": 2}, {"a": 1})
    assert contains([{"x": 1, "y": 2}], [{"x": 1}])
    assert not contains([{"x": 1}, {"x": 2}], [{"x": 1}])
