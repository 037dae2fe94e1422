"""Related resources in the syncer: config validation, templates, the namespace plan
(vwserver.syncer.related_plan) case by case, its place among a primary's actions, and a property:
after convergence the copies are exactly what live primaries reference, a shared related object
stays until its last reference goes."""

from __future__ import annotations

import copy
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vwserver.errors import ConfigError
from vwserver.syncer.config import ResourceConfig, parse_syncer_config
from vwserver.syncer.naming import (
    ANN_SOURCE,
    FINALIZER_PREFIX,
    LABEL_RELATED,
    LABEL_SYNCER,
    ObjectKey,
    downstream_namespace,
    field_manager,
)
from vwserver.syncer.related_plan import (
    CopyApply,
    CopyDelete,
    Inputs,
    Member,
    RelatedPlan,
    Scope,
    member,
    missing_sources,
    outcome,
    owned_copy,
    plan,
)
from vwserver.syncer.related_spec import RelatedSpec, compile_all, parse_template
from vwserver.syncer.sync_plan import (
    CleanNamespace,
    Context,
    PatchStatus,
    RelatedCopies,
    RelatedFailed,
    SetFinalizers,
    Wait,
)
from vwserver.syncer.sync_plan import plan as primary_plan

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SYNCER = "eu"
FIN = f"{FINALIZER_PREFIX}{SYNCER}"
NS = downstream_namespace("c1", "default", prefix="kcp-")
PASSWORD: dict[str, Any] = {
    "name": "password",
    "origin": "kcp",
    "version": "v1",
    "resource": "secrets",
    "kind": "Secret",
    "reference": {"path": "spec.users[*].passwordSecretRef.name"},
}
CONNECTION: dict[str, Any] = {
    "name": "connection",
    "origin": "downstream",
    "version": "v1",
    "resource": "secrets",
    "kind": "Secret",
    "nameTemplate": "{{ .metadata.name }}-{{ .spec.users[*].db }}-{{ .spec.users[*].name }}",
}


def config(*related: dict[str, Any], tmp: Path) -> ResourceConfig:
    for name in ("kcp.kubeconfig", "cluster.kubeconfig"):
        (tmp / name).write_text("{}")
    raw = {
        "name": SYNCER,
        "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": ["https://vw/services/x/y"]},
        "downstream": {"kubeconfig": "cluster.kubeconfig"},
        "resources": [
            {
                "group": "mongodbcommunity.mongodb.com",
                "version": "v1",
                "resource": "mongodbcommunity",
                "kind": "MongoDBCommunity",
                "related": list(related),
            }
        ],
    }
    return parse_syncer_config(raw, base_dir=tmp).resources[0]


@pytest.fixture
def resource(tmp_path: Path) -> ResourceConfig:
    return config(PASSWORD, CONNECTION, tmp=tmp_path)


@pytest.fixture
def specs(resource: ResourceConfig) -> tuple[RelatedSpec, ...]:
    return compile_all(resource)


# --- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Password"}, "$.resources[0].related[0].name"),
        ({"origin": "up"}, "$.resources[0].related[0].origin"),
        ({"resource": "Secrets"}, "$.resources[0].related[0].resource"),
        ({"reference": {"path": ".spec.x"}}, "$.resources[0].related[0].reference.path"),
        ({"reference": {"path": "spec.x[0]"}}, "$.resources[0].related[0].reference.path"),
        ({"reference": None}, "$.resources[0].related[0]"),
        ({"selector": {"matchLabels": {"a": "b"}}}, "$.resources[0].related[0]"),
        (
            {"reference": None, "selector": {}},
            "$.resources[0].related[0].selector",
        ),
        (
            {"reference": None, "selector": {"matchLabels": {"a b": "c"}}},
            "$.resources[0].related[0].selector",
        ),
        (
            {"reference": None, "nameTemplate": "{{ .spec.a[*].x }}-{{ .spec.b[*].y }}"},
            "$.resources[0].related[0].nameTemplate",
        ),
        (
            {"reference": None, "nameTemplate": "{{ name }}"},
            "$.resources[0].related[0].nameTemplate",
        ),
        (
            {"reference": None, "nameTemplate": "a-{{ .name"},
            "$.resources[0].related[0].nameTemplate",
        ),
        ({"targetName": "{{ .data[*].x }}"}, "$.resources[0].related[0].targetName"),
        ({"keys": [""]}, "$.resources[0].related[0].keys[0]"),
        (
            {"resource": "mongodbcommunity", "group": "mongodbcommunity.mongodb.com"},
            "$.resources[0].related[0].resource",
        ),
    ],
)
def test_related_config_errors_name_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    entry = {**PASSWORD, **change}
    entry = {k: v for k, v in entry.items() if v is not None}
    with pytest.raises(ConfigError) as caught:
        config(entry, tmp=tmp_path)
    assert caught.value.field == field, caught.value


