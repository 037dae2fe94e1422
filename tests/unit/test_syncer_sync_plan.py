"""The syncer's decision table (vwserver.syncer.sync_plan.plan) and its status helpers."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vwserver.syncer.config import ResourceConfig
from vwserver.syncer.naming import (
    FINALIZER_PREFIX,
    ObjectKey,
    downstream_namespace,
    field_manager,
)
from vwserver.syncer.sync_plan import (
    ITEMS,
    Apply,
    Blocked,
    Contested,
    Context,
    Delete,
    EnsureNamespace,
    PatchStatus,
    SchemaFacts,
    SetFinalizers,
    Stuck,
    condition_patch,
    contains,
    desired_downstream,
    learn,
    merge_diff,
    mirrored_status,
    needs_apply,
    new_condition,
    plan,
    set_condition,
    without,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
FIN = "sync.edge-connect.eu/syncer-eu"
OTHER = "sync.edge-connect.eu/syncer-us"
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
    *,
    finalizers: tuple[str, ...] = (FIN,),
    deleting: bool = False,
    added_by_syncers: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """``added_by_syncers``: managedFields say each syncer finalizer was added by that syncer
    (its claim); else a consumer wrote them all (``kubectl edit``)."""
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
    meta["managedFields"] = [
        {
            "manager": field_manager(f.removeprefix(FINALIZER_PREFIX))
            if added_by_syncers
            else "kubectl-edit",
            "operation": "Update",
            "fieldsV1": {"f:metadata": {"f:finalizers": {f'v:"{f}"': {}}}},
        }
        for f in finalizers
        if f.startswith(FINALIZER_PREFIX)
    ]
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
    release = SetFinalizers(("other",), "10", verify_gone=(NS, "db"))
    # the copy gone: the mirrored status goes, Synced=False/Released, *then* the finalizer
    synced = upstream(finalizers=(FIN, "other"), deleting=True)
    synced["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": "Synced", "status": "True", "reason": "Synced", "message": "synced"},
            {"type": "Ready", "status": "True"},
        ],
    }
    status, last = plan(KEY, synced, None, tombstone=None, ctx=ctx())
    assert last == release
    assert isinstance(status, PatchStatus)
    assert status.patch["status"]["phase"] is None
    (condition,) = status.patch["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "Released")
    assert condition["message"] == (
        f"the downstream copy {NS}/db is deleted; syncer eu no longer syncs this object"
    )
    # once written, only the release is left
    synced["status"] = {"conditions": [condition]}
    assert plan(KEY, synced, None, tombstone=None, ctx=ctx()) == [release]


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


# --- nothing is written when nothing changed ---------------------------------------------------


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the apiserver applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge(result.get(k), v)
    return result


def kcp_stores(obj: dict[str, Any], patch: dict[str, Any], *, status_fields: set[str]) -> Any:
    """What kcp answers to a status merge patch for a schema whose status has only
    ``status_fields`` (a structural schema prunes the rest, silently)."""
    stored = merge(obj, patch)
    stored["status"] = {k: v for k, v in stored.get("status", {}).items() if k in status_fields}
    stored["metadata"] = {**stored["metadata"], "resourceVersion": "11"}
    return stored


def statuses(actions: list[Any]) -> list[PatchStatus]:
    return [a for a in actions if isinstance(a, PatchStatus)]


def test_schema_without_conditions_settles_after_one_write() -> None:
    """The demo's Widget: status has ``phase`` only. Compared with what was sent, the object never
    looks done; compared with what kcp stored (learned from the answer), it is."""
    up = upstream()
    down = downstream_of(up, status={"phase": "Running", "extra": 1})
    (first,) = statuses(plan(KEY, up, down, tombstone=None, ctx=ctx()))
    assert set(first.patch["status"]) == {"phase", "extra", "conditions"}
    stored = kcp_stores(up, first.patch, status_fields={"phase"})
    facts = learn(first.patch, stored)
    assert facts.pruned == {("status", "conditions"), ("status", "extra")}
    # without the facts, the same object is written again and again
    assert statuses(plan(KEY, stored, down, tombstone=None, ctx=ctx(now=LATER)))
    # with them: nothing, at any later time
    assert statuses(plan(KEY, stored, down, tombstone=None, ctx=ctx(upstream_schema=facts))) == []
    later = ctx(upstream_schema=facts, now=LATER)
    assert kinds(plan(KEY, stored, down, tombstone=None, ctx=later)) == ["EnsureNamespace"]
    # a real change still goes up, without the pruned fields
    changed = downstream_of(up, status={"phase": "Failed", "extra": 2})
    (update,) = statuses(plan(KEY, stored, changed, tombstone=None, ctx=later))
    assert update.patch == {"status": {"phase": "Failed"}}


def test_synced_condition_keeps_its_stored_transition_time() -> None:
    """With conditions in the schema: the mirrored downstream status has no Synced condition, so
    ours must take its lastTransitionTime from kcp, or every later reconcile is a change."""
    up = upstream()
    down = downstream_of(up, status={"phase": "Running", "conditions": [{"type": "Ready"}]})
    (first,) = statuses(plan(KEY, up, down, tombstone=None, ctx=ctx()))
    stored = kcp_stores(up, first.patch, status_fields={"phase", "conditions"})
    assert learn(first.patch, stored) == SchemaFacts()
    assert statuses(plan(KEY, stored, down, tombstone=None, ctx=ctx(now=LATER))) == []
    # the status flips: a new transition time
    failing = dict(stored, metadata={**stored["metadata"], "generation": 3})
    (flip,) = statuses(plan(KEY, failing, down, tombstone=None, ctx=ctx(now=LATER)))
    (synced,) = [c for c in flip.patch["status"]["conditions"] if c["type"] == "Synced"]
    assert synced["lastTransitionTime"] == "2026-01-02T03:04:05Z"  # still True: kept
    assert synced["observedGeneration"] == 3


def test_pruned_condition_fields_are_learned_through_lists() -> None:
    up = upstream()
    (first,) = statuses(plan(KEY, up, None, tombstone=None, ctx=ctx()))
    stored = merge(up, first.patch)
    stored["status"]["conditions"] = [
        {k: v for k, v in c.items() if k != "observedGeneration"}
        for c in stored["status"]["conditions"]
    ]
    facts = learn(first.patch, stored)
    assert facts.pruned == {("status", "conditions", ITEMS, "observedGeneration")}
    assert statuses(plan(KEY, stored, None, tombstone=None, ctx=ctx(upstream_schema=facts))) == []


def test_defaulted_status_field_is_not_removed_again() -> None:
    up = upstream(status={"phase": "Running", "tier": "standard"})
    down = downstream_of(up, status={"phase": "Running"})
    (first,) = statuses(plan(KEY, up, down, tombstone=None, ctx=ctx()))
    assert first.patch["status"]["tier"] is None
    stored = merge(up, first.patch)
    stored["status"]["tier"] = "standard"  # the schema's default, back at once
    facts = learn(first.patch, stored)
    assert facts.defaulted == {("status", "tier")}
    assert statuses(plan(KEY, stored, down, tombstone=None, ctx=ctx(upstream_schema=facts))) == []


def test_error_and_deletion_conditions_are_not_written_when_pruned() -> None:
    pruned = SchemaFacts(pruned=frozenset({("status", "conditions")}))
    up = upstream()
    condition = new_condition(status=False, reason="NotOwned", message="x")
    assert condition_patch(up, condition, now=NOW) is not None
    assert condition_patch(up, condition, now=NOW, schema=pruned) is None
    deleting = upstream(deleting=True)
    down = downstream_of(deleting)
    assert kinds(plan(KEY, deleting, down, tombstone=None, ctx=ctx(upstream_schema=pruned))) == [
        "Delete",
        "Wait",
    ]


def test_downstream_pruned_and_defaulted_fields_are_no_drift() -> None:
    """The downstream schema drops ``spec.version`` and defaults ``spec.mode`` the consumer set
    to null: the copy never has the one and never has null for the other."""
    up = upstream()
    up["spec"]["mode"] = None
    desired = desired_downstream(KEY, up, namespace=NS, ctx=ctx())
    stored = copy.deepcopy(desired)
    stored["metadata"]["uid"] = "d-1"
    del stored["spec"]["version"]
    stored["spec"]["mode"] = "auto"
    facts = learn(desired, stored)
    assert facts == SchemaFacts(
        pruned=frozenset({("spec", "version")}), defaulted=frozenset({("spec", "mode")})
    )
    assert needs_apply(desired, stored)
    assert not needs_apply(desired, stored, schema=facts)
    assert kinds(plan(KEY, up, stored, tombstone=None, ctx=ctx(downstream_schema=facts))) == [
        "EnsureNamespace",
        "PatchStatus",
    ]
    # a changed intent in a pruned field is still applied (once: the digest changes)
    up["spec"]["version"] = "7.0"
    assert needs_apply(desired_downstream(KEY, up, namespace=NS, ctx=ctx()), stored, schema=facts)
    # drift in a field the schema stores is still drift
    drifted = merge(stored, {"spec": {"members": 5}})
    assert needs_apply(desired, drifted, schema=facts)


def test_a_pruned_field_an_object_has_is_compared_again() -> None:
    facts = SchemaFacts(
        pruned=frozenset({("status", "conditions"), ("status", "x", ITEMS, "y")}),
        defaulted=frozenset({("status", "tier")}),
    )
    assert facts.confirmed_by({"status": {}}) is facts
    with_conditions = facts.confirmed_by({"status": {"conditions": []}})
    assert with_conditions.pruned == {("status", "x", ITEMS, "y")}
    assert with_conditions.defaulted == facts.defaulted
    assert facts.confirmed_by({"status": {"x": [{}, {"y": 1}]}}).pruned == {
        ("status", "conditions")
    }


def test_without_copies_only_what_it_changes() -> None:
    value = {"a": {"b": 1, "c": 2}, "l": [{"x": 1, "y": 2}, {"x": 3}], "k": {"z": 1}}
    result = without(value, [("a", "b"), ("l", ITEMS, "y"), ("missing", "path")])
    assert result == {"a": {"c": 2}, "l": [{"x": 1}, {"x": 3}], "k": {"z": 1}}
    assert value["a"] == {"b": 1, "c": 2}  # not modified
    assert result["k"] is value["k"]


def test_contains_takes_null_as_absent() -> None:
    assert contains({"a": 1}, {"a": 1, "b": None})
    assert contains({"a": 1, "b": None}, {"b": None})
    assert not contains({"b": 2}, {"b": None})


# --- two syncers that see the same objects ------------------------------------------------------


@pytest.mark.parametrize(
    "finalizers",
    [(OTHER,), ("example.io/x", OTHER, FIN)],
    ids=["another syncer's only", "both, the other's first"],
)
def test_an_object_another_syncer_owns_is_left_alone(finalizers: tuple[str, ...]) -> None:
    up = upstream(finalizers=finalizers)
    for down in (None, downstream_of(up)):
        actions = plan(KEY, up, down, tombstone=None, ctx=ctx())
        assert kinds(actions) == ["Contested"]  # no finalizer, no apply, no status
        (contested,) = actions
        assert isinstance(contested, Contested) and contested.owner == "us"
        assert "owned by syncer us" in contested.message


def test_finalizers_a_consumer_wrote_are_no_claim() -> None:
    """A consumer who writes another syncer's finalizer (first, before ours) raises no
    "contested" alarm and does not make this syncer stand back: only a syncer's own write is a
    claim. Ours missing, it is added (under our field manager: a claim from then on)."""
    for finalizers in ((OTHER,), (OTHER, FIN)):
        up = upstream(finalizers=finalizers, added_by_syncers=False)
        actions = plan(KEY, up, None, tombstone=None, ctx=ctx())
        assert "Contested" not in kinds(actions)
        assert "Apply" in kinds(actions)
        if FIN not in finalizers:
            assert actions[0] == SetFinalizers((*finalizers, FIN), "10")


def test_both_finalizers_ours_first_is_ours() -> None:
    up = upstream(finalizers=(FIN, OTHER))
    assert kinds(plan(KEY, up, None, tombstone=None, ctx=ctx())) == [
        "EnsureNamespace",
        "Apply",
        "PatchStatus",
    ]


def test_deleting_an_object_another_syncer_owns_cleans_up_only_our_leftovers() -> None:
    """Deleting is no fight: our copy and our finalizer go (else the deletion would hang on it),
    but no status is written on the other syncer's object."""
    up = upstream(finalizers=(OTHER, FIN), deleting=True)
    down = downstream_of(up)
    assert kinds(plan(KEY, up, down, tombstone=None, ctx=ctx())) == ["Contested", "Delete", "Wait"]
    assert plan(KEY, up, None, tombstone=None, ctx=ctx())[1:] == [
        SetFinalizers((OTHER,), "10", verify_gone=(NS, "db"))
    ]
    only_theirs = upstream(finalizers=(OTHER,), deleting=True)
    assert kinds(plan(KEY, only_theirs, None, tombstone=None, ctx=ctx())) == ["Contested"]


