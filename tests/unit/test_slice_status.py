"""The pure part of the controller: desired status and route of a slice."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from vwserver.controller import consent
from vwserver.controller.handoff import StuckHolds
from vwserver.controller.slice_status import (
    NOT_PERMITTED,
    ExportLookup,
    WatchHealth,
    desired,
    export_ref,
    status_changed,
)
from vwserver.holds import DEFAULT_HOLD_TIMEOUT_SECONDS, MAX_HOLD_TIMEOUT_SECONDS
from vwserver.k8s.kcp import export_claims, shard_id, slice_endpoint_urls
from vwserver.selector import Selector

VW = "https://shard-1:6443/services/apiexport/exp123/widgets.example.io"


def found(*urls: str) -> ExportLookup:
    """The export, found in the slice's own logical cluster (consent implied)."""
    return ExportLookup(export_cluster="slicews", urls=urls)


def slice_obj(
    selector: dict[str, Any] | None = None, *, path: str = "root:provider", generation: int = 3
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "prod",
            "generation": generation,
            "annotations": {"kcp.io/cluster": "slicews"},
        },
        "spec": {
            "export": {"path": path, "name": "widgets.example.io"},
            "objectSelector": {"matchLabels": {"env": "prod"}} if selector is None else selector,
        },
    }


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_ready_slice() -> None:
    out = desired(slice_obj(), lookup=found(VW), external_url="https://vw.example/", now="T1")
    assert conditions(out.status) == {
        "SelectorValid": ("True", "Valid"),
        "APIExportValid": ("True", "Found"),
        "Ready": ("True", "Serving"),
    }
    assert out.status["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in out.status["conditions"])
    assert out.status["endpoints"] == [
        {"url": "https://vw.example/services/filtered-apiexport/slicews/prod"}
    ]
    assert out.route is not None
    assert out.route.not_ready is None
    assert out.route.upstream_url == VW
    assert out.route.selector == Selector.parse("env=prod")


def test_missing_export() -> None:
    lookup = ExportLookup(
        error="APIExport x in workspace root:p not found", reason="APIExportNotFound"
    )
    out = desired(slice_obj(), lookup=lookup, external_url="https://vw", now="T1")
    assert conditions(out.status)["APIExportValid"] == ("False", "APIExportNotFound")
    assert conditions(out.status)["Ready"] == ("False", "APIExportInvalid")
    assert out.status["endpoints"] == []
    assert out.route is not None
    assert out.route.not_ready == "APIExport x in workspace root:p not found"


def test_no_endpoint_yet() -> None:
    out = desired(slice_obj(), lookup=found(), external_url="https://vw", now="T1")
    assert conditions(out.status)["Ready"] == ("False", "APIExportNotReady")
    assert out.route is not None
    assert out.route.not_ready is not None
    assert "APIBinding" in out.route.not_ready


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({}, "empty"),
        ({"matchLabels": {"not a key!": "x"}}, "spec.objectSelector.matchLabels"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, "values"),
    ],
)
def test_invalid_selector(selector: dict[str, Any], message: str) -> None:
    out = desired(slice_obj(selector), lookup=found(VW), external_url="https://vw", now="T")
    cond = {c["type"]: c for c in out.status["conditions"]}
    assert cond["SelectorValid"]["status"] == "False"
    assert message in cond["SelectorValid"]["message"]
    assert cond["Ready"]["status"] == "False"
    assert out.route is not None
    assert out.route.not_ready is not None


def test_transition_time_kept_while_status_unchanged() -> None:
    first = desired(slice_obj(), lookup=found(VW), external_url="https://v", now="T1")
    again = desired(
        slice_obj(),
        lookup=found(VW),
        external_url="https://v",
        previous=first.status["conditions"],
        now="T2",
    )
    assert not status_changed(first.status, again.status)  # no write for an unchanged slice
    broken = desired(
        slice_obj(),
        lookup=ExportLookup(error="gone", reason="APIExportNotFound"),
        external_url="https://v",
        previous=first.status["conditions"],
        now="T3",
    )
    times = {c["type"]: c["lastTransitionTime"] for c in broken.status["conditions"]}
    assert times == {"SelectorValid": "T1", "APIExportValid": "T3", "Ready": "T3"}