def test_duplicate_related_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        config(PASSWORD, {**CONNECTION, "name": "password"}, tmp=tmp_path)
    assert caught.value.field == "$.resources[0].related[1].name"


def test_the_example_shape_compiles(specs: tuple[RelatedSpec, ...], tmp_path: Path) -> None:
    password, connection = specs
    assert password.copies_down and not connection.copies_down
    assert password.label.startswith("password-") and len(password.label) <= 63
    # the same entry name under another primary resource: another label (other copies)
    other = config(PASSWORD, tmp=tmp_path)
    other = ResourceConfig(
        group="other.io", version="v1", resource="things", kind="Thing", related=other.related
    )
    assert compile_all(other)[0].label != password.label


# --- templates ---------------------------------------------------------------------------------

MONGO = {
    "metadata": {"name": "orders", "namespace": "default"},
    "spec": {
        "users": [
            {"name": "app", "db": "admin", "passwordSecretRef": {"name": "pw-app"}},
            {"name": "ro", "db": "admin", "passwordSecretRef": {"name": "pw-ro"}},
            {"name": "nodb"},
            {"name": "UPPER", "db": "admin"},
        ]
    },
}


@pytest.mark.parametrize(
    ("template", "names"),
    [
        (
            "{{ .metadata.name }}-{{ .spec.users[*].db }}-{{ .spec.users[*].name }}",
            {"orders-admin-app", "orders-admin-ro"},  # no db: no name; UPPER: not a name
        ),
        ("{{ .name }}-admin", {"orders-admin"}),
        ("{{.namespace}}.{{.name}}", {"default.orders"}),
        ("{{ .spec.missing }}-x", set()),
        ("{{ .spec.users[*].passwordSecretRef.name }}", {"pw-app", "pw-ro"}),
        ("{{ .spec.users }}", set()),  # not a scalar
        ("fixed", {"fixed"}),
    ],
)
def test_name_templates(template: str, names: set[str]) -> None:
    assert parse_template(template, field="f").render(MONGO) == names


def test_a_target_template_over_the_related_object(tmp_path: Path) -> None:
    (spec,) = compile_all(config({**PASSWORD, "targetName": "{{ .name }}-copy"}, tmp=tmp_path))
    assert spec.target_name({"metadata": {"name": "pw"}}) == "pw-copy"


# --- the plan ----------------------------------------------------------------------------------


def primary(
    name: str,
    *secrets: str,
    claimed: bool = True,
    deleting: bool = False,
    users: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    finalizers = [FIN] if claimed else []
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"u-{name}",
        "annotations": {"kcp.io/cluster": "c1"},
        "finalizers": finalizers,
        "managedFields": [
            {
                "manager": field_manager(SYNCER),
                "operation": "Update",
                "fieldsV1": {"f:metadata": {"f:finalizers": {f'v:"{FIN}"': {}}}},
            }
        ]
        if claimed
        else [],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec_users = users or [{"passwordSecretRef": {"name": s}} for s in secrets]
    return {
        "apiVersion": "m/v1",
        "kind": "MongoDBCommunity",
        "metadata": meta,
        "spec": {"users": spec_users},
    }


def secret(name: str, namespace: str = "default", **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"s-{name}",
            "labels": {"app": "db"},
            "annotations": {"kcp.io/cluster": "c1", "note": "n"},
        },
        "type": "Opaque",
        "data": data or {"password": "cHc="},
    }


