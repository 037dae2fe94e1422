"""Downstream naming and link metadata (vwserver.syncer.naming): pure functions."""

from __future__ import annotations

import itertools
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from vwserver.syncer.naming import (
    ANN_CLUSTER,
    ANN_NAMESPACE,
    FINALIZER_PREFIX,
    LABEL_SYNCER,
    ObjectKey,
    downstream_namespace,
    field_manager,
    finalizer,
    finalizer_owner,
    is_internal_key,
    link_labels,
    namespace_conflict,
    owned_by,
    source_key,
    upstream_key,
    user_metadata,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
clusters = st.from_regex(r"[a-z0-9]{1,16}|root", fullmatch=True)
namespaces = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)


@given(clusters, namespaces, st.sampled_from(["", "kcp-", "a-very-long-prefix-x-"]))
def test_namespace_is_a_dns_label_and_deterministic(cluster: str, ns: str, prefix: str) -> None:
    name = downstream_namespace(cluster, ns, prefix=prefix)
    assert DNS_LABEL.match(name), name
    assert len(name) <= 63
    assert name.startswith(prefix)
    assert name == downstream_namespace(cluster, ns, prefix=prefix)


def test_namespace_is_readable_when_short() -> None:
    assert downstream_namespace("2fx3m0rnxzbs8mq9", "default", prefix="kcp-").startswith(
        "kcp-2fx3m0rnxzbs8mq9-default-"
    )


def test_namespaces_do_not_collide() -> None:
    """Pairs whose readable parts are equal ('a-b' + 'c' vs 'a' + 'b-c'), or equal after
    truncation, still get different names."""
    long = "x" * 63
    pairs = [("a-b", "c"), ("a", "b-c"), ("c1", long), ("c1", long[:-1] + "y"), ("c2", long)]
    pairs += [(c, n) for c, n in itertools.product(["c1", "c2", "root"], ["default", "team-a"])]
    names = {downstream_namespace(c, n, prefix="kcp-") for c, n in pairs}
    assert len(names) == len(pairs)


def test_kcp_internal_and_own_keys_are_never_copied() -> None:
    values = {
        "kcp.io/cluster": "x",
        "apis.kcp.io/binding": "x",
        "claimed.internal.apis.kcp.io/abc": "x",
        "tenancy.kcp.io/workspace": "x",
        "sync.edge-connect.eu/syncer": "forged",
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
        "app.kubernetes.io/name": "db",
        "team": "payments",
        "notkcp.io/x": "kept",  # only kcp.io and its subdomains are internal
        "company.example/internal": "dropped by config",
    }
    kept = user_metadata(values, extra_prefixes=["company.example/"])
    assert kept == {"app.kubernetes.io/name": "db", "team": "payments", "notkcp.io/x": "kept"}
    assert is_internal_key("kcp.io/cluster")
    assert not is_internal_key("kcp.io")  # a plain key without a prefix


def test_link_metadata_round_trip() -> None:
    key = ObjectKey("c1", "default", "db")
    labels = link_labels(key, uid="u-1", syncer="eu")
    obj = {
        "metadata": {
            "labels": labels,
            "annotations": {
                ANN_CLUSTER: "c1",
                ANN_NAMESPACE: "default",
                "sync.edge-connect.eu/name": "db",
            },
        }
    }
    assert source_key(obj) == key
    assert owned_by(obj, "eu")
    assert not owned_by(obj, "us")
    assert not owned_by({"metadata": {"labels": {LABEL_SYNCER + "x": "eu"}}}, "eu")
    assert source_key({"metadata": {}}) is None
    assert upstream_key(
        {"metadata": {"name": "db", "namespace": "ns", "annotations": {"kcp.io/cluster": "c"}}}
    ) == ObjectKey("c", "ns", "db")
    assert upstream_key({"metadata": {"name": "db"}}) is None


def test_namespace_conflict() -> None:
    ours = {"metadata": {"name": "n", "annotations": {ANN_CLUSTER: "c", ANN_NAMESPACE: "ns"}}}
    assert namespace_conflict(ours, cluster="c", namespace="ns") is None
    assert "belongs to c/ns" in (namespace_conflict(ours, cluster="d", namespace="ns") or "")
    foreign = {"metadata": {"name": "n"}}
    assert "not created by a syncer" in (
        namespace_conflict(foreign, cluster="c", namespace="ns") or ""
    )


def test_finalizer_name() -> None:
    assert finalizer("eu") == "sync.edge-connect.eu/syncer-eu"


def added_by(manager: str, *finalizers: str, subresource: str = "") -> dict[str, Any]:
    """A managedFields entry: ``manager`` owns these members of ``metadata.finalizers``."""
    owned = {f'v:"{f}"': {} for f in finalizers}
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": "Update",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:finalizers": {".": {}, **owned}}},
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def test_the_first_claimed_syncer_finalizer_owns_the_object() -> None:
    eu, us = finalizer("eu"), finalizer("us")
    by_syncers = [added_by(field_manager("eu"), eu), added_by(field_manager("us"), us)]
    assert finalizer_owner([], managed_fields=by_syncers) is None
    assert (
        finalizer_owner(["example.io/other", FINALIZER_PREFIX], managed_fields=by_syncers) is None
    )
    assert finalizer_owner(["example.io/other", eu, us], managed_fields=by_syncers) == "eu"
    # both claimed (left by syncers that fought): list order decides, the same for everyone
    assert finalizer_owner([us, eu], managed_fields=by_syncers) == "us"


def test_a_finalizer_the_syncer_did_not_add_is_no_claim() -> None:
    eu, us = finalizer("eu"), finalizer("us")
    # a consumer wrote both names (kubectl edit): nobody's claim, nobody is contested
    assert finalizer_owner([us, eu], managed_fields=[added_by("kubectl-edit", us, eu)]) is None
    assert finalizer_owner([us, eu], managed_fields=None) is None
    # ... also not when the consumer's finalizer comes first and eu's own claim second
    by_eu = [added_by("kubectl-edit", us), added_by(field_manager("eu"), eu)]
    assert finalizer_owner([us, eu], managed_fields=by_eu) == "eu"
    # another syncer's manager owning *eu's* name is no claim of eu's (nor of its own)
    assert finalizer_owner([eu], managed_fields=[added_by(field_manager("us"), eu)]) is None
    # a subresource's entry cannot own finalizers
    status = [added_by(field_manager("us"), us, subresource="status")]
    assert finalizer_owner([us], managed_fields=status) is None
    # malformed managedFields are no claims, never an error
    junk: list[Any] = [{"manager": 3}, {"manager": "m", "fieldsV1": []}, {}]
    assert finalizer_owner([us], managed_fields=junk) is None