def test_export_path_defaults_to_the_slices_own_workspace() -> None:
    assert export_ref(slice_obj(path="")) == ("slicews", "widgets.example.io")
    assert export_ref(slice_obj(path="2fx3m0rnxzbs8mq9")) == (
        "2fx3m0rnxzbs8mq9",
        "widgets.example.io",
    )


def test_several_shards_get_a_shard_segment() -> None:
    other = "https://shard-2:6443/services/apiexport/exp123/widgets.example.io"
    urls = slice_endpoint_urls(
        external_url="https://vw", cluster="c", name="n", upstreams=[VW, other]
    )
    assert urls == [
        f"https://vw/services/filtered-apiexport/c/n/shards/{shard_id(VW)}",
        f"https://vw/services/filtered-apiexport/c/n/shards/{shard_id(other)}",
    ]
    out = desired(slice_obj(), lookup=found(VW, other), external_url="https://vw", now="T")
    assert out.route is not None
    assert out.route.upstream_for(shard_id(other)) == other
    assert out.route.upstream_for("") == VW
    assert out.route.upstream_for("ffff") is None


# --- consent of the export's owner (vwserver.controller.consent) --------------------------------


def test_a_slice_in_the_exports_own_workspace_needs_no_grant() -> None:
    out = desired(slice_obj(), lookup=found(VW), external_url="https://vw", now="T")
    assert conditions(out.status)["APIExportValid"] == ("True", "Found")
    assert "granted" not in next(
        c["message"] for c in out.status["conditions"] if c["type"] == "APIExportValid"
    )
    assert out.route is not None
    assert out.route.not_ready is None


def test_a_slice_elsewhere_is_served_when_the_exports_workspace_grants_it() -> None:
    lookup = ExportLookup(export_cluster="exportws", granted=True, urls=(VW,))
    out = desired(slice_obj(), lookup=lookup, external_url="https://vw", now="T")
    assert conditions(out.status) == {
        "SelectorValid": ("True", "Valid"),
        "APIExportValid": ("True", "Found"),
        "Ready": ("True", "Serving"),
    }
    assert "granted to this workspace" in out.status["conditions"][1]["message"]
    assert out.route is not None
    assert out.route.not_ready is None
    assert out.route.upstream_url == VW


@pytest.mark.parametrize("granted", [False, None], ids=["denied", "not-asked"])
def test_a_slice_elsewhere_without_a_grant_is_refused(granted: bool | None) -> None:
    """The confused deputy: a slice in another workspace naming the export. Even if URLs were
    gathered, none reaches the route or the status."""
    lookup = ExportLookup(export_cluster="exportws", granted=granted, urls=(VW, VW + "2"))
    out = desired(slice_obj(), lookup=lookup, external_url="https://vw", now="T")
    assert conditions(out.status) == {
        "SelectorValid": ("True", "Valid"),
        "APIExportValid": ("False", NOT_PERMITTED),
        "Ready": ("False", NOT_PERMITTED),
    }
    message = out.status["conditions"][1]["message"]
    for part in (
        "root:provider",  # the export's workspace as the slice names it
        "slicews",  # the workspace that needs the grant
        "widgets.example.io",
        '"system:vwserver:workspace:slicews"',
        '"filter"',
        '"access"',
        consent.GRANT_EXAMPLE,
    ):
        assert part in message, part
    assert out.status["endpoints"] == []
    assert out.route is not None
    assert out.route.not_ready == message
    assert (out.route.upstream_url, dict(out.route.shards)) == ("", {})


def test_a_consent_review_that_kcp_refused_is_no_consent_and_looks_like_a_refusal() -> None:
    """kcp refusing vwserver's review (a workspace that does not exist, or one where vwserver may
    not review) answers exactly as a denied review: the status must not tell which (issue #22,
    finding 6); the reason is in vwserver's log."""
    refused = ExportLookup(export_cluster="exportws", consent_error="kcp refused (403)", urls=(VW,))
    denied = ExportLookup(export_cluster="exportws", granted=False)
    out = desired(slice_obj(), lookup=refused, external_url="https://vw", now="T")
    assert (
        out.status == desired(slice_obj(), lookup=denied, external_url="https://vw", now="T").status
    )
    assert conditions(out.status)["APIExportValid"] == ("False", NOT_PERMITTED)
    assert conditions(out.status)["Ready"] == ("False", NOT_PERMITTED)
    assert out.route is not None
    assert out.route.not_ready is not None
    assert "kcp refused" not in out.route.not_ready
    assert out.route.upstream_url == ""