def stored(body: dict[str, Any], *, uid: str = "c") -> dict[str, Any]:
    """What a server stores for an apply of ``body`` by the syncer."""
    obj = copy.deepcopy(body)
    obj["metadata"]["uid"] = f"{uid}-{obj['metadata']['name']}"
    obj["metadata"]["managedFields"] = [
        {
            "manager": field_manager(SYNCER),
            "operation": "Apply",
            "fieldsV1": {"f:metadata": {"f:labels": {f"f:{LABEL_SYNCER}": {}}}},
        }
    ]
    return obj


def scope(current: str | None = "a", *, may_delete: bool = True) -> Scope:
    return Scope(
        cluster="c1",
        namespace="default",
        downstream_namespace=NS,
        syncer=SYNCER,
        current=None if current is None else ObjectKey("c1", "default", current),
        may_delete=may_delete,
    )


def members(
    *objs: dict[str, Any], current: str = "a", down: dict[str, Any] | None = None
) -> list[Member]:
    out = []
    for obj in objs:
        key = ObjectKey("c1", "default", obj["metadata"]["name"])
        d = (down or {}).get(obj["metadata"]["name"])
        m = member(
            key, obj, d, syncer=SYNCER, current=ObjectKey("c1", "default", current), too_large=False
        )
        if m is not None:
            out.append(m)
    return out


def one(spec: RelatedSpec, inputs: Inputs, ms: list[Member], sc: Scope) -> RelatedPlan:
    return plan([spec], {spec.name: inputs}, members=ms, scope=sc)


def pw_copy(spec: RelatedSpec) -> dict[str, Any]:
    """The body of the copy down of Secret ``pw``, referenced by primary ``a`` alone."""
    apply = one(
        spec, Inputs(sources={"pw": secret("pw")}, copies={}), members(primary("a", "pw")), scope()
    ).down[0]
    assert isinstance(apply, CopyApply)
    return apply.body


def test_a_referenced_secret_is_copied_down_with_its_data_and_links(
    specs: tuple[RelatedSpec, ...],
) -> None:
    password = specs[0]
    result = one(
        password,
        Inputs(sources={"pw": secret("pw")}, copies={}),
        members(primary("a", "pw")),
        scope(),
    )
    (apply,) = result.down
    assert isinstance(apply, CopyApply) and apply.create
    assert (apply.namespace, apply.name) == (NS, "pw")
    meta = apply.body["metadata"]
    assert meta["labels"][LABEL_SYNCER] == SYNCER
    assert meta["labels"][LABEL_RELATED] == password.label
    assert meta["labels"]["app"] == "db"
    assert "kcp.io/cluster" not in meta["annotations"]
    assert meta["annotations"][ANN_SOURCE] == "default/pw"
    assert apply.body["data"] == {"password": "cHc="} and apply.body["type"] == "Opaque"
    assert result.up == [] and result.problems == [] and not result.pending


def test_in_step_copies_need_nothing(specs: tuple[RelatedSpec, ...]) -> None:
    password = specs[0]
    first = one(
        password,
        Inputs(sources={"pw": secret("pw")}, copies={}),
        members(primary("a", "pw")),
        scope(),
    )
    copies = {"pw": stored(first.down[0].body)}  # type: ignore[union-attr]
    again = one(
        password,
        Inputs(sources={"pw": secret("pw")}, copies=copies),
        members(primary("a", "pw")),
        scope(),
    )
    assert again.down == [] and again.down_copies == 1
    # a changed Secret: applied again (an update of our own copy, not a create)
    changed = one(
        password,
        Inputs(sources={"pw": secret("pw", password="bmV3")}, copies=copies),
        members(primary("a", "pw")),
        scope(),
    )
    (apply,) = changed.down
    assert isinstance(apply, CopyApply) and not apply.create
    assert apply.body["data"] == {"password": "bmV3"}