# --- metadata the downstream side writes ---------------------------------------------------------

OPERATOR_KEY = "mongodb.com/v1.lastAppliedMongoDBVersion"


def owns(manager: str, *keys: tuple[str, str], subresource: str = "") -> dict[str, Any]:
    """A managedFields entry of the downstream copy: ``manager`` owns these labels/annotations."""
    meta: dict[str, Any] = {}
    for kind, name in keys:
        meta.setdefault(f"f:{kind}", {})[f"f:{name}"] = {}
    entry: dict[str, Any] = {"manager": manager, "fieldsV1": {"f:metadata": meta}}
    if subresource:
        entry["subresource"] = subresource
    return entry


def test_a_key_the_operator_owns_downstream_is_left_to_it() -> None:
    """The consumer sets the operator's own annotation: once the operator has written it on the
    copy (managedFields name it), the syncer's apply leaves it out — no forced apply takes it
    back — and the condition says which key is not copied."""
    up = upstream()
    up["metadata"]["annotations"][OPERATOR_KEY] = "9.9.9"
    first = plan(KEY, up, None, tombstone=None, ctx=ctx())
    (apply,) = [a for a in first if isinstance(a, Apply)]
    assert apply.body["metadata"]["annotations"][OPERATOR_KEY] == "9.9.9"  # nobody else's yet
    down = downstream_of(up)
    down["metadata"]["annotations"][OPERATOR_KEY] = "6.0.5"
    down["metadata"]["managedFields"] = [
        owns(field_manager("eu"), ("labels", "team")),
        owns("mongodb-operator", ("annotations", OPERATOR_KEY)),
        owns("someone", ("labels", "team"), subresource="status"),  # no metadata there
    ]
    actions = plan(KEY, up, down, tombstone=None, ctx=ctx())
    (apply,) = [a for a in actions if isinstance(a, Apply)]
    assert OPERATOR_KEY not in apply.body["metadata"]["annotations"]
    assert apply.body["metadata"]["labels"]["team"] == "x"
    assert apply.overwritten == frozenset()  # a new intent, no round of a fight
    (status,) = [a for a in actions if isinstance(a, PatchStatus)]
    message = status.patch["status"]["conditions"][0]["message"]
    assert message.endswith(f"not copied, written downstream by others: annotation {OPERATOR_KEY}")
    # shared ownership (the same value applied by both) stays ours: still written
    down["metadata"]["managedFields"].append(
        owns(field_manager("eu"), ("annotations", OPERATOR_KEY))
    )
    (apply,) = [a for a in plan(KEY, up, down, tombstone=None, ctx=ctx()) if isinstance(a, Apply)]
    assert apply.body["metadata"]["annotations"][OPERATOR_KEY] == "9.9.9"


