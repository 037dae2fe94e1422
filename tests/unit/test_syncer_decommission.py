"""The pure decisions of ``vwserver sync --decommission`` (vwserver.syncer.decommission)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from fakekcp.patch import PatchError, apply_json_patch
from vwserver.syncer.decommission import (
    Summary,
    finalizer_patch,
    lease_holder,
    leftovers,
    namespace_is_ours,
)
from vwserver.syncer.naming import (
    ANN_CLUSTER,
    ANN_NAMESPACE,
    LABEL_MANAGED,
    downstream_namespace,
    finalizer,
)

OURS = finalizer("eu")


def obj(*finalizers: str, rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"name": "db", "resourceVersion": rv, "finalizers": list(finalizers)}}


def test_only_our_entry_is_removed_and_only_from_the_version_read() -> None:
    read = obj("a.io/x", OURS, finalizer("us"))
    patch = finalizer_patch(read, OURS)
    assert patch is not None
    assert apply_json_patch(read, patch)["metadata"]["finalizers"] == ["a.io/x", finalizer("us")]
    # another writer changed the list meanwhile: the test on the index fails, nothing removed
    for changed in (obj(OURS, finalizer("us")), obj("a.io/x", OURS, finalizer("us"), rv="8")):
        with pytest.raises(PatchError) as info:
            apply_json_patch(changed, patch)
        assert not info.value.malformed  # the apiserver answers 422: re-read and retry


def test_nothing_to_do_without_our_finalizer() -> None:
    assert finalizer_patch(obj("a.io/x", finalizer("us")), OURS) is None
    assert finalizer_patch({"metadata": {}}, OURS) is None


def test_a_namespace_is_ours_only_if_our_config_derives_its_name() -> None:
    name = downstream_namespace("c1", "default", prefix="kcp-")
    ns = {
        "metadata": {
            "name": name,
            "labels": {LABEL_MANAGED: "true"},
            "annotations": {ANN_CLUSTER: "c1", ANN_NAMESPACE: "default"},
        }
    }
    assert namespace_is_ours(ns, prefix="kcp-")
    assert not namespace_is_ours(ns, prefix="other-")  # another syncer's naming
    assert not namespace_is_ours({"metadata": {**ns["metadata"], "labels": {}}}, prefix="kcp-")
    renamed = {"metadata": {**ns["metadata"], "name": "kcp-squatter"}}
    assert not namespace_is_ours(renamed, prefix="kcp-")


def test_leftovers_ignore_what_every_namespace_has() -> None:
    listings = {
        ("", "serviceaccounts"): [{"metadata": {"name": "default"}}],
        ("", "configmaps"): [{"metadata": {"name": "kube-root-ca.crt"}}],
        ("", "events"): [{"metadata": {"name": "db.17a"}}],
        ("events.k8s.io", "events"): [{"metadata": {"name": "db.17a"}}],
        ("apps", "deployments"): [],
    }
    assert leftovers(listings) == []
    listings[("", "secrets")] = [{"metadata": {"name": "db-password"}}]
    listings[("", "serviceaccounts")].append({"metadata": {"name": "operator"}})
    assert leftovers(listings) == ["secrets/db-password", "serviceaccounts/operator"]


def test_lease_holder() -> None:
    now = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)

    def lease(holder: str, renewed_ago: float) -> dict[str, Any]:
        renew = (now - datetime.timedelta(seconds=renewed_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew}}

    assert lease_holder(lease("pod-1", 3), now=now) == "pod-1"
    assert lease_holder(lease("pod-1", 60), now=now) is None  # crashed long ago: expired
    assert lease_holder(lease("", 0), now=now) is None  # released on shutdown
    assert lease_holder(None, now=now) is None


def test_summary_decides_the_exit_code() -> None:
    summary = Summary("eu", finalizers_removed=["mongodbcommunity c1/default/db"], objects_seen=3)
    assert summary.clean
    text = "\n".join(summary.lines(downstream=False))
    assert "finalizers removed: 1 (of 3 objects seen upstream)" in text
    assert "result: clean" in text
    summary.copies_terminating.append("mongodbcommunity kcp-x/db")
    assert not summary.clean
    assert "run again" in "\n".join(summary.lines(downstream=True))
