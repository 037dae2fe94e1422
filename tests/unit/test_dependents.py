"""The pure half of the dependents check (:mod:`vwserver.proxy.dependents`) and the store's
per-cluster range it reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vwserver.cache.entries import entry
from vwserver.cache.store import Store
from vwserver.proxy.dependents import depends_on, has_hidden, orphans


def obj(
    cluster: str, ns: str, name: str, *, owners: tuple[str, ...] = (), env: str = "prod"
) -> Any:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{cluster}-{ns}-{name}",
        "resourceVersion": "5",
        "labels": {"env": env},
        "annotations": {"kcp.io/cluster": cluster},
    }
    if owners:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "W", "name": "o", "uid": u} for u in owners
        ]
    return entry(json.dumps({"metadata": meta}).encode())


@pytest.mark.parametrize(
    ("options", "finalizers", "expected"),
    [
        ({}, None, False),  # custom resources: Background
        ({"propagationPolicy": "Orphan"}, None, True),
        ({"propagationPolicy": "Background"}, ["orphan"], False),
        ({"propagationPolicy": "Foreground"}, None, False),
        ({"orphanDependents": True}, None, True),
        ({"orphanDependents": False}, ["orphan"], False),
        ({"orphanDependents": True, "propagationPolicy": "Background"}, None, True),
        ({}, ["orphan"], True),
        ({}, ["foregroundDeletion"], False),
        ({}, ["x", "foregroundDeletion", "orphan"], False),  # the first one decides
    ],
)
def test_orphans(options: dict[str, Any], finalizers: list[str] | None, expected: bool) -> None:
    assert orphans(options, finalizers=finalizers) is expected


def test_depends_on_reads_owner_references_not_bytes() -> None:
    owner = obj("c1", "ns", "o")
    assert not depends_on(owner, "uid-c1-ns-o")  # its own uid is no owner reference
    dep = obj("c1", "ns", "d", owners=("u1", "u2"))
    assert depends_on(dep, "u2") and not depends_on(dep, "u3") and not depends_on(dep, "")


def test_entries_of_one_cluster_and_namespace() -> None:
    store = Store()
    items = [obj(c, ns, n) for c in ("a", "b", "c") for ns in ("", "x", "y") for n in ("1", "2")]
    store.replace(items, 10)
    got = store.entries_of("b")
    assert {(e.meta.cluster, e.meta.namespace) for e in got} == {("b", ""), ("b", "x"), ("b", "y")}
    assert len(got) == 6
    got = store.entries_of("b", namespace="x")
    assert [(e.meta.cluster, e.meta.namespace, e.meta.name) for e in got] == [
        ("b", "x", "1"),
        ("b", "x", "2"),
    ]
    assert store.entries_of("zz") == [] and store.entries_of("a", namespace="q") == []


def test_has_hidden() -> None:
    entries = [
        obj("c1", "ns", "d1", owners=("u",)),
        obj("c1", "ns", "d2", owners=("u",), env="dev"),
    ]
    prod = lambda meta: meta.labels.get("env") == "prod"  # noqa: E731
    assert has_hidden(entries, uid="u", in_slice=prod)
    assert not has_hidden(entries[:1], uid="u", in_slice=prod)
    assert not has_hidden(entries, uid="other", in_slice=prod)