def test_keys_select_the_data_copied(tmp_path: Path) -> None:
    (spec,) = compile_all(config({**PASSWORD, "keys": ["password"]}, tmp=tmp_path))
    result = one(
        spec,
        Inputs(sources={"pw": secret("pw", password="cA==", other="bw==")}, copies={}),
        members(primary("a", "pw")),
        scope(),
    )
    assert result.down[0].body["data"] == {"password": "cA=="}  # type: ignore[union-attr]


def test_a_missing_source_is_a_note_not_an_error(specs: tuple[RelatedSpec, ...]) -> None:
    result = one(specs[0], Inputs(sources={}, copies={}), members(primary("a", "pw")), scope())
    assert result.down == [] and result.problems == []
    assert result.notes == ["related password default/pw: not found"]


def test_a_new_primary_reads_the_sources_it_names_that_are_not_cached_yet(
    specs: tuple[RelatedSpec, ...],
) -> None:
    """The slice shows a Secret once a visible object names it, so its watch event may come
    after the primary's: a new primary's uncached sources are read live before its copy is
    made — only those, only for origin kcp, only while it has no copy and is not deleting."""
    password, connection = specs
    up = primary("a", "pw", "cached")
    cached = {"cached": secret("cached")}

    def missing(spec: RelatedSpec, obj: Any, down: Any, sources: Any) -> frozenset[str]:
        key = ObjectKey("c1", "default", "a")
        m = member(key, obj, down, syncer=SYNCER, current=key, too_large=False)
        return missing_sources(spec, m, sources)

    assert missing(password, up, None, cached) == {"pw"}
    assert missing(password, primary("a", "pw", claimed=False), None, {}) == {"pw"}  # claimed now
    assert missing(password, up, None, {**cached, "pw": secret("pw")}) == frozenset()
    assert missing(password, up, copy.deepcopy(up), cached) == frozenset()  # it has a copy
    assert missing(password, primary("a", "pw", deleting=True), None, {}) == frozenset()
    assert missing(password, None, None, {}) == frozenset()
    other = primary("a", "pw", claimed=False)
    other["metadata"]["finalizers"] = ["sync.edge-connect.eu/syncer-us"]
    other["metadata"]["managedFields"] = [
        {
            "manager": field_manager("us"),
            "operation": "Update",
            "fieldsV1": {
                "f:metadata": {"f:finalizers": {'v:"sync.edge-connect.eu/syncer-us"': {}}}
            },
        }
    ]
    assert missing(password, other, None, {}) == frozenset()  # another syncer's
    users = [{"name": "app", "db": "admin"}]
    assert missing(connection, primary("a", users=users), None, {}) == frozenset()


def test_a_copy_nothing_references_is_deleted_but_a_shared_one_stays(
    specs: tuple[RelatedSpec, ...],
) -> None:
    password = specs[0]
    sources = {"pw": secret("pw"), "old": secret("old")}
    bodies = one(
        password, Inputs(sources=sources, copies={}), members(primary("a", "pw", "old")), scope()
    ).down
    copies = {a.name: stored(a.body) for a in bodies if isinstance(a, CopyApply)}
    # a stops naming "old", b still names "pw": "old" goes, "pw" stays
    result = one(
        password,
        Inputs(sources=sources, copies=copies),
        members(primary("a"), primary("b", "pw")),
        scope(),
    )
    assert [(type(a).__name__, a.name) for a in result.down] == [("CopyDelete", "old")]
    assert result.pending  # the deletion is not seen yet
    assert result.down_copies == 1


