"""The pure part of the controller: desired status and route of a slice."""

from __future__ import annotations

from typing import Any

import pytest

from vwserver.controller.reconcile import (
    ExportLookup,
    desired,
    endpoint_urls,
    export_ref,
    shard_id,
    status_changed,
)
from vwserver.selector import Selector

VW = "https://shard-1:6443/services/apiexport/exp123/widgets.example.io"


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
    out = desired(
        slice_obj(), lookup=ExportLookup(urls=(VW,)), external_url="https://vw.example/", now="T1"
    )
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
    out = desired(slice_obj(), lookup=ExportLookup(), external_url="https://vw", now="T1")
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
    out = desired(
        slice_obj(selector), lookup=ExportLookup(urls=(VW,)), external_url="https://vw", now="T"
    )
    cond = {c["type"]: c for c in out.status["conditions"]}
    assert cond["SelectorValid"]["status"] == "False"
    assert message in cond["SelectorValid"]["message"]
    assert cond["Ready"]["status"] == "False"
    assert out.route is not None
    assert out.route.not_ready is not None


def test_transition_time_kept_while_status_unchanged() -> None:
    first = desired(
        slice_obj(), lookup=ExportLookup(urls=(VW,)), external_url="https://v", now="T1"
    )
    again = desired(
        slice_obj(),
        lookup=ExportLookup(urls=(VW,)),
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
    urls = endpoint_urls(external_url="https://vw", cluster="c", name="n", upstreams=[VW, other])
    assert urls == [
        f"https://vw/services/filtered-apiexport/c/n/shards/{shard_id(VW)}",
        f"https://vw/services/filtered-apiexport/c/n/shards/{shard_id(other)}",
    ]
    out = desired(
        slice_obj(), lookup=ExportLookup(urls=(VW, other)), external_url="https://vw", now="T"
    )
    assert out.route is not None
    assert out.route.upstream_for(shard_id(other)) == other
    assert out.route.upstream_for("") == VW
    assert out.route.upstream_for("ffff") is None