def test_a_key_put_back_is_counted_and_a_withheld_key_is_not_written() -> None:
    up = upstream()
    applied = downstream_of(up)
    removed = downstream_of(up)
    del removed["metadata"]["labels"]["team"]  # someone removed it (nobody owns it now)
    actions = plan(KEY, up, removed, tombstone=None, ctx=ctx())
    (apply,) = [a for a in actions if isinstance(a, Apply)]
    assert apply.overwritten == {("labels", "team")}
    assert apply.body["metadata"]["labels"]["team"] == "x"
    # the consumer changes the value: a new intent, not a flip
    changed = upstream()
    changed["metadata"]["labels"]["team"] = "y"
    (apply,) = [
        a for a in plan(KEY, changed, applied, tombstone=None, ctx=ctx()) if isinstance(a, Apply)
    ]
    assert apply.overwritten == frozenset()
    # withheld: not written, reported
    withheld = ctx(withheld=frozenset({("labels", "team")}))
    actions = plan(KEY, up, removed, tombstone=None, ctx=withheld)
    (apply,) = [a for a in actions if isinstance(a, Apply)]
    assert "team" not in apply.body["metadata"]["labels"]
    (status,) = [a for a in actions if isinstance(a, PatchStatus)]
    assert (
        "not copied, written downstream by others: label team"
        in status.patch["status"]["conditions"][0]["message"]
    )