def test_nothing_is_deleted_before_the_caches_have_listed(specs: tuple[RelatedSpec, ...]) -> None:
    password = specs[0]
    copies = {"pw": stored(pw_copy(password))}
    result = one(
        password, Inputs(sources={"pw": secret("pw")}, copies=copies), [], scope(may_delete=False)
    )
    assert result.down == [] and result.pending


def test_a_stub_primary_keeps_every_copy(specs: tuple[RelatedSpec, ...]) -> None:
    password = specs[0]
    copies = {"pw": stored(pw_copy(password))}
    unknown = Member(ObjectKey("c1", "default", "big"), "unknown")
    result = one(password, Inputs(sources={"pw": secret("pw")}, copies=copies), [unknown], scope())
    assert result.down == [] and not result.pending


def test_objects_that_are_not_our_copies_are_never_deleted(
    specs: tuple[RelatedSpec, ...],
) -> None:
    password = specs[0]
    body = pw_copy(password)
    forged = copy.deepcopy(body)  # our labels, written by a consumer's own field manager
    forged["metadata"]["managedFields"] = [
        {"manager": "kubectl", "fieldsV1": {"f:metadata": {"f:labels": {f"f:{LABEL_SYNCER}": {}}}}}
    ]
    assert not owned_copy(forged, syncer=SYNCER, label=password.label)
    other = stored(body)
    other["metadata"]["labels"][LABEL_SYNCER] = "us"
    result = one(password, Inputs(sources={}, copies={"pw": forged, "x": other}), [], scope())
    assert result.down == []


def test_the_old_reference_stays_until_the_downstream_copy_is_updated(
    specs: tuple[RelatedSpec, ...],
) -> None:
    """a's kcp object names new; its downstream copy still names old: old's copy stays."""
    password = specs[0]
    sources = {"old": secret("old"), "new": secret("new")}
    copies = {
        "old": stored(
            one(password, Inputs(sources=sources, copies={}), members(primary("a", "old")), scope())
            .down[0]
            .body
        )
    }  # type: ignore[union-attr]
    ms = members(primary("a", "new"), down={"a": primary("a", "old")})
    result = one(password, Inputs(sources=sources, copies=copies), ms, scope())
    assert [(type(a).__name__, a.name) for a in result.down] == [("CopyApply", "new")]
    ms = members(primary("a", "new"), down={"a": primary("a", "new")})
    result = one(password, Inputs(sources=sources, copies=copies), ms, scope())
    assert ("CopyDelete", "old") in [(type(a).__name__, a.name) for a in result.down]


def test_roles() -> None:
    key = ObjectKey("c1", "default", "a")
    other = ObjectKey("c1", "default", "b")
    assert (
        member(key, primary("a"), None, syncer=SYNCER, current=key, too_large=False).role == "syncs"
    )  # type: ignore[union-attr]
    unclaimed = primary("a", claimed=False)
    assert member(key, unclaimed, None, syncer=SYNCER, current=key, too_large=False).role == "syncs"  # type: ignore[union-attr]
    assert (
        member(key, unclaimed, None, syncer=SYNCER, current=other, too_large=False).role == "keeps"
    )  # type: ignore[union-attr]
    deleting = primary("a", deleting=True)
    assert member(key, deleting, None, syncer=SYNCER, current=key, too_large=False) is None
    assert (
        member(key, deleting, {"x": 1}, syncer=SYNCER, current=key, too_large=False).role == "keeps"
    )  # type: ignore[union-attr]
    assert (
        member(key, primary("a"), None, syncer=SYNCER, current=key, too_large=True).role
        == "unknown"
    )  # type: ignore[union-attr]
    theirs = primary("a", claimed=False)
    theirs["metadata"]["finalizers"] = [f"{FINALIZER_PREFIX}us"]
    theirs["metadata"]["managedFields"] = [
        {
            "manager": field_manager("us"),
            "fieldsV1": {"f:metadata": {"f:finalizers": {f'v:"{FINALIZER_PREFIX}us"': {}}}},
        }
    ]
    assert member(key, theirs, None, syncer=SYNCER, current=key, too_large=False) is None