def test_an_unknown_cluster_never_implies_consent() -> None:
    assert consent.implied(slice_cluster="a", export_cluster="a")
    assert not consent.implied(slice_cluster="a", export_cluster="b")
    assert not consent.implied(slice_cluster="", export_cluster="")


def test_revocation_changes_the_route_and_the_transition_time() -> None:
    granted = ExportLookup(export_cluster="exportws", granted=True, urls=(VW,))
    ready = desired(slice_obj(), lookup=granted, external_url="https://vw", now="T1")
    revoked = desired(
        slice_obj(),
        lookup=ExportLookup(export_cluster="exportws", granted=False),
        external_url="https://vw",
        previous=ready.status["conditions"],
        now="T2",
    )
    assert status_changed(ready.status, revoked.status)
    times = {c["type"]: c["lastTransitionTime"] for c in revoked.status["conditions"]}
    assert times == {"SelectorValid": "T1", "APIExportValid": "T2", "Ready": "T2"}
    assert ready.route != revoked.route  # so Routes.replace retires the ready one


def test_the_consent_review_asks_for_the_synthetic_subject_only() -> None:
    body = consent.review(slice_cluster="2fx3m0rnxzbs8mq9", export_name="widgets.example.io")
    assert body == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            # no groups (not even system:authenticated): a grant to a group is never consent
            "user": "system:vwserver:workspace:2fx3m0rnxzbs8mq9",
            "resourceAttributes": {
                "verb": "filter",
                "group": "apis.kcp.io",
                "resource": "apiexports",
                "name": "widgets.example.io",
            },
        },
    }


def test_holds_released_condition_counts_stuck_holds() -> None:
    stuck = {"slicews/prod": StuckHolds(count=2, oldest="2026-12-01T10:00:00Z")}
    out = desired(
        slice_obj(), lookup=found(VW), external_url="https://vw", now="T1", stuck_holds=stuck.get
    )
    assert conditions(out.status)["HoldsReleased"] == ("False", "StuckHolds")
    message = next(c["message"] for c in out.status["conditions"] if c["type"] == "HoldsReleased")
    assert "2 object(s)" in message and "2026-12-01T10:00:00Z" in message
    assert "3600 s after its move" in message  # the default bound
    fine = desired(
        slice_obj(), lookup=found(VW), external_url="https://vw", now="T1", stuck_holds={}.get
    )
    assert conditions(fine.status)["HoldsReleased"] == ("True", "NoStuckHolds")
    assert conditions(fine.status)["Ready"] == ("True", "Serving")


def test_upstream_reachable_condition_counts_failing_cache_watches_of_the_export() -> None:
    asked: list[tuple[str, ...]] = []

    def health(failing: int) -> Callable[[Sequence[str]], WatchHealth]:
        def answer(urls: Sequence[str]) -> WatchHealth:
            asked.append(tuple(urls))
            return WatchHealth(failing=failing, total=3)

        return answer

    out = desired(
        slice_obj(),
        lookup=found(VW),
        external_url="https://vw",
        now="T1",
        upstream_watches=health(2),
    )
    assert asked == [(VW,)]  # the export's URLs, nothing else
    assert conditions(out.status)["UpstreamReachable"] == ("False", "WatchesFailing")
    message = next(
        c["message"] for c in out.status["conditions"] if c["type"] == "UpstreamReachable"
    )
    assert message.startswith("2 of 3 of the watch cache's upstream watches")
    assert VW not in message and "shard-1" not in message
    assert conditions(out.status)["Ready"] == ("True", "Serving")  # still served
    fine = desired(
        slice_obj(),
        lookup=found(VW),
        external_url="https://vw",
        now="T1",
        upstream_watches=health(0),
    )
    assert conditions(fine.status)["UpstreamReachable"] == ("True", "Watching")
    none = desired(slice_obj(), lookup=found(VW), external_url="https://vw", now="T1")
    assert "UpstreamReachable" not in conditions(none.status)  # no cache: no condition