def test_problems_too_large_collision_and_copies_as_sources(tmp_path: Path) -> None:
    (spec,) = compile_all(config({**PASSWORD, "targetName": "shared"}, tmp=tmp_path))
    copied = secret("c")
    copied["metadata"]["labels"][LABEL_SYNCER] = "us"
    inputs = Inputs(
        sources={"a1": secret("a1"), "a2": secret("a2"), "big": secret("big"), "c": copied},
        copies={},
        too_large={"big": "the object is 2000000 bytes, more than ..."},
    )
    result = one(spec, inputs, members(primary("a", "a1", "a2", "big", "c")), scope())
    reasons = sorted(p.reason for p in result.problems)
    assert reasons == ["Invalid", "Invalid", "ObjectTooLarge"]
    assert len(result.down) == 1  # a1 → shared; a2 would collide with it


def test_copies_up_are_found_by_template_in_the_downstream_copy(
    specs: tuple[RelatedSpec, ...],
) -> None:
    connection = specs[1]
    users = [{"name": "app", "db": "admin"}]
    up = primary("orders", users=users)
    down = copy.deepcopy(up)
    down["metadata"]["namespace"] = NS
    conn = secret("orders-admin-app", namespace=NS, uri="bW9uZ28=")
    result = one(
        connection,
        Inputs(sources={"orders-admin-app": conn}, copies={}),
        members(up, current="orders", down={"orders": down}),
        scope("orders"),
    )
    (apply,) = result.up
    assert isinstance(apply, CopyApply) and not apply.down
    assert (apply.namespace, apply.name) == ("default", "orders-admin-app")
    assert apply.body["metadata"]["annotations"][ANN_SOURCE] == f"{NS}/orders-admin-app"
    # without the downstream copy there is nothing to find yet
    result = one(
        connection,
        Inputs(sources={"orders-admin-app": conn}, copies={}),
        members(up, current="orders"),
        scope("orders"),
    )
    assert result.up == [] and result.notes == []


def test_selector_finds_labelled_objects(tmp_path: Path) -> None:
    entry = {**PASSWORD, "selector": {"matchLabels": {"app": "db"}}}
    del entry["reference"]
    (spec,) = compile_all(config(entry, tmp=tmp_path))
    other = secret("x")
    other["metadata"]["labels"] = {"app": "web"}
    result = one(
        spec,
        Inputs(sources={"pw": secret("pw"), "x": other}, copies={}),
        members(primary("a")),
        scope(),
    )
    assert [a.name for a in result.down] == ["pw"]


# --- among the primary's actions -------------------------------------------------------------


def ctx(resource: ResourceConfig, **overrides: Any) -> Context:
    values: dict[str, Any] = {
        "syncer": SYNCER,
        "finalizer": FIN,
        "resource": resource,
        "namespace_prefix": "kcp-",
        "may_delete_orphans": True,
        "now": NOW,
    }
    values.update(overrides)
    return Context(**values)


def test_copies_down_come_before_the_primary_and_up_after(
    resource: ResourceConfig, specs: tuple[RelatedSpec, ...]
) -> None:
    key = ObjectKey("c1", "default", "a")
    down = CopyApply("password", True, NS, "pw", {}, True)
    up = CopyApply("connection", False, "default", "a-x-y", {}, True)
    related = outcome(RelatedPlan(down=[down], up=[up], notes=["related password x: not found"]))
    actions = primary_plan(
        key, primary("a", "pw"), None, tombstone=None, ctx=ctx(resource, related=related)
    )
    names = [type(a).__name__ for a in actions]
    assert names == ["EnsureNamespace", "RelatedCopies", "Apply", "RelatedCopies", "PatchStatus"]
    status = actions[-1]
    assert isinstance(status, PatchStatus)
    assert "related password x: not found" in str(status.patch)
    failing = outcome(RelatedPlan(down=[down], problems=[]))
    failing = type(failing)(down=failing.down, problems=(("ObjectTooLarge", "too big"),))
    actions = primary_plan(
        key, primary("a", "pw"), None, tombstone=None, ctx=ctx(resource, related=failing)
    )
    assert isinstance(actions[-1], RelatedFailed) and actions[-1].reason == "ObjectTooLarge"
    assert not any(isinstance(a, PatchStatus) for a in actions)


def test_the_finalizer_waits_for_the_related_copies(resource: ResourceConfig) -> None:
    key = ObjectKey("c1", "default", "a")
    gone = CopyDelete("password", True, NS, "pw", "c-pw")
    deleting = primary("a", "pw", deleting=True)
    waiting = primary_plan(
        key,
        deleting,
        None,
        tombstone=None,
        ctx=ctx(resource, related=outcome(RelatedPlan(down=[gone], pending=True))),
    )
    assert isinstance(waiting[0], RelatedCopies)
    assert isinstance(waiting[-1], Wait)
    assert not any(isinstance(a, SetFinalizers) for a in waiting)
    done = primary_plan(
        key,
        deleting,
        None,
        tombstone=None,
        ctx=ctx(resource, related=outcome(RelatedPlan()), namespace_unused=True),
    )
    assert [type(a).__name__ for a in done] == ["PatchStatus", "SetFinalizers", "CleanNamespace"]
    assert done[-1] == CleanNamespace(NS)


def test_a_gone_namespace_key_sweeps_its_copies(resource: ResourceConfig) -> None:
    sweep = CopyDelete("password", True, NS, "pw", "c-pw")
    actions = primary_plan(
        ObjectKey("c1", "default", ""),
        None,
        None,
        tombstone=None,
        ctx=ctx(resource, related=outcome(RelatedPlan(down=[sweep])), namespace_unused=True),
    )
    assert actions == [RelatedCopies((sweep,)), CleanNamespace(NS)]


# --- the property ------------------------------------------------------------------------------

SECRETS = ["s0", "s1", "s2", "s3"]


def converge(
    spec: RelatedSpec,
    primaries: dict[str, list[str]],
    sources: dict[str, dict[str, Any]],
    copies: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Run the plan for each primary (and the namespace key) until nothing changes; copies are
    applied and deleted as a server would."""
    for _ in range(10):
        changed = False
        keys = list(primaries) or [""]
        for current in keys:
            ms = members(*(primary(n, *refs) for n, refs in primaries.items()), current=current)
            result = one(spec, Inputs(sources=sources, copies=copies), ms, scope(current))
            for action in result.down:
                changed = True
                if isinstance(action, CopyApply):
                    copies[action.name] = stored(action.body)
                else:
                    copies.pop(action.name, None)
        if not changed:
            return copies
    raise AssertionError("the plan does not converge")


_PROPERTY_SPEC = compile_all(config(PASSWORD, tmp=Path(tempfile.mkdtemp())))[0]


@settings(max_examples=150, deadline=None)
@given(
    refs=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.lists(st.sampled_from(SECRETS), max_size=3),
        max_size=4,
    ),
    present=st.sets(st.sampled_from(SECRETS)),
    order=st.permutations(["a", "b", "c", "d"]),
)
def test_converged_copies_are_the_referenced_set_and_shared_ones_live_until_the_last_ref(
    refs: dict[str, list[str]],
    present: set[str],
    order: list[str],
) -> None:
    password = _PROPERTY_SPEC
    sources = {name: secret(name) for name in present}
    copies = converge(password, dict(refs), sources, {})
    primaries = dict(refs)
    while True:
        wanted = {s for r in primaries.values() for s in r} & present
        assert set(copies) == wanted
        for name, obj in copies.items():  # each copy is the source's content
            assert obj["data"] == sources[name]["data"]
        if not primaries:
            break
        gone = next(n for n in order if n in primaries)
        del primaries[gone]  # its deletion: the plan runs for it with it no longer a member
        copies = converge(password, primaries, sources, copies)