def test_hold_timeout_comes_from_the_spec() -> None:
    obj = slice_obj()
    obj["spec"]["holdTimeoutSeconds"] = 600
    out = desired(obj, lookup=found(VW), external_url="https://vw", now="T1")
    assert out.route.hold_timeout == 600.0
    # Unset: the default bound (there is no unbounded hold); a value stored under an older
    # schema, beyond the maximum, is capped.
    assert (
        desired(
            slice_obj(), lookup=found(VW), external_url="https://vw", now="T1"
        ).route.hold_timeout
        == DEFAULT_HOLD_TIMEOUT_SECONDS
    )
    obj["spec"]["holdTimeoutSeconds"] = 2**62
    out = desired(obj, lookup=found(VW), external_url="https://vw", now="T1")
    assert out.route.hold_timeout == MAX_HOLD_TIMEOUT_SECONDS


RELATED = [
    {
        "resource": "secrets",
        "referencedBy": {
            "path": "spec.users[*].passwordSecretRef.name",
            "group": "example.io",
            "version": "v1",
            "resource": "widgets",
        },
    },
    {"resource": "configmaps", "selector": {"matchLabels": {"app": "db"}}},
]


def with_related(related: Any) -> dict[str, Any]:
    obj = slice_obj()
    obj["spec"]["relatedResources"] = related
    return obj


def test_related_resources_reach_the_route() -> None:
    lookup = ExportLookup(
        export_cluster="slicews",
        urls=(VW,),
        claimed=frozenset({("", "secrets"), ("", "configmaps")}),
        exported=frozenset({("example.io", "widgets")}),
    )
    out = desired(with_related(RELATED), lookup=lookup, external_url="https://vw/", now="T1")
    assert conditions(out.status)["RelatedResourcesValid"] == ("True", "Valid")
    assert out.route.not_ready is None
    assert out.route.related.claims == {("", "secrets"), ("", "configmaps")}
    # a slice without the field gets no such condition (and shows no claimed object)
    plain = desired(slice_obj(), lookup=lookup, external_url="https://vw/", now="T1")
    assert "RelatedResourcesValid" not in conditions(plain.status)
    assert not plain.route.related


@pytest.mark.parametrize(
    ("related", "claimed", "message"),
    [
        (
            [{"resource": "secrets", "referencedBy": {"path": "{.spec.x}"}}],
            frozenset({("", "secrets")}),
            "spec.relatedResources[0].referencedBy.path",
        ),
        (RELATED, frozenset({("", "secrets")}), "no permission claim on configmaps"),
    ],
)
def test_invalid_related_resources_make_the_slice_not_ready(
    related: Any, claimed: frozenset[tuple[str, str]], message: str
) -> None:
    lookup = ExportLookup(
        export_cluster="slicews",
        urls=(VW,),
        claimed=claimed,
        exported=frozenset({("example.io", "widgets")}),
    )
    out = desired(with_related(related), lookup=lookup, external_url="https://vw/", now="T1")
    cond = {c["type"]: c for c in out.status["conditions"]}
    assert cond["RelatedResourcesValid"]["status"] == "False"
    assert cond["RelatedResourcesValid"]["reason"] == "InvalidRelatedResources"
    assert message in cond["RelatedResourcesValid"]["message"]
    assert cond["Ready"]["reason"] == "InvalidRelatedResources"
    assert out.route.not_ready is not None and out.status["endpoints"] == []


def test_export_claims_are_read_from_the_apiexport() -> None:
    export = {
        "spec": {
            "resources": [{"group": "example.io", "name": "widgets", "schema": "s"}],
            "permissionClaims": [
                {"group": "", "resource": "secrets", "verbs": ["*"]},
                {"resource": "configmaps", "verbs": ["get"]},
                "junk",
            ],
        }
    }
    assert export_claims(export) == (
        frozenset({("", "secrets"), ("", "configmaps")}),
        frozenset({("example.io", "widgets")}),
    )
